"""Next-item recommendation: the generated log's planted structure and split, the ranking metrics
against hand-computed answers, the causal mask of the self-attention recommender, a tiny run
that learns through the one training loop (its divergence guard and Ctrl-C save included), and
bad configs refused in one line before anything is written."""

import json
import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from attn.apps.recommend import data as interactions
from attn.errors import ConfigError
from attn.evaluation import ranking
from attn.apps.recommend import model as recommenders

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFG = interactions.InteractionConfig(num_users=200, num_items=60, num_triggers=6, max_offset=5,
                                     min_len=9, max_len=20, pair_every=5)


@pytest.fixture(scope="module")
def log():
  return interactions.generate(CFG)


def test_every_last_item_is_fixed_by_its_trigger_at_the_known_offset(log):
  K = CFG.num_triggers
  for u, n in enumerate(log.lengths):
    seq = log.sequences[u]
    last, g = seq[n - 1], log.gold[u]
    trigger = seq[g]
    assert 1 <= trigger <= K and last == trigger + K  # target(t) = t + K
    assert g == n - 1 - log.offsets[trigger]
    assert (seq[n:] == interactions.PAD).all() and (seq[:n] != interactions.PAD).all()


def test_every_planted_target_follows_its_trigger_and_noise_never_is_one(log):
  K = CFG.num_triggers
  for u, n in enumerate(log.lengths):
    seq = log.sequences[u, :n]
    for pos in np.flatnonzero((seq > K) & (seq <= 2 * K)):  # every target in the history
      t = seq[pos] - K
      assert seq[pos - log.offsets[t]] == t, (u, pos)
  noise = log.sequences[(log.sequences > 2 * K)]
  counts = np.bincount(noise - 2 * K)
  assert counts[1] > 5 * np.median(counts[counts > 0])  # Zipf: the first noise id dominates
  assert log.lengths.min() >= CFG.min_len and log.lengths.max() <= CFG.max_len
  assert len(set(log.lengths.tolist())) > 5


def test_the_log_is_a_function_of_its_config(log):
  again = interactions.generate(CFG)
  assert (again.sequences == log.sequences).all() and (again.gold == log.gold).all()


def test_leave_one_out_holds_out_the_last_two_items(log):
  sp = interactions.leave_one_out(log)
  for u in range(20):
    n = log.lengths[u]
    seq = log.sequences[u]
    test, valid, train = sp["test"], sp["valid"], sp["train"]
    assert test.lengths[u] == n - 1 and test.last[u] == seq[n - 1]
    assert (test.inputs[u, :n - 1] == seq[:n - 1]).all() and (test.inputs[u, n - 1:] == 0).all()
    assert test.gold[u] == log.gold[u]
    assert valid.lengths[u] == n - 2 and valid.last[u] == seq[n - 2]
    assert (valid.inputs[u, n - 2:] == 0).all()
    assert train.lengths[u] == n - 3
    assert (train.inputs[u, :n - 3] == seq[:n - 3]).all()
    assert (train.targets[u, :n - 3] == seq[1:n - 2]).all()  # next item at every position
    assert seq[n - 2] not in train.targets[u, :n - 3] or seq[n - 2] in seq[1:n - 2]
    if valid.gold[u] >= 0:  # the valid target's trigger, where one was planted
      t = seq[valid.gold[u]]
      assert valid.gold[u] + log.offsets[t] == n - 2 and seq[n - 2] == t + CFG.num_triggers


def test_ranks_hit_rate_and_ndcg_against_hand_computed_answers():
  scores = np.array([[-np.inf, 0.9, 0.5, 0.1, 0.3],   # target 2: rank 2
                     [-np.inf, 0.1, 0.2, 0.3, 0.4],   # target 4: rank 1
                     [-np.inf, 0.5, 0.4, 0.3, 0.2]])  # target 4: rank 4
  r = ranking.ranks(scores, np.array([2, 4, 4]))
  assert r.tolist() == [2, 1, 4]
  assert ranking.hit_rate(r, 3) == pytest.approx(2 / 3)
  assert ranking.hit_rate(r, 10) == 1.0
  # NDCG of rank r = 1 / log2(r + 1): 1/log2(3), 1, 1/log2(5); rank 4 is outside the top 3.
  assert ranking.ndcg(r, 10) == pytest.approx((1 / np.log2(3) + 1 + 1 / np.log2(5)) / 3)
  assert ranking.ndcg(r, 3) == pytest.approx((1 / np.log2(3) + 1) / 3)
  assert ranking.ndcg(np.array([1]), 10) == 1.0


