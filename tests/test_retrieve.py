"""Retrieval, then read: pools of distractor stories, the top-k retrieval scope, recall@k, a tiny
run that learns through the one training loop (its Ctrl-C save and resume, its divergence
guard), and the entry point's refusals."""

import dataclasses
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attn.apps.focus import trained_with
from attn.apps.retrieve import server as retrieve_server
from attn.errors import ConfigError
from attn.training.workdir import WorkdirError
from attn.apps.retrieve import data as pools
from attn.apps.retrieve import evaluation
from attn.apps.retrieve import sweep as retrieve
from attn.apps.retrieve import task as retrieve_task
from attn.data import stories
from attn.apps.retrieve import model as retriever

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = pools.PoolStoryConfig(max_sentences=6)


def _apply(model, passages, mask, question, seed=0):
  """The jitted model (eager nnx calls dispatch op by op: seconds on a busy machine)."""
  return retriever.apply(*nnx.split(model), passages, mask, question, jax.random.PRNGKey(seed))


def test_each_pool_holds_its_own_story_and_the_asked_number_of_distractors_without_its_object():
  built = pools.build(40, 5, seed=3, config=SMALL)
  a = built.arrays
  assert a.pool.shape == (40, 6) and a.stories.shape[1] == SMALL.max_sentences
  for i, ex in enumerate(built.examples):
    assert a.pool[i, a.gold[i]] == i  # bank rows 0..N-1 are the gold stories, in order
    assert built.passages(i)[a.gold[i]] == ex.sentences
    distractors = np.delete(a.pool[i], a.gold[i])
    assert len(set(distractors.tolist())) == 5 and (distractors >= 40).all()
    obj = stories.tokenize(ex.question)[-1]
    assert ex.kind == "object" and not any(
        obj in stories.tokenize(s) for p in np.delete(np.arange(6), a.gold[i])
        for s in built.passages(i)[p])
    take, move = (ex.sentences[j] for j in a.supports[i])
    holder = take.split()[0]
    assert obj in stories.tokenize(take) and move.startswith(holder + " ")
    assert move.endswith(f"the {ex.answer}.") and a.answer[i] == SMALL.places.index(ex.answer)
  assert len(set(a.gold.tolist())) > 1  # the gold story is not always in the same place
  again = pools.build(40, 5, seed=3, config=SMALL).arrays
  assert all(np.array_equal(x, y) for x, y in zip(a, again))
  assert pools.build(3, 0, seed=1, config=SMALL).arrays.pool.shape == (3, 1)


def test_recall_at_k_against_a_hand_worked_example():
  scores = np.array([[0.1, 0.9, 0.5, 0.2],   # gold 2: rank 2
                     [0.7, 0.1, 0.3, 0.9],   # gold 0: rank 2
                     [0.4, 0.4, 0.1, 0.0],   # gold 1: tied with an earlier passage: rank 2
                     [0.0, 0.1, 0.2, 0.3]])  # gold 0: rank 4
  gold = np.array([2, 0, 1, 0])
  assert pools.recall_at_k(scores, gold, 1) == 0.0
  assert pools.recall_at_k(scores, gold, 2) == 0.75
  assert pools.recall_at_k(scores, gold, 3) == 0.75
  assert pools.recall_at_k(scores, gold, 4) == 1.0


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """(config, test pools, the model's outputs on them, (model, training losses logged every 10
  steps)) of a tiny run through the training loop."""
  from attn.training import building, loop
  cfg = retrieve.RetrieveConfig(stories=SMALL, distractors=(4,), modes=("retrieve",), dim=16,
                                steps=250, batch_size=32, train_size=500, test_size=200)
  vocab = stories.Vocab.for_config(SMALL)
  test_set = pools.build(cfg.test_size, 4, 1, SMALL, vocab).arrays
  config = retrieve_task.run_config(cfg, "retrieve", 4)
  config.train.log_every = 10
  wd = str(tmp_path_factory.mktemp("retrieve_run"))
  task = retrieve_task.RetrieveTask()
  loop.train_and_evaluate(config, wd, task)
  model = building.load_run(wd, task).model
  with open(os.path.join(wd, "metrics.jsonl")) as f:
    losses = np.array([r["loss"] for r in map(json.loads, f) if r["split"] == "train"])
  return cfg, test_set, evaluation.run_model(model, test_set), (model, losses)


