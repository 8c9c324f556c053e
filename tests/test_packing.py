"""Packed training rows (data.pack): the packing plan, packed batches, and the Transformer on a
packed row computing what it computes on each of its examples alone (logits, loss, gradients)."""

import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attn import data, training
from attn.data import bucketing
from attn.data.collate import Collate
from attn.errors import ConfigError
from attn.models import build_model, sequence_loss
from attn.models.transformer_layers import PackedMasks
from data_configs import corpus_config
from experiments.configs import translate as translate_config
from experiments.configs import use_arch
from model_configs import model_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
V_SRC, V_TGT = 23, 19


def _lengths(n, seed=0, lo=2, hi=15):
  rng = np.random.default_rng(seed)
  return rng.integers(lo, hi, n), rng.integers(lo, hi + 4, n)


@pytest.mark.parametrize("widths", [(32, 40), (48, 48), (30, 37)])
def test_pack_rows_holds_every_example_once_within_the_widths(widths):
  s, t = _lengths(500)
  rows = bucketing.pack_rows(s, t, widths, np.random.default_rng(1), chunk=128)
  np.testing.assert_array_equal(np.sort(np.concatenate(rows)), np.arange(500))
  assert all(s[r].sum() <= widths[0] and t[r].sum() <= widths[1] for r in rows)
  # first-fit decreasing leaves little room: fewer rows than 1.15x the lower bound on them
  bound = max(s.sum() / widths[0], t.sum() / widths[1])
  assert len(rows) < 1.15 * bound, (len(rows), bound)
  with pytest.raises(ValueError, match="wider than the rows"):
    bucketing.pack_rows(np.array([3, widths[0] + 1]), np.array([3, 3]), widths,
                        np.random.default_rng(0))


def test_pack_plan_batches_have_a_fixed_count_and_row_count():
  s, t = _lengths(300)
  plan = bucketing.pack_plan(s, t, (24, 28), 7, np.random.default_rng(0), bucket=2)
  assert all(k == 2 and m.shape[0] == 7 for k, m in plan)
  seen = np.concatenate([m[m >= 0] for _, m in plan])
  np.testing.assert_array_equal(np.unique(seen), np.arange(300))  # the last batch repeats a few
  assert seen.size < 300 + 7 * 28 // 2
  for n in (len(plan) - 2, len(plan) + 3):  # a fixed epoch length: rows left over, or repeated
    fixed = bucketing.pack_plan(s, t, (24, 28), 7, np.random.default_rng(0), n_batches=n)
    assert len(fixed) == n and all(m.shape[0] == 7 for _, m in fixed)
  again = bucketing.pack_plan(s, t, (24, 28), 7, np.random.default_rng(0), bucket=2)
  assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(plan, again))


def test_pack_widths_and_rows_per_batch_known_answers():
  s, t = np.full(10, 10), np.full(10, 20)  # targets twice the sources
  assert bucketing.pack_widths(s, t, (16, 16), multiple=4) == (16, 32)
  assert bucketing.pack_widths(t, s, (16, 16), multiple=4) == (32, 16)
  assert bucketing.pack_widths(s, s, (16, 12), multiple=4) == (16, 16)
  assert bucketing.pack_widths(s, s, (16, 16)) == (16, 16)
  # 64 examples of 30 slots fill 1920 slots: 40 rows of (24, 24)
  assert bucketing.packed_rows_per_batch(s, t, (24, 24), 64) == 40
  assert bucketing.packed_rows_per_batch(s, t, (24, 24), 64, tokens_per_batch=480) == 10