def _jitted(kind, num_blocks=2, T=7):
  """(inputs, lengths) -> (scores [B, T, V], weights or None) of a small model, jitted once."""
  cfg = recommenders.RecommenderConfig(kind=kind, dim=16, num_blocks=num_blocks, num_heads=2,
                                       ffn_dim=16, num_items=30, max_len=T)
  graphdef, state = nnx.split(recommenders.build(cfg, seed=1))

  @jax.jit
  def apply(state, inputs, lengths):
    model = nnx.merge(graphdef, state)
    h, w = model(inputs, lengths)
    return model.logits(h), w
  return lambda inputs, lengths: apply(state, inputs, lengths)


def test_a_future_item_never_changes_an_earlier_positions_output():
  model = _jitted("sasrec")
  x = np.array([[3, 5, 7, 9, 11, 13, 0], [2, 4, 6, 8, 0, 0, 0]], np.int32)
  lengths = np.array([6, 4], np.int32)
  s, w = model(x, lengths)
  for t in range(5):
    y = x.copy()
    y[0, t + 1] = 29  # change the item after position t
    s2, _ = model(y, lengths)
    # The scores at positions 0..t are bit for bit the same; those at t + 1 move.
    np.testing.assert_array_equal(np.asarray(s[0, :t + 1]), np.asarray(s2[0, :t + 1]))
    assert not np.allclose(s[0, t + 1, 1:], s2[0, t + 1, 1:])
  w = np.asarray(w)  # [B, L, H, T, T]
  assert np.all(np.triu(np.ones((7, 7)), k=1)[None, None, None] * w == 0)  # no future key
  assert np.all(w[1, :, :, :, 4:] == 0)  # padding keys get zero weight
  assert np.all(w[1, :, :, 4:, :] == 0)  # padded queries attend to nothing
  np.testing.assert_allclose(w[1, :, :, :4].sum(-1), 1.0, rtol=1e-5)


def test_padding_items_never_change_the_valid_positions():
  x = np.array([[3, 5, 7, 9, 0, 0, 0]], np.int32)
  y = np.array([[3, 5, 7, 9, 21, 22, 23]], np.int32)  # garbage where the history has ended
  lengths = np.array([4], np.int32)
  for kind in ("sasrec", "gru", "meanpool"):
    model = _jitted(kind, num_blocks=1)
    s1, _ = model(x, lengths)
    s2, _ = model(y, lengths)
    np.testing.assert_allclose(np.asarray(s1[0, :4]), np.asarray(s2[0, :4]), atol=1e-6)


def _run(args, tmp_path):
  return subprocess.run([sys.executable, "-m", "experiments.recommend", *args], cwd=REPO,
                        capture_output=True, text=True, timeout=300)


def _train(config, workdir):
  from attn.training import loop
  return loop.train_and_evaluate(config, str(workdir), task="recommend")


def _tiny(**train):
  from experiments.configs import recommend as presets
  config = presets.get_config("tiny")
  for k, v in train.items():
    config.train[k] = v
  return config