def test_a_tiny_run_retrieves_the_gold_story_and_answers_above_chance(trained):
  cfg, test_set, out, (model, losses) = trained
  row = retrieve.evaluate(model, test_set, cfg)
  assert len(losses) == 25 and losses[-5:].mean() < losses[:5].mean()
  assert row["recall_at_k"] > 0.9 > 2 / 5  # random k = 2 of 5 passages: 0.4
  assert row["answer_accuracy"] > 2 / len(SMALL.places)  # chance 1/6
  assert row["recall_at_k"] == pools.recall_at_k(out.passage_scores, test_set.gold, 2)


def test_the_retrieval_scope_keeps_the_k_best_passages_and_p_z_lives_on_it(trained):
  scores = jnp.array([[0.1, 3.0, -1.0, 2.0, 0.5], [5.0, 4.0, 3.0, 2.0, 1.0]])
  np.testing.assert_array_equal(retriever.retrieval_scope(scores, 2),
                                [[False, True, False, True, False], [True, True, False, False,
                                                                     False]])
  _, _, out, _ = trained
  top2 = np.argsort(-out.passage_scores, axis=1)[:, :2]
  np.testing.assert_array_equal(np.sort(top2, 1), np.sort(out.retrieved, 1))
  w = out.passage_weights
  assert ((w > 0).sum(1) == 2).all() and np.allclose(w.sum(1), 1.0, atol=1e-6)
  e = np.take_along_axis(out.passage_scores, top2, axis=1)
  want = np.exp(e) / np.exp(e).sum(1, keepdims=True)  # softmax over the two kept scores
  np.testing.assert_allclose(np.take_along_axis(w, top2, axis=1), want, rtol=1e-4, atol=1e-6)
  assert np.allclose(np.exp(out.log_probs).sum(1), 1.0, atol=1e-5)


def test_whole_pool_and_random_modes_read_what_they_say():
  a = pools.build(4, 3, seed=2, config=SMALL).arrays
  vocab = stories.Vocab.for_config(SMALL)
  batch = pools.batch_arrays(a, np.arange(4))[:3]
  cfg = retriever.RetrieverConfig(len(vocab), len(SMALL.places), SMALL.max_sentences, dim=8)
  flat = _apply(retriever.build(dataclasses.replace(cfg, mode="whole_pool")), *batch)
  assert flat.sentence_weights.shape == (4, 1, 2, 4 * SMALL.max_sentences)
  assert np.allclose(np.asarray(flat.sentence_weights).sum(-1), 1.0, atol=1e-5)
  rand = retriever.build(dataclasses.replace(cfg, mode="random"))
  picks = {tuple(sorted(np.asarray(_apply(rand, *batch, seed=s).retrieved[0])))
           for s in range(8)}
  assert len(picks) > 1  # different keys, different passages
  w = np.asarray(_apply(rand, *batch).passage_weights)
  assert np.allclose(np.sort(w, axis=1)[:, -2:], 0.5)  # read with equal weight


def test_the_batches_are_the_questions_the_former_compiled_loop_drew():
  """Step s of a run of `steps` steps: in its chunk of min(250, steps) steps starting at c, the
  questions of randint(split(fold_in(fold_in(fold_in(PRNGKey(seed), 1), c), s - c))[0]), the
  `random` mode's key the second half of that split; a resumed run reads the same from s on."""
  seed, steps, B, N = 3, 600, 4, 97
  key = jax.random.fold_in(jax.random.PRNGKey(seed), 1)
  draws = retrieve_task.step_draws(seed, steps, B, N, 0)
  got = [next(draws) for _ in range(steps)]
  for s in (0, 1, 249, 250, 499, 500, 599):
    c = s // 250 * 250
    k1, k2 = jax.random.split(jax.random.fold_in(jax.random.fold_in(key, c), s - c))
    np.testing.assert_array_equal(got[s][0], jax.random.randint(k1, (B,), 0, N))
    np.testing.assert_array_equal(got[s][1], k2)
  resumed = retrieve_task.step_draws(seed, steps, B, N, 263)
  for s in range(263, 520):
    rows, k = next(resumed)
    np.testing.assert_array_equal(rows, got[s][0])
    np.testing.assert_array_equal(k, got[s][1])


def _tiny_sweep(**kw):
  return retrieve.RetrieveConfig(**{
      "stories": SMALL, "distractors": (0, 2), "modes": ("retrieve",), "dim": 8, "steps": 30,
      "batch_size": 8, "train_size": 60, "test_size": 40, "num_samples": 1, **kw})


@pytest.fixture(scope="module")
def tiny_sweep(tmp_path_factory):
  """(config, workdir) of a finished sweep of one model (retrieve, 2 distractors; seconds)."""
  cfg = _tiny_sweep(distractors=(2,))
  workdir = str(tmp_path_factory.mktemp("retrieve_sweep"))
  retrieve.train_and_evaluate(cfg, workdir, verbose=False)
  return cfg, workdir