@pytest.fixture(scope="module")
def packed_bundle(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("packed")
  cfg = translate_config.get_config("smoke")
  cfg.data.update(dict(task="reverse", min_len=2, max_len=9, train_size=300, eval_size=20,
                       test_size=20, max_src_len=12, max_tgt_len=12, num_buckets=3,
                       batch_size=16, pack=True, cache_dir=str(tmp / "cache")))
  return data.load(cfg.data)


def test_packed_batches_hold_each_example_as_it_is_alone(packed_bundle):
  b = packed_bundle
  sp = b.splits["train"]
  ts, tt = b.pack_widths
  assert b.train_shapes == [b.pack_widths] and b.train_batch_sizes[0] == b.train_batch_sizes[-1]
  alone = Collate(sp, b.src_vocab, b.tgt_vocab, b.shapes, b._source.read)
  plan = b.train_epoch_batches(0)
  for step, x in zip(range(3), b.train_iter(0)):
    Ts, Tt, members = plan[step]
    assert (Ts, Tt) == (ts, tt) and x["src"].shape == (members.shape[0], ts)
    assert "alignments" not in x
    assert b.train_tokens(step) == x["tgt_lengths"].sum() == sp.tgt_len[members[members >= 0]].sum()
    for r in range(members.shape[0]):
      ex = members[r][members[r] >= 0]
      one = alone((len(b.shapes) - 1, ex))  # the same examples, a row each
      for side in ("src", "tgt"):
        seg, pos = x[f"{side}_segments"][r], x[f"{side}_positions"][r]
        n = x[f"{side}_lengths"][r]
        assert (seg[:n] > 0).all() and (seg[n:] == 0).all() and (x[side][r, n:] == 0).all()
        for i in range(ex.size):
          at = seg == i + 1
          length = one[f"{side}_lengths"][i]
          np.testing.assert_array_equal(x[side][r][at], one[side][i, :length])
          np.testing.assert_array_equal(pos[at], np.arange(length))
      assert x["example_id"][r] == (one["example_id"][0] if ex.size else -1)
  # a step's batch is the same whether reached by iterating or by resuming there
  again = next(b.train_iter(2))
  third = list(zip(range(3), b.train_iter(0)))[2][1]
  for k in third:
    np.testing.assert_array_equal(again[k], third[k])


def test_packed_padding_is_below_the_buckets(packed_bundle):
  assert packed_bundle.padding_fraction("train") < 0.1


def test_data_stats_describes_packed_rows(tmp_path):
  out = subprocess.run(
      [sys.executable, "-m", "experiments.data_stats", "--config=experiments/configs/data.py:smoke",
       "--config.pack=True", "--config.cache_dir=" + str(tmp_path / "cache"),
       "--workdir=" + str(tmp_path / "work"), "--batches=5"],
      check=True, cwd=REPO, capture_output=True, text=True).stdout
  line = next(l for l in out.splitlines() if l.startswith("training: packed rows of ("))
  assert re.fullmatch(r"training: packed rows of \(\d+, \d+\), \d+ a batch, [\d.]+ examples a "
                      r"batch on average", line), line


def _packed_batch(rows, Ts, Tt, seed=0):
  """Random rows of examples: rows[r] = [(src_len, tgt_len), ...], each ending in EOS (id 2)."""
  rng = np.random.default_rng(seed)
  out = {k: np.zeros((len(rows), Ts if k.startswith("src") else Tt), np.int32)
         for k in ("src", "tgt", "src_segments", "tgt_segments", "src_positions", "tgt_positions")}
  out["src_lengths"], out["tgt_lengths"] = (np.zeros(len(rows), np.int32) for _ in range(2))
  for r, examples in enumerate(rows):
    for seg, lengths in enumerate(examples, start=1):
      for side, n, v in zip(("src", "tgt"), lengths, (V_SRC, V_TGT)):
        at = out[f"{side}_lengths"][r]
        out[side][r, at:at + n] = np.append(rng.integers(4, v, n - 1), 2)
        out[f"{side}_segments"][r, at:at + n] = seg
        out[f"{side}_positions"][r, at:at + n] = np.arange(n)
        out[f"{side}_lengths"][r] = at + n
  return {k: jnp.asarray(v) for k, v in out.items()}


ROWS = [[(3, 4), (5, 2), (2, 5)], [(9, 7)], [(4, 6), (1, 1)]]
VARIANTS = {
    "sinusoidal": {},
    "learned_windows_additive": dict(pos_encoding="learned",
                                     enc_self=dict(scope="window", half_width=2),
                                     dec_self=dict(scope="window", half_width=1),
                                     cross=dict(score="additive")),
    "rope_sparsemax_cross_window": dict(pos_encoding="rope", dec_self=dict(normalizer="sparsemax"),
                                        cross=dict(scope="window", half_width=2)),
    "alibi_topk": dict(pos_encoding="alibi", enc_self=dict(scope="topk", top_k=2)),
}


def _unpacked(batch):
  """The examples of a packed batch one a row, padded to the row widths, in row then segment
  order; and for each, (row, segment)."""
  where = [(r, seg) for r in range(batch["src"].shape[0])
           for seg in range(1, int(batch["src_segments"][r].max()) + 1)]
  out = {}
  for side in ("src", "tgt"):
    ids = np.zeros((len(where), batch[side].shape[1]), np.int32)
    lengths = np.zeros(len(where), np.int32)
    for i, (r, seg) in enumerate(where):
      at = np.asarray(batch[f"{side}_segments"][r]) == seg
      lengths[i] = at.sum()
      ids[i, :lengths[i]] = np.asarray(batch[side][r])[at]
    out[side], out[f"{side}_lengths"] = jnp.asarray(ids), jnp.asarray(lengths)
  return out, where


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_a_packed_row_computes_what_its_examples_compute_alone(name):
  """Logits at every slot, the summed loss and its gradient, packed against one example a row
  (float32 on both sides; a packed row sums the same terms over more masked keys)."""
  cfg = model_config(src_vocab=V_SRC, tgt_vocab=V_TGT, arch="transformer", d_model=16,
                     num_heads=2, d_ff=24, enc_layers=2, dec_layers=2, dropout=0.0,
                     max_src_len=16, max_tgt_len=16, **VARIANTS[name])
  graphdef, params = nnx.split(build_model(cfg))

  @jax.jit
  def loss_and_grad(params, batch):
    def loss(params):
      logits = nnx.merge(graphdef, params).attention(batch)[0]
      return sequence_loss(logits, batch["tgt"], batch["tgt_lengths"], 0.1)[0], logits
    return jax.value_and_grad(loss, has_aux=True)(params)

  packed = _packed_batch(ROWS, 12, 14)
  alone, where = _unpacked(packed)
  (lp, logits_p), gp = loss_and_grad(params, packed)
  (la, logits_a), ga = loss_and_grad(params, alone)
  for i, (r, seg) in enumerate(where):
    at = np.asarray(packed["tgt_segments"][r]) == seg
    np.testing.assert_allclose(logits_p[r][at], logits_a[i, :int(alone["tgt_lengths"][i])],
                               rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(lp, la, rtol=1e-5)
  for x, y in zip(jax.tree.leaves(gp), jax.tree.leaves(ga)):
    np.testing.assert_allclose(x, y, rtol=5e-4, atol=1e-5)  # float32 sums in another order


def test_packed_masks_keep_each_example_to_itself():
  batch = _packed_batch([[(2, 3), (3, 1)]], 6, 5)
  m = PackedMasks.of(batch)
  assert PackedMasks.of({"src": batch["src"]}) is None
  np.testing.assert_array_equal(m.src_positions[0], [0, 1, 0, 1, 2, 0])
  np.testing.assert_array_equal(m.cross[0, 3], [False, False, True, True, True, False])
  np.testing.assert_array_equal(m.tgt_self[0, 0], [True, True, True, False, False])


def _tiny_packed(tmp_path, arch="transformer"):
  c = translate_config.get_config("smoke")
  c.data.update(dict(task="copy", min_len=2, max_len=5, task_vocab_size=5, train_size=256,
                     eval_size=16, test_size=16, max_src_len=8, max_tgt_len=8, num_buckets=2,
                     batch_size=16, pack=True))
  c.train.update(dict(steps=6, warmup_steps=2, eval_every=6, checkpoint_every=6, log_every=3,
                      eval_decode_sentences=16))
  if arch == "transformer":
    use_arch(c, "transformer", d_model=16, num_heads=2, d_ff=32)
  return c


def test_the_train_step_sees_a_packed_batch_as_its_examples(tmp_path):
  """The loss the run computes on a packed training batch (through the arrays that go to the
  device) equals the examples' losses each alone: the segments reach the model."""
  from attn.training.loop import loss_after_step  # pylint: disable=import-outside-toplevel
  run = training.setup(_tiny_packed(tmp_path), str(tmp_path))
  x = next(run.bundle.train_iter(0))
  packed = loss_after_step(run, run.device_batch(x))
  alone, _ = _unpacked({k: jnp.asarray(v) for k, v in x.items()})
  nll, ntok, _ = sequence_loss(run.model.attention(alone)[0], alone["tgt"], alone["tgt_lengths"])
  assert packed == pytest.approx(float(nll) / float(ntok), rel=1e-5)


def test_training_on_packed_rows_runs_and_reports_real_tokens(tmp_path):
  results = training.train_and_evaluate(_tiny_packed(tmp_path), str(tmp_path))
  assert np.isfinite(results["bleu"]) and results["tokens_per_sec"] > 0


@pytest.mark.parametrize("arch,kw,match", [
    ("rnn", {}, "only the Transformer keeps"),
    ("transformer", {"fused": True}, "fused kernels take key lengths"),
    ("transformer", {"transformer.enc_self.scope": "linear"},
     r"enc_self.scope=linear: linear attention takes key masks only"),
    ("transformer", {"transformer.cross.scope": "local_p", "transformer.cross.half_width": 2},
     r"cross.scope=local_p: local_p predicts a window over the whole row"),
])
def test_packing_what_cannot_be_packed_is_a_config_error(tmp_path, arch, kw, match):
  cfg = _tiny_packed(tmp_path, arch)
  for path, value in kw.items():
    *parents, leaf = path.split(".")
    section = cfg.model
    for p in parents:
      section = getattr(section, p)
    setattr(section, leaf, value)
  with pytest.raises(ConfigError, match=match):
    training.setup(cfg, str(tmp_path))


def test_packing_with_a_copy_vocabulary_is_a_data_error(tmp_path):
  d = tmp_path / "corpus"
  d.mkdir()
  cfg = corpus_config("multi30k", tmp_path, d, pack=True, shared_vocab=True, extended_vocab=True)
  with pytest.raises(data.DataError, match="pack=True with extended_vocab=True"):
    data.DataConfig.from_config(cfg)
