"""attn.inspection.diagnosis: the per-step measures (measures.py) against float64 numpy /
scipy, the interventions' invariants (interventions.py), gradient x input against finite
differences, and experiments.diagnose end to end on a trained smoke run."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from scipy import stats

from attn import training
from attn.errors import ConfigError
from attn.inspection import diagnosis, diagnosis_report, interventions, measures
from attn.models import build_model
from model_configs import model_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ----------------------------------------------------------------------------- entropy

def _np_entropy(w, mask):
  w = np.where(mask, np.asarray(w, np.float64), 0.0)
  return -np.sum(np.where(w > 0, w * np.log(np.where(w > 0, w, 1.0)), 0.0), -1)


@pytest.mark.parametrize("n", [1, 2, 7])
def test_entropy_of_uniform_is_log_n_and_of_one_hot_is_zero(n):
  Ts = 9  # more positions than valid ones: the masked ones must not count
  mask = np.arange(Ts) < n
  uniform = np.where(mask, 1.0 / n, 0.0).astype(np.float32)
  one_hot = np.eye(Ts, dtype=np.float32)[n - 1]
  np.testing.assert_allclose(measures.entropy(uniform, mask), np.log(n), atol=1e-6)
  np.testing.assert_allclose(measures.entropy(one_hot, mask), 0.0, atol=1e-7)


def test_entropy_matches_float64_numpy_and_ignores_masked_positions():
  rng = np.random.default_rng(0)
  B, Tt, Ts = 3, 5, 11
  lengths = np.array([11, 4, 1])
  mask = np.broadcast_to((np.arange(Ts)[None, :] < lengths[:, None])[:, None, :], (B, Tt, Ts))
  logits = rng.normal(size=(B, Tt, Ts)) * 2
  w = np.where(mask, np.exp(logits), 0.0)
  w /= w.sum(-1, keepdims=True)
  garbage = np.where(mask, w, rng.uniform(size=w.shape))  # junk where masked
  got = measures.entropy(garbage.astype(np.float32), mask)
  assert got.shape == (B, Tt) and got.dtype == jnp.float32
  np.testing.assert_allclose(got, _np_entropy(w, mask), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(got[2], 0.0, atol=1e-7)  # one valid position: no uncertainty


# ----------------------------------------------------------------------------- Kendall tau

@pytest.mark.parametrize("x, y", [
    ([1, 2, 3, 4, 5], [1, 2, 3, 4, 5]),            # +1
    ([1, 2, 3, 4, 5], [5, 4, 3, 2, 1]),            # -1
    ([3, 1, 4, 1, 5, 9, 2], [2, 7, 1, 8, 2, 8, 1]),  # ties in both
    ([0.1, 0.1, 0.3, 0.5], [4, 3, 3, 1]),
])
def test_kendall_tau_matches_scipy_on_known_cases(x, y):
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  want = stats.kendalltau(x, y).statistic
  got = measures.kendall_tau(x.astype(np.float32), y.astype(np.float32), np.ones(len(x), bool))
  np.testing.assert_allclose(got, want, atol=1e-6)


def test_kendall_tau_batched_with_masks_and_ties_matches_scipy():
  rng = np.random.default_rng(1)
  B, N = 40, 13
  x = rng.integers(0, 5, size=(B, N)).astype(np.float32)   # many ties
  y = rng.normal(size=(B, N)).astype(np.float32)
  y[::3, :4] = 0.0                                        # ties in y too
  lengths = rng.integers(2, N + 1, size=B)
  mask = np.arange(N)[None, :] < lengths[:, None]
  got = np.asarray(measures.kendall_tau(x, y, mask))
  for b in range(B):
    n = lengths[b]
    want = stats.kendalltau(x[b, :n], y[b, :n]).statistic
    if np.isnan(want):
      assert np.isnan(got[b]), b
    else:
      np.testing.assert_allclose(got[b], want, atol=1e-5, err_msg=str(b))


def test_kendall_tau_is_nan_where_undefined():
  mask = np.array([[True, False, False], [True, True, True]])
  x = np.array([[1.0, 2.0, 3.0], [2.0, 2.0, 2.0]], np.float32)  # one valid; constant
  got = np.asarray(measures.kendall_tau(x, np.array([[1.0, 2.0, 3.0]] * 2, np.float32), mask))
  assert np.isnan(got).all()


# ----------------------------------------------------------------------------- interventions

def _weights(seed=0, B=6, Ts=10):
  rng = np.random.default_rng(seed)
  lengths = np.array([10, 7, 3, 1, 2, 5])[:B]
  mask = (np.arange(Ts)[None, :] < lengths[:, None])[:, None, :]  # [B, 1, Ts]
  w = np.where(mask, rng.exponential(size=(B, 1, Ts)), 0.0)
  return jnp.asarray(w / w.sum(-1, keepdims=True), jnp.float32), jnp.asarray(mask)


def test_permute_keeps_the_multiset_of_valid_weights_and_zeros_where_masked():
  w, mask = _weights()
  fn = interventions.get("permute", jax.random.PRNGKey(3))
  for t in (0, 1, 5):
    out = np.asarray(fn(w, mask, t))
    assert out.shape == w.shape
    assert (out[~np.asarray(mask)] == 0).all()
    for b in range(w.shape[0]):
      m = np.asarray(mask[b, 0])
      np.testing.assert_array_equal(np.sort(out[b, 0, m]), np.sort(np.asarray(w)[b, 0, m]))
  # it permutes (a 10-long row is not left in place by all three draws) and depends on t and key
  a, b = np.asarray(fn(w, mask, 0)), np.asarray(fn(w, mask, 1))
  assert not np.array_equal(a[0], np.asarray(w)[0]) and not np.array_equal(a[0], b[0])
  other = interventions.get("permute", jax.random.PRNGKey(4))
  assert not np.array_equal(a[0], np.asarray(other(w, mask, 0))[0])
  np.testing.assert_array_equal(a, np.asarray(fn(w, mask, 0)))  # seeded: reproducible


def test_uniform_sums_to_one_over_valid_positions():
  w, mask = _weights()
  out = np.asarray(interventions.get("uniform")(w, mask, 0))
  m = np.asarray(mask)
  np.testing.assert_allclose(out.sum(-1), 1.0, rtol=1e-6)
  assert (out[~m] == 0).all()
  n = m.sum(-1, keepdims=True)
  np.testing.assert_allclose(np.where(m, out, 0), np.where(m, 1.0 / n, 0), rtol=1e-6)


def test_zero_top_removes_the_argmax_and_renormalizes():
  w, mask = _weights()
  out = np.asarray(interventions.get("zero_top")(w, mask, 0))
  w, m = np.asarray(w), np.asarray(mask)
  top = np.argmax(np.where(m, w, -1), -1)  # [B, 1]
  for b in range(w.shape[0]):
    n = m[b, 0].sum()
    assert out[b, 0, top[b, 0]] == 0 and (out[b, 0, ~m[b, 0]] == 0).all()
    if n == 1:
      np.testing.assert_array_equal(out[b], 0.0)  # nothing left to attend to
      continue
    rest = np.where(m[b, 0], w[b, 0], 0.0)
    rest[top[b, 0]] = 0.0
    np.testing.assert_allclose(out[b, 0], rest / rest.sum(), rtol=1e-5)


def test_zero_top_of_a_one_hot_row_falls_back_to_uniform_over_the_rest():
  w = jnp.asarray([[[0.0, 1.0, 0.0, 0.0]]])
  mask = jnp.asarray([[[True, True, True, False]]])
  np.testing.assert_allclose(interventions.get("zero_top")(w, mask, 0),
                             [[[0.5, 0.0, 0.5, 0.0]]])


def test_unknown_intervention_lists_the_known_ones():
  with pytest.raises(ConfigError, match="permute"):
    interventions.get("shuffle")


def test_bad_settings_are_config_errors_before_any_work():
  with pytest.raises(ConfigError, match="shuffle"):
    diagnosis.DiagnoseSettings(interventions=("permute", "shuffle"))
  with pytest.raises(ConfigError, match="--max_examples"):
    diagnosis.DiagnoseSettings(max_examples=0)
  assert diagnosis.DiagnoseSettings().interventions == interventions.DEFAULT


def test_output_divergences_against_numpy():
  rng = np.random.default_rng(2)
  a, b = rng.normal(size=(2, 4, 7)) * 3
  tv, js, flip = map(np.asarray, measures.output_divergences(a, b))
  p = np.exp(a) / np.exp(a).sum(-1, keepdims=True)
  q = np.exp(b) / np.exp(b).sum(-1, keepdims=True)
  m = (p + q) / 2
  np.testing.assert_allclose(tv, 0.5 * np.abs(p - q).sum(-1), rtol=1e-5)
  want_js = 0.5 * (p * np.log(p / m)).sum(-1) + 0.5 * (q * np.log(q / m)).sum(-1)
  np.testing.assert_allclose(js, want_js, rtol=1e-4, atol=1e-7)
  assert (js <= np.log(2) + 1e-6).all()
  np.testing.assert_array_equal(flip, p.argmax(-1) != q.argmax(-1))
  tv0, js0, flip0 = measures.output_divergences(a, a)
  assert float(jnp.max(tv0)) == 0.0 and float(jnp.max(js0)) == 0.0 and not bool(flip0.any())


# ----------------------------------------------------------------------------- on a tiny model

@pytest.fixture(scope="module")
def tiny():
  """An untrained tiny Bahdanau model and a batch with padding (Ts=6, Tt=5: all sizes differ)."""
  mc = model_config(src_vocab=11, tgt_vocab=13, emb_dim=4, enc_hidden=5, dec_hidden=7, d_attn=3,
                    decoder="bahdanau")
  model = build_model(mc, seed=1)
  batch = {"src": jnp.array([[4, 5, 6, 7, 8, 2], [9, 4, 2, 0, 0, 0]]),
           "src_lengths": jnp.array([6, 3]),
           "tgt": jnp.array([[8, 7, 6, 5, 2], [4, 9, 2, 0, 0]]),
           "tgt_lengths": jnp.array([5, 3])}
  return model, batch


def _jit_on_model(fn, model, batch, **kw):
  """fn(model, batch) under jax.jit the way the diagnosis runs it: the model split into a static
  graphdef and a state argument (an nnx module closed over by jax.jit cannot enter nnx.grad)."""
  graphdef, state = nnx.split(model)
  return jax.jit(lambda state, batch: fn(nnx.merge(graphdef, state), batch, **kw))(state, batch)


def test_identity_counterfactual_equals_the_real_path(tiny):
  model, batch = tiny
  logits, logits_cf, att = model.counterfactual(batch, interventions.get("identity"))
  np.testing.assert_array_equal(np.asarray(logits_cf), np.asarray(logits))
  tv, _, flip = measures.output_divergences(logits, logits_cf)
  assert float(jnp.max(tv)) == 0.0 and not bool(flip.any())
  ref_logits, ref_att = model.attention(batch)  # the real path is plain teacher forcing
  np.testing.assert_allclose(logits, ref_logits, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(att.weights, ref_att.weights, rtol=1e-5, atol=1e-6)


def test_gradient_x_input_matches_finite_differences(tiny):
  model, batch = tiny
  gxi = np.asarray(_jit_on_model(measures.gradient_x_input, model, batch))  # [B, Tt, Ts]
  assert gxi.shape == (2, 5, 6)
  assert (gxi[1, :, 3:] == 0).all()  # padded source positions get nothing
  x = model.encoder.embed(batch["src"])  # [B, Ts, E]
  graphdef, state = nnx.split(model)
  log_probs = jax.jit(lambda state, off: measures._token_log_probs(
      nnx.merge(graphdef, state), batch, off))  # [B, Tt]
  lp = lambda off: np.asarray(log_probs(state, off), np.float64)
  eps = 1e-2
  for b, s in [(0, 0), (0, 3), (0, 5), (1, 1), (1, 2)]:
    # the directional derivative along x_s itself is <grad_s, x_s>
    d = jnp.zeros_like(x).at[b, s].set(x[b, s])
    fd = (lp(eps * d) - lp(-eps * d)) / (2 * eps)  # [B, Tt]
    np.testing.assert_allclose(gxi[b, :, s], fd[b], rtol=2e-2, atol=2e-4, err_msg=f"{b},{s}")
    other = 1 - b  # rows are independent: the other example's steps do not move
    np.testing.assert_allclose(fd[other], 0.0, atol=1e-4)


def test_integrated_gradients_are_complete(tiny):
  model, batch = tiny
  ig = np.asarray(_jit_on_model(measures.integrated_gradients, model, batch, steps=32))
  x = model.encoder.embed(batch["src"])
  lp = lambda off: np.asarray(measures._token_log_probs(model, batch, off))
  gap = lp(jnp.zeros_like(x)) - lp(-x)  # log p(y | x) - log p(y | 0 embeddings)  [B, Tt]
  np.testing.assert_allclose(ig.sum(-1), gap, rtol=5e-2, atol=5e-3)


def test_shifted_gold_moves_links_and_drops_them_at_the_edges():
  gold = np.zeros((1, 4, 5), np.float32)
  for t, s in enumerate([3, 2, 1, 0]):  # a reversal of 4 tokens (+ EOS column unused)
    gold[0, t, s] = 1.0
  tl, sl = np.array([4]), np.array([5])
  prev = measures.shifted_gold(gold, tl, sl, -1, "target")
  np.testing.assert_array_equal(prev[0, 0], 0.0)           # nothing before the first token
  np.testing.assert_array_equal(prev[0, 1:], gold[0, :-1])
  right = measures.shifted_gold(gold, tl, sl, 1, "source")  # link (t, s) moves to (t, s+1)
  np.testing.assert_array_equal(right[0, :, 1:], gold[0, :, :-1])
  np.testing.assert_array_equal(right[0, :, 0], 0.0)
  # on a reversal, "the previous target token" is "one source position to the right"
  np.testing.assert_array_equal(measures.shifted_gold(gold, tl, sl, -1, "target")[0, 1:],
                                measures.shifted_gold(gold, tl, sl, 1, "source")[0, 1:])


# ----------------------------------------------------------------------------- end to end

@pytest.fixture(scope="module")
def smoke_workdir(smoke_bahdanau_workdir):
  """The session's trained smoke run (decoder=bahdanau; tests/conftest.py)."""
  return smoke_bahdanau_workdir