def _snapshot(workdir) -> dict:
  """Every file under `workdir` (lock files aside) -> its size and modification time."""
  out = {}
  for root, _, names in os.walk(workdir):
    for n in names:
      if n != ".lock":
        st = os.stat(os.path.join(root, n))
        out[os.path.relpath(os.path.join(root, n), workdir)] = (st.st_size, st.st_mtime_ns)
  return out


def test_a_rerun_with_other_training_settings_is_refused_before_anything_is_written(tiny_sweep,
                                                                                    tmp_path):
  """A rerun with another train_size, seed, ... used to measure the models trained on the old
  data again and record the new settings in retrieve.json. A distractor count new to the
  workdir, listed first, trains nothing before the refusal."""
  cfg, workdir = tiny_sweep
  before = _snapshot(workdir)
  for change, shown in [({"train_size": 61}, "train_size=60 there, 61 here"),
                        ({"seed": 1, "distractors": (0, 2)}, "seed=0 there, 1 here"),
                        ({"retrieval_loss": 0.0}, "retrieval_loss=1.0 there, 0.0 here"),
                        ({"top_k": 1}, "top_k=2 there, 1 here")]:
    with pytest.raises(WorkdirError, match=rf"^workdir {re.escape(workdir)} holds models "
                       rf"trained with other settings \({shown}; .*use another --workdir$"):
      retrieve.train_and_evaluate(dataclasses.replace(cfg, **change), workdir, verbose=False)
    assert _snapshot(workdir) == before, change
  with open(os.path.join(workdir, trained_with.SETTINGS_FILE)) as f:
    record = json.load(f)
  assert record == trained_with.as_json(retrieve.trained_settings(cfg))
  run = retrieve.run_dir(workdir, "retrieve", 2)
  with open(os.path.join(run, "config.json")) as f:
    assert trained_with.as_json(retrieve.settings_of_run(json.load(f))) == record
  old = tmp_path / "old"  # a workdir from before the record: checked against its runs
  shutil.copytree(workdir, old, ignore=shutil.ignore_patterns(".lock"))
  os.remove(old / trained_with.SETTINGS_FILE)
  with pytest.raises(WorkdirError, match=r"\(train_size=60 there, 61 here; recorded in .*runs/"):
    retrieve.train_and_evaluate(dataclasses.replace(cfg, train_size=61), str(old), verbose=False)



def test_a_damaged_trained_with_json_is_refused_not_replaced(tiny_sweep, tmp_path):
  """A cut-short trained_with.json was passed over for the runs' config.json and rewritten with
  the rerun's settings: the evidence of what the models were trained with, silently replaced."""
  cfg, workdir = tiny_sweep
  wd = tmp_path / "damaged"
  shutil.copytree(workdir, wd, ignore=shutil.ignore_patterns(".lock"))
  path = wd / trained_with.SETTINGS_FILE
  path.write_text(path.read_text()[:20])
  before = _snapshot(wd)
  with pytest.raises(WorkdirError, match=rf"^{re.escape(str(path))}: the record of what this "
                     r"workdir's models were trained with cannot be read \(JSONDecodeError: .*\): "
                     r"delete it to fall back to the runs' configs, or use another --workdir$"):
    retrieve.train_and_evaluate(cfg, str(wd), verbose=False)
  assert _snapshot(wd) == before

