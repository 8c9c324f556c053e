"""The captioning experiment: digit strips from matplotlib's fonts, gold cells by construction,
the region mask, a tiny run that learns, the parameter-matched baseline and refused settings."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attn import training
from attn.apps.caption import data as captions
from attn.apps.caption import glyphs
from attn.data.tokens import EOS, PAD
from attn.errors import AttnError
from attn.models import count_params
from attn.apps.caption.model import build_captioner
from attn.apps.caption.task import digit_accuracy
from experiments.configs import caption as caption_config
from experiments.configs import use_arch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _data(**kw):
  return captions.CaptionDataConfig(**{"eval_examples": 8, "test_examples": 8, **kw})


def test_glyphs_and_rendered_cells_have_their_shapes_and_range():
  bank = glyphs.glyph_bank()
  assert bank.shape == (len(glyphs.FONTS), 31, glyphs.G, glyphs.G) and bank.dtype == np.float32
  assert 0.0 <= bank.min() and bank.max() <= 1.0
  assert (bank.reshape(*bank.shape[:2], -1).max(-1) > 0.9).all()  # every glyph has ink
  cfg = _data(cells=5, cell_px=12)
  rng = np.random.default_rng(0)
  layout = captions.draw_layout(cfg, rng, 7)
  cells = captions.render(cfg, layout, rng)
  assert cells.shape == (7, 5, 12, 12) and cells.dtype == np.float32
  assert 0.0 <= cells.min() and cells.max() <= 1.0
  assert glyphs.strip(cells).shape == (7, 12, 60)
  assert (glyphs.strip(cells)[3, :, 24:36] == cells[3, 2]).all()  # cell 3 is pixels 24..35


def test_gold_cell_holds_the_emitted_digit_and_captions_read_left_to_right():
  cfg = _data(cells=6, min_digits=1, max_digits=4, distractor_rate=0.5, noise=0.0)
  bundle = captions.load(cfg)
  batch = bundle.train_batch(3)
  cells = batch["src"].reshape(cfg.batch_size, cfg.cells, cfg.cell_px, cfg.cell_px)
  layout = captions.draw_layout(cfg, bundle._train_rng(3), cfg.batch_size)  # the same draw
  vocab = bundle.tgt_vocab
  seen_counts = set()
  for n in range(cfg.batch_size):
    L = int(batch["tgt_lengths"][n])
    assert batch["tgt"][n, L - 1] == EOS and (batch["tgt"][n, L:] == PAD).all()
    gold = batch["alignments"][n, :L - 1].argmax(-1)  # the cell of each emitted digit
    assert (batch["alignments"][n].sum(-1) == np.r_[np.ones(L - 1), np.zeros(cfg.max_digits + 2 - L)]).all()
    assert (np.diff(gold) > 0).all()  # reading order
    for t, r in enumerate(gold):
      assert glyphs.DIGITS[layout.char[n, r]] == vocab.id_to_token(int(batch["tgt"][n, t]))
      assert cells[n, r].max() > 0.3  # the gold cell has ink
    others = [r for r in range(cfg.cells) if r not in set(gold)]
    for r in others:  # no other cell holds a digit; a blank one is empty (noise=0)
      assert layout.char[n, r] < 0 or layout.char[n, r] >= len(glyphs.DIGITS)
      if layout.char[n, r] < 0:
        assert cells[n, r].max() == 0.0
    seen_counts.add(L - 1)
    assert bundle.train_tokens(3) == int(batch["tgt_lengths"].sum())
  assert seen_counts == {1, 2, 3, 4}
  # The same step draws the same batch (resuming reads what an uninterrupted run read).
  again = bundle.train_batch(3)
  assert all((again[k] == batch[k]).all() for k in batch)


def test_eval_split_passes_once_with_filler_rows_and_references_match():
  bundle = captions.load(_data(eval_examples=10, batch_size=4))
  batches = list(bundle.batches("eval"))
  ids = np.concatenate([b["example_id"] for b in batches])
  assert [b["src"].shape[0] for b in batches] == [4, 4, 4]
  assert ids.tolist() == list(range(10)) + [-1, -1]
  refs = bundle.references("eval")
  vocab = bundle.tgt_vocab
  for b in batches:
    for row, i in enumerate(b["example_id"]):
      if i >= 0:
        assert vocab.decode(b["tgt"][row]) == refs[i]


def _tiny_model(decoder="bahdanau", **data):
  config = caption_config.get_config("tiny")
  config.model.rnn.decoder = decoder
  task = training.get_task("caption")
  bundle = task.load_data(_data(cells=4, max_digits=3, **data), None)
  mc = task.model_config(config.model, bundle)
  return task, bundle, mc, task.build_model(mc, seed=0)


def test_padded_regions_get_no_attention_and_change_nothing():
  """Strips in one batch may have different numbers of regions: a padded region gets zero
  weight, and what it holds changes no output."""
  _, bundle, _, model = _tiny_model()
  batch = {k: jnp.asarray(v) for k, v in bundle.train_batch(0).items() if k != "example_id"}
  lengths = jnp.asarray(np.r_[[2, 3], np.full(batch["src"].shape[0] - 2, 4)], jnp.int32)
  short = {**batch, "src_lengths": lengths}
  forward = nnx.jit(lambda m, b: m.attention(b))
  logits, att = forward(model, short)
  R = batch["src"].shape[1]
  padded = np.arange(R)[None, None, :] >= np.asarray(lengths)[:, None, None]
  assert float(jnp.max(jnp.where(padded, att.weights, 0.0))) == 0.0
  np.testing.assert_allclose(np.asarray(att.weights).sum(-1), 1.0, atol=1e-5)
  noisy = {**short, "src": jnp.where(jnp.asarray(padded[:, 0, :, None]),
                                     jax.random.uniform(jax.random.PRNGKey(1), batch["src"].shape),
                                     batch["src"])}
  logits2, _ = forward(model, noisy)
  np.testing.assert_allclose(np.asarray(logits2), np.asarray(logits), atol=1e-5)


def test_no_attention_baseline_is_matched_to_the_attention_models_parameter_count():
  config = caption_config.get_config("tiny")
  task = training.get_task("caption")
  bundle = task.load_data(_data(), None)
  count = lambda cfg: count_params(cfg, build=build_captioner)
  ref = count(task.model_config(config.model, bundle))
  config.model.rnn.decoder = "none"
  unmatched = count(task.model_config(config.model, bundle))
  config.model.rnn.match_params_of = "bahdanau"
  mc = task.model_config(config.model, bundle)
  matched = count_params(task.build_model(mc, seed=0))  # the model the run trains
  assert abs(unmatched - ref) / ref > 0.05  # matching has something to do ...
  assert abs(matched - ref) / ref < 0.01, (matched, ref)  # ... and does it
  assert mc.rnn.dec_hidden > config.model.rnn.dec_hidden


def test_tiny_run_learns(tmp_path):
  """The tiny preset for 200 steps (~10 s of training on 2 idle cores; the CNN needs that long
  to tell digits apart): the loss drops and the digits beat chance (0.1)."""
  config = caption_config.get_config("tiny")
  config.train.update(steps=200, eval_every=200, checkpoint_every=200, log_every=20,
                      warmup_steps=10)
  res = training.train_and_evaluate(config, str(tmp_path), task="caption")
  import json  # pylint: disable=import-outside-toplevel
  with open(tmp_path / "metrics.jsonl") as f:
    losses = [r["loss"] for r in map(json.loads, f) if r.get("split") == "train" and "loss" in r]
  assert losses[-1] < 0.7 * losses[0], losses
  assert res["digit_accuracy"] > 0.25, res  # chance is 0.1 per digit
  assert res["attention_on_gold"] > 0.5, res  # chance: 1/3 of the weight on the gold cell
  assert set(res["exact_match_by_digits"]) == {"1", "2"}
  assert 0.0 <= res["aer"] <= 1.0 and 0.0 <= res["attention_on_gold"] <= 1.0
  with np.load(tmp_path / "attention.npz") as npz:
    i = int(npz["example_ids"][0])
    assert npz[f"image_{i}"].shape == (12, 36) and npz[f"image_{i}"].dtype == np.uint8
    assert npz[f"regions_{i}"].tolist() == [[0, 12 * r, 12, 12] for r in range(3)]
    assert npz[f"weights_{i}"].shape[1] == 3


def test_digit_accuracy_compares_position_by_position():
  assert digit_accuracy(["1 2 3", "4", ""], ["1 2 4", "4 5", "6"]) == pytest.approx(3 / 6)


@pytest.mark.parametrize("overrides,message", [
    ({"data": {"max_digits": 7}}, "data.max_digits=7 is over cells=6: one digit a cell"),
    ({"data": {"cell_px": 10}}, "data.cell_px=10 must be a multiple of 4, at least 8"),
    ({"arch": "transformer"}, "model.arch='transformer': the captioner's decoder is recurrent"),
    ({"model.rnn": {"score": "cosine"}}, "unknown model.rnn.score 'cosine'; known: "),
    ({"model.rnn": {"pointer": True}}, "model.rnn.pointer=True: a caption has no source words"),
])
def test_bad_settings_are_refused_before_anything_is_written(tmp_path, overrides, message):
  config = caption_config.get_config("default")
  if "arch" in overrides:
    use_arch(config, overrides.pop("arch"))
  for section, values in overrides.items():
    node = config
    for part in section.split("."):
      node = getattr(node, part)
    node.update(values)
  workdir = tmp_path / "wd"
  with pytest.raises(AttnError, match=message.replace("(", r"\(").replace(")", r"\)")):
    training.train_and_evaluate(config, str(workdir), task="caption")
  assert not workdir.exists()


def test_unknown_preset_is_one_error_line_and_no_workdir(tmp_path):
  workdir = tmp_path / "wd"
  p = subprocess.run(
      [sys.executable, "-m", "experiments.caption",
       "--config=experiments/configs/caption.py:huge", f"--workdir={workdir}"],
      cwd=REPO, capture_output=True, text=True, timeout=300)
  assert p.returncode == 2, p.stderr[-2000:]
  errors = [l for l in p.stderr.splitlines() if l.startswith("error:")]
  assert errors == ["error: unknown caption preset 'huge'; known: default, tiny"], p.stderr[-2000:]
  assert "Traceback" not in p.stderr and not workdir.exists()