def test_a_tiny_run_learns_and_writes_its_files(tmp_path):
  wd = tmp_path / "run"
  out = _train(_tiny(), wd)
  res = json.loads((wd / "results.json").read_text())
  assert res == json.loads(json.dumps(out))
  assert res["random_hr10"] == pytest.approx(10 / 80)
  assert res["hr10"] > 3 * res["random_hr10"], res  # well above a random ranking
  assert 0 < res["ndcg10"] <= res["hr10"]
  assert set(res["hr10_by_length"]) == set(res["attention_on_gold_by_length"])
  assert len(res["attention_on_gold_by_layer_and_length"]) == 1  # the tiny preset's one block
  from attn.launching import entry_points  # launch.py tabulates what the run records
  numeric = {k for k, v in res.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
  assert numeric <= set(entry_points.EXPERIMENTS.get("recommend").known_metrics), numeric
  assert set(entry_points.metrics("recommend")) <= set(res)
  assert 0 <= res["gold_is_argmax_by_layer"][0] <= 1
  for name in ("config.json", "model.json", "metrics.jsonl", "attention.npz"):
    assert (wd / name).exists(), name
  with np.load(wd / "attention.npz") as npz:
    w = npz["weights_0"]
    n = len(npz["src_tokens_0"])
    assert w.shape == (1, 2, n, n) and n == len(npz["sources"][0].split())
  from attn.inspection import viewer  # the run viewer reads it
  run = viewer.load_run(str(wd))
  assert run.has_attention and run.has_scores, run.scores_note
  # Rerunning resumes at the last step: nothing left to train, the same test scores.
  again = _train(_tiny(), wd)
  assert again["hr10"] == res["hr10"] and again["step"] == res["step"] == 150


@pytest.mark.parametrize("lr", [1e38, 1e9])  # non-finite parameters / a finite exploded loss
def test_a_diverging_run_is_stopped_by_the_loops_guard_and_keeps_nothing_after_it(tmp_path, lr):
  from attn.training import loop
  wd = tmp_path / "run"
  config = _tiny(learning_rate=lr, warmup_steps=1, steps=20, log_every=5, eval_every=10,
                 checkpoint_every=10)
  with pytest.raises(loop.TrainingDiverged, match=r"diverged at step \d+: loss .* with "
                     + re.escape(f"train.learning_rate={lr:g}. Nothing from this point was saved")):
    _train(config, wd)
  assert not (wd / "results.json").exists()
  assert not (wd / "best").exists() or not any(n.isdigit() for n in os.listdir(wd / "best"))


def test_ctrl_c_saves_the_step_and_the_rerun_ends_where_an_uninterrupted_run_does(
    tmp_path, monkeypatch):
  from attn.apps.recommend import task as recommendation
  small = lambda: _tiny(steps=20, log_every=5, eval_every=10, checkpoint_every=10)
  twin = _train(small(), tmp_path / "twin")
  real = recommendation.RecommendTask.train_tokens

  def ctrl_c_before_step_14(self, bundle, tc, step):
    if step == 13:
      raise KeyboardInterrupt
    return real(self, bundle, tc, step)
  monkeypatch.setattr(recommendation.RecommendTask, "train_tokens", ctrl_c_before_step_14)
  wd = tmp_path / "run"
  with pytest.raises(KeyboardInterrupt):
    _train(small(), wd)
  monkeypatch.undo()
  assert sorted(n for n in os.listdir(wd / "checkpoints") if n.isdigit()) == ["13"]
  assert not (wd / "results.json").exists()
  resumed = _train(small(), wd)
  assert resumed["step"] == 20 and resumed["best_step"] == twin["best_step"]
  assert ({k: v for k, v in resumed.items() if k != "wall_s"}
          == {k: v for k, v in twin.items() if k != "wall_s"})
  with np.load(wd / "attention.npz") as a, np.load(tmp_path / "twin" / "attention.npz") as b:
    assert sorted(a.files) == sorted(b.files)
    for name in a.files:
      np.testing.assert_array_equal(a[name], b[name])


def test_a_bad_config_is_refused_in_one_line_before_anything_is_written(tmp_path):
  wd = tmp_path / "run"
  p = _run(["--config=experiments/configs/recommend.py:default",
            "--config.model.kind=transformer", f"--workdir={wd}"], tmp_path)
  lines = p.stderr.strip().splitlines()
  assert p.returncode == 2 and len(lines) == 1, p.stderr[-3000:]
  assert lines[0] == "error: unknown model.kind 'transformer'; known: gru, meanpool, sasrec"
  assert not wd.exists()


@pytest.mark.parametrize("override, message", [
    ("model.normalizer=softmx", "unknown model.normalizer 'softmx'; known: entmax15, softmax, "
                                "sparsemax"),
    ("data.min_len=4", "data.min_len=4 is too short for data.max_offset=6"),
    ("model.num_heads=3", "model.dim=64 is not divisible by model.num_heads=3"),
    ("train.steps=0", "train.steps=0 must be >= 1"),
    ("train.compute_dtype=bfloat16", "the recommenders compute in float32 only"),
])
def test_bad_values_are_config_errors_naming_the_field(override, message):
  """What experiments.recommend checks before it touches the workdir (its validate_config calls
  this one; the module itself defines absl flags, so it is not imported here)."""
  from attn.launching import entry_points
  from attn.apps.recommend import task as recommendation
  config = entry_points.build_config("experiments/configs/recommend.py:default",
                                     [override.split("=", 1)])
  with pytest.raises(ConfigError) as e:
    recommendation.validate_config(config)
  assert message in str(e.value)


def test_the_baselines_are_sized_to_the_attention_models_parameter_count():
  from attn.apps.recommend import task as recommendation
  dc = interactions.InteractionConfig()
  counts = {}
  for kind in ("sasrec", "meanpool", "gru"):
    mc = recommendation.resolve_model(recommenders.RecommenderConfig(kind=kind), dc)
    counts[kind] = recommenders.count_params(nnx.eval_shape(lambda: recommenders.build(mc)))
  for kind in ("meanpool", "gru"):
    assert abs(counts[kind] - counts["sasrec"]) / counts["sasrec"] < 0.02, counts
  with pytest.raises(ConfigError, match="unknown model.kind"):
    recommenders.RecommenderConfig(kind="bert4rec")


def test_the_report_refuses_a_run_without_results(tmp_path):
  from attn.errors import DataError
  from attn.apps.recommend import report as recommend_report
  with pytest.raises(DataError, match=f"{tmp_path}: no results.json of a recommend run"):
    recommend_report.load([str(tmp_path)])
  with pytest.raises(ConfigError, match="--workdirs: give at least one"):
    recommend_report.load([])