def test_serve_only_refuses_another_applications_workdir_and_damaged_files_in_one_line(
    tiny_sweep, tmp_path):
  _, workdir = tiny_sweep
  focus_wd = tmp_path / "focus"
  focus_wd.mkdir()
  (focus_wd / "application.json").write_text(json.dumps({"application": "focus"}))
  (focus_wd / "model.json").write_text(json.dumps({"stories": {}, "vocab": [], "readers": {}}))
  (focus_wd / retrieve.SERVED_PARAMS).write_bytes(b"")
  with pytest.raises(ConfigError, match=rf"^workdir {focus_wd} holds a focus run, not a retrieve "
                     r"one: serve or inspect it with python -m experiments.focus"):
    retrieve_server.RetrieveService.from_workdir(str(focus_wd))
  retrain = "rerun without --serve_only to retrain, or use another --workdir$"
  damaged = {}
  for damage, name, why in [
      (lambda text: text[:len(text) // 2], retrieve.MODEL_FILE, "JSONDecodeError"),
      (lambda text: text.replace('"stories"', '"story"'), retrieve.MODEL_FILE,
       "no field 'stories'"),
      (None, retrieve.SERVED_PARAMS, "BadZipFile")]:
    wd = tmp_path / f"damaged_{name}_{why[:4]}"
    shutil.copytree(workdir, wd, ignore=shutil.ignore_patterns(".lock", "runs"))
    path = wd / name
    if damage is None:
      path.write_bytes(path.read_bytes()[:200])
    else:
      path.write_text(damage(path.read_text()))
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))} is damaged or not this "
                       rf"application's \({why}.*\): {retrain}"):
      retrieve_server.RetrieveService.from_workdir(str(wd))
    damaged[why] = wd
  done = subprocess.run([sys.executable, "-m", "experiments.retrieve",
                         f"--workdir={damaged['BadZipFile']}", "--serve_only", "--diagnose"],
                        cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
  assert done.returncode == 2 and done.stderr.startswith("error: "), done.stderr[-2000:]
  assert len(done.stderr.strip().splitlines()) == 1 and "is damaged" in done.stderr



def test_serve_only_diagnose_refuses_a_model_json_or_results_lacking_a_field_in_one_line(
    tiny_sweep, tmp_path):
  """--serve_only --diagnose read model.json's trained_distractors and retrieve.json's config
  unchecked: a file lacking one was a KeyError traceback."""
  from attn.apps.retrieve import diagnosis
  _, workdir = tiny_sweep
  retrain = "rerun without --serve_only to retrain, or use another --workdir$"
  cases = [(retrieve.MODEL_FILE, lambda saved: saved.pop("trained_distractors"),
            "no field 'trained_distractors'"),
           (retrieve.RESULTS_FILE, lambda saved: saved.pop("config"), "no field 'config'"),
           (retrieve.RESULTS_FILE, lambda saved: saved["config"].pop("seed"), "no field 'seed'")]
  for i, (name, damage, why) in enumerate(cases):
    wd = tmp_path / f"lacking_{i}"
    shutil.copytree(workdir, wd, ignore=shutil.ignore_patterns(".lock", "runs"))
    path = wd / name
    saved = json.loads(path.read_text())
    damage(saved)
    path.write_text(json.dumps(saved))
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))} is damaged or not this "
                       rf"application's \({why}\): {retrain}"):
      diagnosis.load(str(wd))
  done = subprocess.run([sys.executable, "-m", "experiments.retrieve",
                         f"--workdir={tmp_path / 'lacking_0'}", "--serve_only", "--diagnose"],
                        cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
  assert done.returncode == 2 and done.stderr.startswith("error: "), done.stderr[-2000:]
  assert len(done.stderr.strip().splitlines()) == 1 and "trained_distractors" in done.stderr
  assert not os.path.exists(tmp_path / "lacking_0" / diagnosis.DIAGNOSIS_FILE)

# slow: retrieve trains through the shared loop, whose Ctrl-C resume tests/test_recommend.py and
# tests/test_reliability.py pin fast
@pytest.mark.slow
def test_a_sweep_stopped_by_ctrl_c_resumes_to_the_results_of_an_uninterrupted_one(
    tmp_path, monkeypatch):
  cfg = _tiny_sweep()
  # Calls of 12 steps (the task's default, 50, runs a model's 30 steps as one call): the loop
  # counts a call's tokens before it runs, so the Ctrl-C below lands after the first call.
  config_of = retrieve_task.run_config

  def in_calls_of_12(*args):
    config = config_of(*args)
    config.train.steps_per_call = 12
    return config
  monkeypatch.setattr(retrieve_task, "run_config", in_calls_of_12)
  twin = retrieve.train_and_evaluate(cfg, str(tmp_path / "twin"), verbose=False)
  real = retrieve_task.RetrieveTask.train_tokens
  calls = []

  def ctrl_c_in_the_second_run(self, bundle, tc, step):
    calls.append(step)
    if len(calls) == cfg.steps + 13:  # step 13 of the second model (2 distractors)
      raise KeyboardInterrupt
    return real(self, bundle, tc, step)
  wd = tmp_path / "run"
  with monkeypatch.context() as m:
    m.setattr(retrieve_task.RetrieveTask, "train_tokens", ctrl_c_in_the_second_run)
    with pytest.raises(KeyboardInterrupt):
      retrieve.train_and_evaluate(cfg, str(wd), verbose=False)
  second = pathlib.Path(retrieve.run_dir(str(wd), "retrieve", 2))
  assert sorted(n for n in os.listdir(second / "checkpoints") if n.isdigit()) == ["12"]
  assert not (second / "results.json").exists() and not (wd / retrieve.RESULTS_FILE).exists()
  assert (pathlib.Path(retrieve.run_dir(str(wd), "retrieve", 0)) / "results.json").exists()
  resumed = retrieve.train_and_evaluate(cfg, str(wd), verbose=False)
  strip = lambda r: {m: [{k: v for k, v in row.items() if k != "train_seconds"} for row in rows]
                     for m, rows in r["modes"].items()}
  assert strip(resumed) == strip(twin)
  with np.load(wd / retrieve.SERVED_PARAMS) as a, np.load(
      tmp_path / "twin" / retrieve.SERVED_PARAMS) as b:
    assert sorted(a.files) == sorted(b.files)
    for name in a.files:
      np.testing.assert_array_equal(a[name], b[name])
  assert (json.loads((wd / retrieve.MODEL_FILE).read_text())
          == json.loads((tmp_path / "twin" / retrieve.MODEL_FILE).read_text()))


def test_a_diverging_sweep_is_stopped_by_the_loops_guard(tmp_path):
  from attn.training import loop
  with pytest.raises(loop.TrainingDiverged, match=r"diverged at step \d+: .*learning_rate=1e\+38"):
    retrieve.train_and_evaluate(_tiny_sweep(learning_rate=1e38), str(tmp_path), verbose=False)
  assert not (tmp_path / retrieve.RESULTS_FILE).exists()
  assert not (pathlib.Path(retrieve.run_dir(str(tmp_path), "retrieve", 0)) / "results.json"
              ).exists()


def test_bad_settings_are_config_errors():
  with pytest.raises(ConfigError, match="unknown retrieval mode 'nope'"):
    retrieve.RetrieveConfig(modes=("retrieve", "nope"))
  with pytest.raises(ConfigError, match="distractors"):
    retrieve.RetrieveConfig(distractors=(4, -1))
  with pytest.raises(ConfigError, match="top_k must be >= 1"):
    retrieve.RetrieveConfig(top_k=0)
  with pytest.raises(ConfigError, match="at least two objects"):
    retrieve.RetrieveConfig(stories=pools.PoolStoryConfig(objects=("apple",)))


@pytest.mark.parametrize("args, message", [
    (["--modes=retrieve,bogus"], "unknown retrieval mode 'bogus'; known: random, retrieve, "
                                 "whole_pool"),
    (["--distractors=0,x"], "--distractors"),
    (["--diagnose", "--interventions=identity,nope"],
     "unknown intervention 'nope'; known: identity, permute, uniform, zero_top"),
    (["--serve_only", "--diagnose"], "no trained retriever in"),
    (["--serve_only"], "--serve_only needs --port (a port to serve on) or --diagnose"),
])
def test_the_entry_point_refuses_bad_flags_in_one_line_before_writing(tmp_path, args, message):
  workdir = tmp_path / "run"
  done = subprocess.run([sys.executable, "-m", "experiments.retrieve", f"--workdir={workdir}",
                         *args], cwd=REPO, capture_output=True, text=True, timeout=120,
                        check=False)
  assert done.returncode == 2 and re.match(r"error: ", done.stderr), done.stderr[-2000:]
  assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
  assert not workdir.exists()


@pytest.mark.parametrize("mode", ["whole_pool", "retrieve"])
def test_the_whole_pool_step_fuses_its_sums_and_computes_the_same_step(tmp_path, mode):
  """A whole-pool reader's step compiles with XLA's own reductions (jitting.XLA_REDUCTIONS),
  the retrieving modes with XLA's defaults; either way the step computes the same update."""
  from attn.common import jitting
  from attn.training import building
  cfg = retrieve.RetrieveConfig(stories=SMALL, dim=8, steps=2, batch_size=4, train_size=20,
                                test_size=8)
  run = building.setup(retrieve_task.run_config(cfg, mode, 4), str(tmp_path),
                       retrieve_task.RetrieveTask())
  options = run.task.compiler_options(run.tc, run.mc)
  assert options == (jitting.XLA_REDUCTIONS if mode == "whole_pool" else None)
  batch = run.device_batch(next(run.task.train_batches(run.bundle, run.tc, 0)))
  key = run.step_key(0)
  state, m = run.step_fn()(run.state, batch, key)
  state_d, m_d = run.step_fn({})(run.state, batch, key)  # XLA's defaults
  np.testing.assert_allclose(m["loss"], m_d["loss"], rtol=1e-6)
  np.testing.assert_allclose(m["grad_norm"], m_d["grad_norm"], rtol=1e-5)
  # Adam's first update is about lr * sign(g): a gradient entry near 0 may round either way,
  # so the states agree to a small fraction of the learning rate (0.01).
  for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(state_d)):
    np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64),
                               rtol=1e-4, atol=1e-4)
