"""The counterfactual diagnosis of a recommend run: the identity intervention reproduces the
model's scores exactly, the others move them, the gradient x input is the directional derivative
it claims to be, the agreement is scipy's Kendall tau, and a run without attention is refused in
one line before anything is written."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
from flax import nnx

from attn import apps
from attn.errors import ConfigError
from attn.inspection import interventions
from attn.apps.recommend import diagnosis as rd
from attn.apps.recommend import model as recommenders

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
  from attn.training import loop
  from experiments.configs import recommend as presets
  wd = tmp_path_factory.mktemp("rec") / "sasrec"
  config = presets.get_config("tiny")
  config.train.steps = 75  # half the preset: enough for the measures to be read, not to be good
  loop.train_and_evaluate(config, str(wd), task="recommend")
  return str(wd)


def _model(num_blocks=2, T=7):
  cfg = recommenders.RecommenderConfig(kind="sasrec", dim=16, num_blocks=num_blocks, num_heads=2,
                                       ffn_dim=16, num_items=30, max_len=T)
  return recommenders.build(cfg, seed=1)


X = np.array([[3, 5, 7, 9, 11, 13, 0], [2, 4, 6, 8, 0, 0, 0], [1, 1, 2, 0, 0, 0, 0]], np.int32)
LENGTHS = np.array([6, 4, 3], np.int32)


def test_identity_reproduces_the_scores_exactly_and_the_others_move_them():
  graphdef, params = nnx.split(_model())
  out = jax.device_get(rd.analyze_batch(graphdef, params, X, LENGTHS, jax.random.PRNGKey(0),
                                        ("identity", "uniform", "zero_top"), 2))
  for label in ("all", "layer0", "layer1"):
    np.testing.assert_array_equal(out[f"identity/{label}"], out["logits"])  # bit for bit
    for name in ("uniform", "zero_top"):
      assert np.abs(out[f"{name}/{label}"][:, 1:] - out["logits"][:, 1:]).max() > 1e-4, name
  # Only the final position's row changes: the scores at earlier positions stay the real ones.
  fn = interventions.get("uniform")

  @jax.jit
  def hidden(params):
    model = nnx.merge(graphdef, params)
    return (model(X, LENGTHS)[0],
            model(X, LENGTHS, reweigh=rd.final_row_reweigh(fn, (0, 1)))[0])

  h, h_cf = hidden(params)
  for b, n in enumerate(LENGTHS):
    np.testing.assert_array_equal(np.asarray(h[b, :n - 1]), np.asarray(h_cf[b, :n - 1]))
    assert not np.allclose(h[b, n - 1], h_cf[b, n - 1])


def test_gradient_x_input_is_the_directional_derivative_along_each_items_embedding():
  model = _model()
  x, lengths = jnp.asarray(X), jnp.asarray(LENGTHS)
  explained = jnp.array([4, 9, 17])
  gxi = np.asarray(rd.gradient_x_input(model, x, lengths, explained))
  e = np.asarray(model.items(x), np.float64)

  @jax.jit
  def f(offset):
    lp = jax.nn.log_softmax(rd._final_logits(model, x, lengths, embed_offset=offset)[0])
    return jnp.take_along_axis(lp, explained[:, None], axis=1)[:, 0]

  eps = 1e-2
  for j in range(X.shape[1]):  # moving e_j by eps e_j in every row at once: rows are independent
    d = np.zeros_like(e)
    d[:, j] = e[:, j]
    hi, lo = (np.asarray(f(jnp.asarray(s * eps * d, jnp.float32)), np.float64) for s in (1, -1))
    fd = (hi - lo) / (2 * eps)
    np.testing.assert_allclose(gxi[:, j], np.where(j < LENGTHS, fd, 0.0), atol=2e-3, rtol=2e-2)
  assert (gxi[np.arange(7)[None] >= LENGTHS[:, None]] == 0).all()


def test_a_tiny_run_is_diagnosed_and_the_agreement_is_scipys_kendall_tau(tiny_run, tmp_path):
  from attn.inspection.diagnosis import DiagnoseSettings
  diag = rd.diagnose(rd.load_run(tiny_run), max_examples=50,
                     interventions=("identity", "uniform", "zero_top"))
  u, r = diag.users, diag.report
  for i in range(len(u["tau"])):
    n = u["lengths"][i]
    want = scipy.stats.kendalltau(u["attention"][i, :n], np.abs(u["gxi"][i, :n]))[0]
    assert u["tau"][i] == pytest.approx(want, abs=1e-5) or (np.isnan(want) and np.isnan(u["tau"][i]))
  kt = r["attribution"]["kendall_tau"]
  assert -1 <= kt["mean"] <= 1 and kt["n_steps"] == 50
  res = json.load(open(os.path.join(tiny_run, "results.json")))
  assert r["counterfactual"]["identity"]["hr10"] == r["hr10"]
  assert r["counterfactual"]["identity"]["tv_mean"] == 0.0
  assert r["counterfactual"]["uniform"]["tv_mean"] > 0.01
  assert r["counterfactual_by_layer"] is None  # the tiny preset has one block
  assert 0 <= r["attention"]["argmax_is_trigger"] <= 1 and res["users"] >= 50
  # The final-position reading is the one results.json reports for the first 50 test users.
  assert r["attention"]["on_trigger_by_block"] == [pytest.approx(r["attention"]["on_trigger_mean"])]
  # The application's diagnosis hook writes the report and its plots where it is told.
  settings = DiagnoseSettings(workdir=tiny_run, max_examples=20,
                              interventions=("identity", "uniform", "zero_top"))
  path, plots, table = apps.app("recommend").diagnose_fn(settings, str(tmp_path))
  assert json.load(open(path))["n_users"] == 20 and "zero_top" in table
  assert all((tmp_path / p).exists() for p in plots)
  with pytest.raises(ConfigError, match="--split=train: a recommend run is diagnosed on test or "
                     "valid"):
    rd.diagnose(rd.load_run(tiny_run), split="train")


def test_integrated_gradients_are_refused_for_a_recommend_run(tmp_path):
  from attn.inspection.diagnosis import DiagnoseSettings
  with pytest.raises(ConfigError, match=r"^--ig_steps=8: integrated gradients are not "
                     "implemented for recommend runs; leave it at 0$"):
    apps.app("recommend").diagnose_fn(DiagnoseSettings(workdir=str(tmp_path), ig_steps=8),
                                      str(tmp_path))
  assert os.listdir(tmp_path) == []


def test_a_run_without_attention_is_refused_in_one_line_naming_its_kind(tmp_path):
  wd = tmp_path / "meanpool"
  wd.mkdir()
  (wd / "results.json").write_text(json.dumps({"hr10": 0.3, "ndcg10": 0.2, "model": "meanpool",
                                               "model_config": {"kind": "meanpool"}}))
  p = subprocess.run([sys.executable, "-m", "experiments.diagnose", f"--workdir={wd}"], cwd=REPO,
                     capture_output=True, text=True, timeout=120)
  assert p.returncode == 2, p.stderr
  lines = p.stderr.strip().splitlines()
  assert lines == [f"error: {wd}: model.kind='meanpool' has no attention (the history enters "
                   "without weights over its items): there are none to diagnose; pick a run "
                   "with model.kind=sasrec"], p.stderr
  assert sorted(os.listdir(wd)) == ["results.json"]