@pytest.fixture(scope="module")
def cli_report(smoke_workdir):
  """diagnose.json of `python -m experiments.diagnose` on the smoke run (8 examples, IG on)."""
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.diagnose", f"--workdir={smoke_workdir}",
       "--max_examples=8", "--ig_steps=2"],
      cwd=REPO, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(os.path.join(smoke_workdir, "diagnose.json")) as f:
    return json.load(f), proc.stdout


@pytest.fixture(scope="module")
def smoke_run(smoke_workdir):
  return training.load_run(smoke_workdir)


def test_diagnose_entry_point_writes_the_report_and_plots(smoke_workdir, cli_report):
  r, stdout = cli_report
  assert "| permute |" in stdout and "Kendall tau" in stdout
  for name in diagnosis_report.PLOTS:
    assert os.path.getsize(os.path.join(smoke_workdir, name)) > 1000, name
  assert r["n_examples"] == 8 and r["n_steps"] >= 8 and r["split"] == "test"
  assert r["model"]["decoder"] == "bahdanau"
  e = r["entropy"]
  assert 0 <= e["mean"] <= e["uniform_mean"] + 1e-6
  assert sum(e["histogram"]["counts"]) == r["n_steps"]
  al = r["alignment"]
  assert 0 <= al["aer"] <= 1 and 0 <= al["attention_on_gold"] <= 1
  assert set(al["shifted"]) == {"target-1", "target+1", "source-1", "source+1"}
  assert all(0 <= v["attention_on_gold"] <= 1 for v in al["shifted"].values())
  kt = r["attribution"]["kendall_tau"]
  assert kt["n_steps"] > 0 and -1 <= kt["mean"] <= 1 and -1 <= kt["median"] <= 1
  assert kt["n_steps"] + kt["n_skipped_short"] + kt["n_undefined"] == r["n_steps"]
  assert -1 <= r["integrated_gradients"]["kendall_tau"]["mean"] <= 1
  assert set(r["counterfactual"]) == {"permute", "uniform", "zero_top"}
  for row in r["counterfactual"].values():
    assert 0 <= row["tv_mean"] <= 1 and 0 <= row["js_mean"] <= np.log(2)
    assert 0 <= row["flip_rate"] <= 1 and row["n_steps"] == r["n_steps"]


def _leaves(tree, prefix=""):
  """[(path, number)] of a JSON tree, in key order."""
  if isinstance(tree, dict):
    return [kv for k in sorted(tree) for kv in _leaves(tree[k], f"{prefix}/{k}")]
  if isinstance(tree, list):
    return [kv for i, v in enumerate(tree) for kv in _leaves(v, f"{prefix}/{i}")]
  return [(prefix, float(tree))]


def test_diagnose_in_process_reproduces_the_entry_point(smoke_run, cli_report):
  r, _ = cli_report
  d = diagnosis.diagnose(smoke_run, max_examples=8, seed=0)  # the CLI's defaults, IG off
  assert d.report["n_examples"] == 8 and d.report["integrated_gradients"] is None
  for key in ("n_steps", "entropy", "alignment", "counterfactual"):
    got, want = _leaves(json.loads(json.dumps(d.report[key]))), _leaves(r[key])
    assert [k for k, _ in got] == [k for k, _ in want], key
    np.testing.assert_allclose([v for _, v in got], [v for _, v in want], rtol=1e-5, err_msg=key)
  assert d.steps["entropy"].shape == (d.report["n_steps"],)
  assert "permute" in diagnosis_report.format_table(d.report)


def test_a_run_without_attention_or_results_is_one_error_line(smoke_run, tmp_path):
  proc = subprocess.run([sys.executable, "-m", "experiments.diagnose", f"--workdir={tmp_path}"],
                        cwd=REPO, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2 and proc.stderr.strip().startswith("error:"), proc.stderr[-2000:]
  assert "not a finished run" in proc.stderr and "Traceback" not in proc.stderr
  import dataclasses  # pylint: disable=import-outside-toplevel
  no_attention = dataclasses.replace(smoke_run,
                                     mc=smoke_run.mc.replace_paths({"rnn.decoder": "none"}))
  with pytest.raises(diagnosis.DiagnosisError, match="no attention"):
    diagnosis.diagnose(no_attention)


def test_a_fused_model_is_diagnosed_through_its_unfused_twin():
  import types  # pylint: disable=import-outside-toplevel
  mc = model_config(src_vocab=11, tgt_vocab=13, emb_dim=4, enc_hidden=5, dec_hidden=8,
                    decoder="luong", score="dot", input_feeding=False, fused=True)
  task = training.get_task("translate")
  model = task.build_model(mc, seed=1)
  twin = diagnosis.analysis_model(types.SimpleNamespace(mc=mc, model=model, task=task, workdir="w"))
  batch = {"src": jnp.array([[4, 5, 6, 2]]), "src_lengths": jnp.array([4]),
           "tgt": jnp.array([[6, 5, 4, 2]]), "tgt_lengths": jnp.array([4])}
  logits, att = model.attention(batch)
  assert att is None  # the fused kernel never forms the weights
  logits_twin, att_twin = twin.attention(batch)
  np.testing.assert_allclose(logits_twin, logits, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(att_twin.weights.sum(-1), 1.0, rtol=1e-5)


# ----------------------------------------------------------------------------- the Transformer

@pytest.fixture(scope="module")
def tiny_transformer():
  """An untrained Transformer (2 decoder layers x 2 heads, dot score) and a padded batch."""
  mc = model_config(src_vocab=11, tgt_vocab=13, arch="transformer", d_model=8, num_heads=2,
                    d_ff=12, enc_layers=1, dec_layers=2, dropout=0.0, max_src_len=8,
                    max_tgt_len=8)
  batch = {"src": jnp.array([[4, 5, 6, 7, 8, 2], [9, 4, 2, 0, 0, 0]]),
           "src_lengths": jnp.array([6, 3]),
           "tgt": jnp.array([[8, 7, 6, 5, 2], [4, 9, 2, 0, 0]]),
           "tgt_lengths": jnp.array([5, 3])}
  return build_model(mc, seed=3), batch


def test_transformer_counterfactual_identity_is_the_real_path(tiny_transformer):
  model, batch = tiny_transformer
  logits, logits_cf, att = model.counterfactual(batch, interventions.get("identity"))
  ref_logits, ref_att = model.attention(batch)
  np.testing.assert_allclose(logits, ref_logits, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(logits_cf, logits, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(att.heads, ref_att.heads, atol=1e-7)


def test_transformer_uniform_counterfactual_is_a_model_whose_queries_see_nothing(
    tiny_transformer):
  """A dot score of a zero query is 0 for every key: softmax gives the uniform weights. With
  every cross-attention query projection zeroed, step 0 (whose prefix is empty, so no other step
  can reach it) must equal the `uniform` counterfactual of step 0 in every layer and head; later
  steps differ (their prefix keeps its real attention in the counterfactual)."""
  model, batch = tiny_transformer
  logits, logits_cf, _ = model.counterfactual(batch, interventions.get("uniform"))
  blind = nnx.clone(model)  # a copy: merge(split(model)) would share the model's Variables
  for layer in blind.decoder.layers:
    layer.cross.params["wq"][...] = jnp.zeros_like(layer.cross.params["wq"][...])
  blind_logits, blind_att = blind.attention(batch)
  valid = np.arange(6)[None] < np.asarray(batch["src_lengths"])[:, None]
  np.testing.assert_allclose(np.asarray(blind_att.heads)[:, :, :, 0],
                             np.broadcast_to((valid / valid.sum(1, keepdims=True))[:, None, None],
                                             (2, 2, 2, 6)), atol=1e-6)
  np.testing.assert_allclose(logits_cf[:, 0], blind_logits[:, 0], rtol=1e-5, atol=1e-5)
  assert not np.allclose(logits_cf[:, 0], logits[:, 0], atol=1e-3)
  assert not np.allclose(logits_cf[0, 3], blind_logits[0, 3], atol=1e-3)


def test_transformer_gradient_x_input_matches_finite_differences(tiny_transformer):
  model, batch = tiny_transformer
  gxi = np.asarray(_jit_on_model(measures.gradient_x_input, model, batch))  # [B, Tt, Ts]
  x = model.encoder.embed(batch["src"])
  graphdef, state = nnx.split(model)
  log_probs = jax.jit(lambda state, off: measures._token_log_probs(
      nnx.merge(graphdef, state), batch, off))
  lp = lambda off: np.asarray(log_probs(state, off), np.float64)
  eps = 1e-2
  for b, s in [(0, 1), (0, 4), (1, 2)]:
    d = jnp.zeros_like(x).at[b, s].set(x[b, s])
    fd = (lp(eps * d) - lp(-eps * d)) / (2 * eps)
    np.testing.assert_allclose(gxi[b, :, s], fd[b], rtol=2e-2, atol=2e-4, err_msg=f"{b},{s}")


def test_a_transformer_run_is_diagnosed_per_layer_and_head(smoke_transformer_workdir, tmp_path):
  wd = smoke_transformer_workdir
  run = training.load_run(wd)
  d = diagnosis.diagnose(run, max_examples=8)  # the entry point's steps, in process
  with open(diagnosis_report.write(d, str(tmp_path))) as f:
    r = json.load(f)
  for name in diagnosis_report.PLOTS + (diagnosis_report.HEADS_PLOT,):
    assert os.path.getsize(os.path.join(tmp_path, name)) > 1000, name
  table = diagnosis_report.format_table(r)
  assert "layer 2:" in table and "zero_top in one layer alone" in table
  assert r["model"]["decoder"] == "transformer" and r["n_examples"] == 8
  h = r["heads"]
  assert (h["layers"], h["heads"]) == (2, 2)
  ent = np.array(h["entropy_mean"])
  assert ent.shape == (2, 2) and (ent >= 0).all()
  assert (ent <= r["entropy"]["uniform_mean"] + 1e-6).all()
  # The layer average of the last layer is what the run-level alignment reads.
  last = h["layer_average_alignment"][-1]
  assert last["aer"] == pytest.approx(r["alignment"]["aer"], abs=1e-6)
  assert last["attention_on_gold"] == pytest.approx(r["alignment"]["attention_on_gold"], abs=1e-6)
  # Per head: the gold-alignment scores of that head's own teacher-forced weights.
  from attn.evaluation import metrics  # pylint: disable=import-outside-toplevel
  w, gold, tl, sl = [], [], [], []
  n = 0
  for batch in run.bundle.batches("test"):
    keep = (batch["example_id"] >= 0) & (np.cumsum(batch["example_id"] >= 0) <= 8 - n)
    n += int(keep.sum())
    att = run.model.attention({k: jnp.asarray(batch[k]) for k in
                               ("src", "src_lengths", "tgt", "tgt_lengths")})[1]
    w.append(np.asarray(att.heads)[keep])
    gold.append(batch["alignments"][keep])
    tl.append(batch["tgt_lengths"][keep])
    sl.append(batch["src_lengths"][keep])
    if n >= 8:
      break
  w, gold, tl, sl = map(np.concatenate, (w, gold, tl, sl))
  for l in range(2):
    for k in range(2):
      want = metrics.attention_on_gold(w[:, l, k], gold, tl, sl)
      assert h["alignment"][l][k]["attention_on_gold"] == pytest.approx(want, abs=1e-6)
  assert r["counterfactual"]["uniform"]["n_steps"] == r["n_steps"]
  by_layer = h["counterfactual_by_layer"]
  assert set(by_layer) == {"permute", "uniform", "zero_top"}
  assert all(len(rows) == 2 and all(0 <= x["tv_mean"] <= 1 and 0 <= x["flip_rate"] <= 1
                                    for x in rows) for rows in by_layer.values())


def test_transformer_counterfactual_in_one_layer_leaves_the_others_alone(tiny_transformer):
  """Intervening in layer 0 and layer 1 separately differs from intervening in both; naming
  every layer is the default; a layer index out of range is refused."""
  model, batch = tiny_transformer
  fn = interventions.get("uniform")
  _, both, _ = model.counterfactual(batch, fn)
  _, named, _ = model.counterfactual(batch, fn, layers=(0, 1))
  _, first, _ = model.counterfactual(batch, fn, layers=(0,))
  _, last, _ = model.counterfactual(batch, fn, layers=(-1,))
  np.testing.assert_array_equal(named, both)
  assert not np.allclose(first, both, atol=1e-4) and not np.allclose(last, both, atol=1e-4)
  assert not np.allclose(first, last, atol=1e-4)
  with pytest.raises(IndexError):
    model.counterfactual(batch, fn, layers=(2,))
