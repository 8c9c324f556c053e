"""The reading-focus demo: story generator, reader, training, evaluation files and the API."""

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request

import numpy as np
import pytest
from flax import nnx

import attn
from attn.apps.focus import sweep as focus
from attn.apps.focus import server as focus_server
from attn.apps.focus import trained_with
from attn.data import stories
from attn.models import reader
from attn.errors import ConfigError
from attn.training.workdir import WorkdirError
from attn.data.tokens import UNK

MIXED = stories.StoryConfig(object_questions=0.5, min_sentences=3, max_sentences=10)
NORMALIZERS = attn.canonical_names("normalizer")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SENTENCE = re.compile(r"^(\w+) (.+?) the (\w+)\.$")


def _replay(sentences):
  """Parses a story back into events (kind, actor, place or object) without the generator."""
  events = []
  for s in sentences:
    actor, verb, thing = _SENTENCE.match(s).groups()
    kind = ("move" if verb in stories.MOVE_VERBS else "take" if verb in stories.TAKE_VERBS
            else "drop")
    assert verb in stories.MOVE_VERBS + stories.TAKE_VERBS + stories.DROP_VERBS, s
    events.append((kind, actor, thing))
  return events


def test_gold_evidence_is_the_last_move_of_the_asked_actor_or_holder():
  examples = stories.generate(400, 7, MIXED)
  kinds = {ex.kind for ex in examples}
  assert kinds == {"actor", "object"}
  for ex in examples:
    events = _replay(ex.sentences)
    assert MIXED.min_sentences <= len(ex.sentences) <= MIXED.max_sentences
    if ex.kind == "actor":
      actor = re.match(r"Where is (\w+)\?$", ex.question).group(1)
      moves = [i for i, (k, a, _) in enumerate(events) if k == "move" and a == actor]
      assert ex.support == moves[-1] and ex.supports == (moves[-1],)
    else:
      obj = re.match(r"Where is the (\w+)\?$", ex.question).group(1)
      handled = [i for i, (k, _, o) in enumerate(events) if k in ("take", "drop") and o == obj]
      take = handled[-1]
      assert events[take][0] == "take"  # still held at the end
      actor = events[take][1]
      moves = [i for i, (k, a, _) in enumerate(events) if k == "move" and a == actor]
      assert ex.support == moves[-1] and ex.supports == tuple(sorted((take, moves[-1])))
    assert ex.answer == events[ex.support][2] and ex.answer in MIXED.places


def test_generator_is_deterministic_by_seed_and_the_vocabulary_covers_it():
  a, b, c = (stories.generate(60, s, MIXED) for s in (3, 3, 4))
  assert a == b and a != c
  vocab = stories.Vocab.for_config(MIXED)
  arr = stories.encode(a, vocab, MIXED)
  assert arr.story.shape[:2] == (60, MIXED.max_sentences) and arr.question.shape[0] == 60
  assert not (arr.story == UNK).any() and not (arr.question == UNK).any()
  assert (arr.story_mask.sum(1) == [len(ex.sentences) for ex in a]).all()
  assert (arr.support < arr.story_mask.sum(1)).all()
  assert [MIXED.places[i] for i in arr.answer] == [ex.answer for ex in a]
  assert stories.tokenize("Where is Mary?") == ["where", "is", "mary"]
  assert stories.split_sentences("Mary went to the kitchen. John left\n\n the milk.\n") == [
      "Mary went to the kitchen.", "John left", "the milk."]


@pytest.mark.parametrize("score,normalizer", [("dot", n) for n in NORMALIZERS] + [
    ("general", "entmax15"), ("additive", "sparsemax"), ("location", "softmax")])
def test_reader_weights_are_the_normalized_raw_scores(score, normalizer):
  sc = stories.StoryConfig(max_sentences=7)
  vocab = stories.Vocab.for_config(sc)
  data = stories.encode(stories.generate(5, 0, sc), vocab, sc)
  model = reader.build(reader.ReaderConfig(len(vocab), len(sc.places), 7, dim=8, score=score,
                                           normalizer=normalizer, d_attn=6, init_scale=1.0))
  graphdef, state = nnx.split(model)
  for t in (0.3, 2.0):
    out = reader.read(graphdef, state, data.story, data.story_mask, data.question, t)
    assert out.log_probs.shape == (5, len(sc.places)) and out.weights.shape == (5, 7)
    mask = data.story_mask[:, None, :]
    want = attn.normalize(out.scores[:, None, :] / t, mask, kind=normalizer)[:, 0]
    np.testing.assert_allclose(out.weights, want, atol=1e-6)
    assert (np.asarray(out.weights)[~data.story_mask] == 0).all()
    np.testing.assert_allclose(np.exp(out.log_probs).sum(-1), 1.0, rtol=1e-5)


def test_position_encoding_matches_memn2n_and_ignores_padding():
  l = np.asarray(reader.position_encoding(np.array([3]), 5, 4))[0]  # [W, d]
  j, k = 2, 3  # 1-based
  assert l[j - 1, k - 1] == pytest.approx((1 - j / 3) - (k / 4) * (1 - 2 * j / 3))
  assert (l[3:] == 0).all()
  np.testing.assert_array_equal(reader.ages(np.array([[1, 1, 1, 0]], bool), 12), [[2, 1, 0, 0]])


SMALL = focus.FocusConfig(
    stories=stories.StoryConfig(max_sentences=8), normalizers=("softmax", "sparsemax"),
    temperatures=(0.1, 1.0, 10.0), dim=24, steps=300, train_size=2000, test_size=300,
    num_samples=3)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """Two readers trained for 300 steps (~2 s each here) and the workdir they were saved in."""
  workdir = str(tmp_path_factory.mktemp("focus"))
  results = focus.train_and_evaluate(SMALL, workdir, page="<html></html>", verbose=False)
  return results, workdir


def test_short_training_finds_the_evidence_and_answers_well_above_chance(trained):
  results, _ = trained
  base = results["baselines"]
  assert base["evidence_uniform"] < 0.25 and base["answer_uniform"] < 0.2
  for name in SMALL.normalizers:
    row = next(r for r in results["normalizers"][name]["eval"] if r["temperature"] == 1.0)
    # Measured 0.95-1.0 for both after 300 steps; chance is ~0.2 and ~0.17.
    assert row["evidence_hit_rate"] > 0.75, (name, row)
    assert row["answer_accuracy"] > 0.75, (name, row)


def test_a_lower_temperature_raises_the_max_weight(trained):
  results, _ = trained
  for name in SMALL.normalizers:
    max_w = [r["mean_max_weight"] for r in results["normalizers"][name]["eval"]]  # T ascending
    assert max_w[0] > max_w[1] > max_w[2], (name, max_w)
    assert max_w[0] > 0.95


def test_the_workdir_holds_results_table_page_and_a_servable_model(trained):
  results, workdir = trained
  with open(f"{workdir}/{focus.RESULTS_FILE}") as f:
    assert json.load(f) == json.loads(json.dumps(results))
  with open(f"{workdir}/{focus.TABLE_FILE}") as f:
    table = f.read()
  assert "| softmax |" in table and "**sparsemax** by inference temperature" in table
  service = focus_server.FocusService.from_workdir(workdir)
  assert service.info()["normalizers"] == list(SMALL.normalizers)
  assert len(service.info()["samples"]) == 3
  ex = service.samples[0]
  out = service.read("\n".join(ex["sentences"]), ex["question"], 1.0, "sparsemax")
  assert out["sentences"] == ex["sentences"] and abs(sum(out["weights"]) - 1) < 1e-5
  assert out["answer"] in SMALL.stories.places and 0 < out["answer_prob"] <= 1


def _snapshot(workdir) -> dict:
  """Every file under `workdir` (the lock file aside) -> its size and modification time."""
  out = {}
  for root, _, names in os.walk(workdir):
    for n in names:
      if n != ".lock":
        st = os.stat(os.path.join(root, n))
        out[os.path.relpath(os.path.join(root, n), workdir)] = (st.st_size, st.st_mtime_ns)
  return out


def test_a_rerun_with_other_training_settings_is_refused_before_anything_is_written(trained):
  """The readers were trained with SMALL: a rerun with another train_size, seed, ... used to
  reuse them and record the new settings in focus.json; lowering steps too."""
  _, workdir = trained
  before = _snapshot(workdir)
  for change, shown in [({"train_size": 1000}, "train_size=2000 there, 1000 here"),
                        ({"seed": 1}, "seed=0 there, 1 here"),
                        ({"steps": 100}, "steps=300 there, 100 here"),
                        ({"object_questions": 0.5}, "object_questions=0.0 there, 0.5 here"),
                        ({"normalizers": ("entmax15",), "dim": 8}, "dim=24 there, 8 here")]:
    cfg = (dataclasses.replace(SMALL, stories=dataclasses.replace(SMALL.stories, **change))
           if "object_questions" in change else dataclasses.replace(SMALL, **change))
    with pytest.raises(WorkdirError, match=rf"^workdir {re.escape(workdir)} holds readers "
                       rf"trained with other settings \({shown}; .*use another --workdir$"):
      focus.train_and_evaluate(cfg, workdir, verbose=False)
    assert _snapshot(workdir) == before, change
  with open(os.path.join(workdir, trained_with.SETTINGS_FILE)) as f:
    record = json.load(f)
  assert record == trained_with.as_json(focus.trained_settings(SMALL))
  for name in SMALL.normalizers:  # what a workdir from before the record is checked against
    with open(os.path.join(focus.run_dir(workdir, name), "config.json")) as f:
      assert trained_with.as_json(focus.settings_of_run(json.load(f))) == record


def test_an_older_workdir_is_checked_against_its_runs_and_reruns_with_what_only_measures(
    trained, tmp_path):
  """A workdir without trained_with.json is checked against its runs' config.json; settings
  that only measure the readers (test set, temperatures, which normalizers) re-measure the
  finished readers without training them again."""
  _, workdir = trained
  old = str(tmp_path / "old")
  shutil.copytree(workdir, old, ignore=shutil.ignore_patterns(".lock"))
  if os.path.exists(os.path.join(old, trained_with.SETTINGS_FILE)):
    os.remove(os.path.join(old, trained_with.SETTINGS_FILE))
  with pytest.raises(WorkdirError, match=r"\(seed=0 there, 1 here; recorded in .*runs/"):
    focus.train_and_evaluate(dataclasses.replace(SMALL, seed=1), old, verbose=False)
  assert not os.path.exists(os.path.join(old, trained_with.SETTINGS_FILE))
  params = focus.params_file("sparsemax")
  with open(os.path.join(old, params), "rb") as f:
    trained_params = f.read()
  cfg = dataclasses.replace(SMALL, normalizers=("sparsemax",), temperatures=(1.0,),
                            test_size=100)
  results = focus.train_and_evaluate(cfg, old, verbose=False)
  assert [r["examples"] for r in results["normalizers"]["sparsemax"]["eval"]] == [100]
  with open(os.path.join(old, params), "rb") as f:
    assert f.read() == trained_params  # measured again, not trained again
  with open(os.path.join(old, trained_with.SETTINGS_FILE)) as f:
    assert json.load(f) == trained_with.as_json(focus.trained_settings(SMALL))



@pytest.mark.parametrize("content, why", [
    (b'{"train_size": 20', "JSONDecodeError"), (b'["train_size", 2000]', "a JSON list, not"),
    (b"\xff\xfe", "UnicodeDecodeError")])
def test_a_damaged_trained_with_json_is_refused_in_one_line(tmp_path, content, why):
  """A trained_with.json that cannot be read used to count as no record: the rerun was checked
  against the runs' config.json (here none: anything passed) and rewrote the record."""
  (tmp_path / trained_with.SETTINGS_FILE).write_bytes(content)
  path = re.escape(str(tmp_path / trained_with.SETTINGS_FILE))
  with pytest.raises(WorkdirError, match=rf"^{path}: the record of what this workdir's models "
                     rf"were trained with cannot be read \({why}.*\): delete it to fall back to "
                     r"the runs' configs, or use another --workdir$"):
    trained_with.recorded(str(tmp_path), str(tmp_path / focus.RUNS_DIR), focus.settings_of_run)
  (tmp_path / trained_with.SETTINGS_FILE).unlink()  # deleted: the runs' configs (none here)
  assert trained_with.recorded(str(tmp_path), str(tmp_path / focus.RUNS_DIR),
                               focus.settings_of_run) == []

def test_serve_only_refuses_another_applications_workdir_and_damaged_files_in_one_line(
    trained, tmp_path):
  _, workdir = trained
  translate = tmp_path / "translate"  # a finished translate run (no application.json: older)
  translate.mkdir()
  (translate / "results.json").write_text(json.dumps({"bleu": 30.0, "chrf": 50.0}))
  (translate / "model.json").write_text(json.dumps({"arch": "rnn"}))
  retrieve = tmp_path / "retrieve"
  retrieve.mkdir()
  (retrieve / "application.json").write_text(json.dumps({"application": "retrieve"}))
  (retrieve / "model.json").write_text(json.dumps({"stories": {}, "vocab": [], "model": {}}))
  for wd, held, module in [(translate, "translate", "experiments.translate"),
                           (retrieve, "retrieve", "experiments.retrieve")]:
    with pytest.raises(ConfigError, match=rf"^workdir {wd} holds a {held} run, not a focus one: "
                       rf"serve or inspect it with python -m {module}"):
      focus_server.FocusService.from_workdir(str(wd))
  retrain = "rerun without --serve_only to retrain, or use another --workdir$"
  for damage, name, why in [
      (lambda text: text[:len(text) // 2], focus.MODEL_FILE, "JSONDecodeError"),
      (lambda text: text.replace('"readers"', '"reader"'), focus.MODEL_FILE,
       "no field 'readers'"),
      (None, focus.params_file("sparsemax"), "BadZipFile")]:
    wd = tmp_path / f"damaged_{name}_{why[:4]}"
    shutil.copytree(workdir, wd, ignore=shutil.ignore_patterns(".lock", "runs"))
    path = wd / name
    if damage is None:
      path.write_bytes(path.read_bytes()[:200])
    else:
      path.write_text(damage(path.read_text()))
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))} is damaged or not this "
                       rf"application's \({why}.*\): {retrain}"):
      focus_server.FocusService.from_workdir(str(wd))
  done = _focus_cli(f"--workdir={translate}", "--serve_only", "--port=8")
  assert done.returncode == 2 and done.stderr.startswith("error: "), done.stderr[-2000:]
  assert len(done.stderr.strip().splitlines()) == 1 and "holds a translate run" in done.stderr


@pytest.fixture(scope="module")
def service():
  """A randomly initialized reader behind the service (the API's behaviour, not its accuracy)."""
  sc = stories.StoryConfig(max_sentences=6)
  vocab = stories.Vocab.for_config(sc)
  cfg = focus.FocusConfig(stories=sc, normalizers=("softmax",), dim=8)
  return focus_server.FocusService(sc, vocab, {"softmax": reader.build(cfg.reader_config("softmax",
                                                                                  len(vocab)))})


def test_the_service_reports_unknown_words_and_refuses_what_it_cannot_read(service):
  out = service.read("Mary zorped to the kitchen.\nJohn went to the garden.", "Where is Mary now?")
  assert out["unknown_words"] == ["zorped", "now"] and len(out["weights"]) == 2
  for story, question, t, n, match in [
      ("Mary went to the kitchen.", "  ?", 1, None, "question is empty"),
      ("", "Where is Mary?", 1, None, "story is empty"),
      ("Mary went to the kitchen.", "Where is Mary?", "hot", None, "number"),
      ("Mary went to the kitchen.", "Where is Mary?", 0, None, "must lie in"),
      ("Mary went to the kitchen.", "Where is Mary?", 1, "sparsemax", "not trained"),
      (". ".join(["Mary went to the kitchen"] * 7), "Where is Mary?", 1, None, "at most 6"),
  ]:
    with pytest.raises(focus_server.BadRequest, match=match):
      service.read(story, question, t, n)


def test_the_http_api_answers_400_with_a_json_error_for_an_empty_question(service):
  server = focus_server.make_server(service, "<html>page</html>", port=0)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  base = f"http://127.0.0.1:{server.server_port}"
  try:
    query = urllib.parse.urlencode({"story": "Mary went to the kitchen.", "question": ""})
    with pytest.raises(urllib.error.HTTPError) as err:
      urllib.request.urlopen(f"{base}/api/read?{query}", timeout=30)
    assert err.value.code == 400
    assert "question is empty" in json.loads(err.value.read())["error"]
    query = urllib.parse.urlencode({"story": "Mary went to the kitchen.",
                                    "question": "Where is Mary?", "temperature": "0.5"})
    with urllib.request.urlopen(f"{base}/api/read?{query}", timeout=30) as r:
      body = json.loads(r.read())
    assert body["weights"] == [1.0] and body["temperature"] == 0.5
    with urllib.request.urlopen(f"{base}/", timeout=30) as r:
      assert r.read() == b"<html>page</html>"
  finally:
    server.shutdown()
    server.server_close()


def test_bad_config_values_are_config_errors():
  with pytest.raises(ConfigError, match="unknown normalizer"):
    focus.FocusConfig(normalizers=("softmax", "nope"))
  with pytest.raises(ConfigError, match="temperatures"):
    focus.FocusConfig(temperatures=(0.0,))
  with pytest.raises(ConfigError, match="min_sentences"):
    stories.StoryConfig(min_sentences=5, max_sentences=3)


def _focus_cli(*args):
  return subprocess.run([sys.executable, "-m", "experiments.focus", *args], cwd=REPO,
                        capture_output=True, text=True, timeout=300, check=False)


def test_the_entry_point_trains_what_its_flags_say_and_refuses_bad_ones_in_one_line(tmp_path):
  done = _focus_cli(f"--workdir={tmp_path}", "--normalizers=sparsemax", "--temperatures=0.5,2",
                    "--steps=20", "--train_size=64", "--test_size=16", "--num_samples=2",
                    "--max_sentences=6", "--object_questions=0.5", "--dim=8")
  assert done.returncode == 0, done.stderr[-2000:]
  with open(tmp_path / focus.RESULTS_FILE) as f:
    config = json.load(f)["config"]
  want = focus.FocusConfig(
      stories=stories.StoryConfig(max_sentences=6, object_questions=0.5),
      normalizers=("sparsemax",), temperatures=(0.5, 2.0), steps=20, train_size=64,
      test_size=16, num_samples=2, dim=8)
  assert config == json.loads(json.dumps(dataclasses.asdict(want)))
  for args, message in [(["--normalizers=sparsemax", "--temperatures=0.5,2", "--steps=20",
                         "--train_size=65", "--test_size=16", "--num_samples=2",
                         "--max_sentences=6", "--object_questions=0.5", "--dim=8"],
                        "holds readers trained with other settings (train_size=64 there, 65 "
                        "here; "),
                        (["--serve_only"], "--serve_only needs --port"),
                        (["--temperatures=0.1,hot"], "--temperatures"),
                        (["--normalizers=softmax,nope"], "unknown normalizer")]:
    done = _focus_cli(f"--workdir={tmp_path}", *args)
    assert done.returncode == 2 and done.stderr.startswith("error:"), (args, done.stderr[-2000:])
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


TINY = focus.FocusConfig(
    stories=stories.StoryConfig(max_sentences=6), normalizers=("sparsemax",),
    temperatures=(0.5, 2.0), dim=8, steps=30, train_size=200, test_size=50, num_samples=2)


@pytest.mark.parametrize("steps_per_call,saved", [(1, "13"), (10, "10")])
def test_ctrl_c_saves_the_reader_and_the_rerun_ends_where_an_uninterrupted_demo_does(
    tmp_path, monkeypatch, steps_per_call, saved):
  """Ctrl-C before step 14: one step a call saves step 13; ten a call save the last call's end
  (the interrupt lands before the call of steps 10..19 starts)."""
  from attn.apps.focus import task as focus_task
  run_config = focus.run_config

  def with_steps_per_call(cfg, normalizer):
    config = run_config(cfg, normalizer)
    config.train.steps_per_call = steps_per_call
    return config
  monkeypatch.setattr(focus, "run_config", with_steps_per_call)
  twin = focus.train_and_evaluate(TINY, str(tmp_path / "twin"), verbose=False)
  real = focus_task.FocusTask.train_tokens

  def ctrl_c_before_step_14(self, bundle, tc, step):
    if step == 13:
      raise KeyboardInterrupt
    return real(self, bundle, tc, step)
  monkeypatch.setattr(focus_task.FocusTask, "train_tokens", ctrl_c_before_step_14)
  wd = tmp_path / "demo"
  with pytest.raises(KeyboardInterrupt):
    focus.train_and_evaluate(TINY, str(wd), verbose=False)
  monkeypatch.setattr(focus_task.FocusTask, "train_tokens", real)
  run = wd / focus.RUNS_DIR / "sparsemax"
  assert sorted(n for n in os.listdir(run / "checkpoints") if n.isdigit()) == [saved]
  assert not (wd / focus.RESULTS_FILE).exists() and not (run / "results.json").exists()
  resumed = focus.train_and_evaluate(TINY, str(wd), verbose=False)  # the same command again
  strip = lambda res: {n: {k: v for k, v in r.items() if k != "train_seconds"}
                       for n, r in res["normalizers"].items()}
  assert strip(resumed) == strip(twin)
  assert json.loads((run / "results.json").read_text())["step"] == TINY.steps
  name = focus.params_file("sparsemax")
  with np.load(wd / name) as a, np.load(tmp_path / "twin" / name) as b:
    assert sorted(a.files) == sorted(b.files)
    for key in a.files:
      np.testing.assert_array_equal(a[key], b[key])


def test_a_diverging_reader_is_stopped_by_the_loops_guard_and_no_results_are_written(tmp_path):
  from attn.training import loop
  with pytest.raises(loop.TrainingDiverged, match=r"diverged at step 30: .*"
                     r"train\.learning_rate=1e\+09\. Nothing from this point was saved"):
    focus.train_and_evaluate(dataclasses.replace(TINY, learning_rate=1e9), str(tmp_path),
                             verbose=False)
  assert not (tmp_path / focus.RESULTS_FILE).exists()
  assert not (tmp_path / focus.params_file("sparsemax")).exists()


def test_the_batch_rows_are_the_former_compiled_chunks_draws_and_resume_reads_the_same():
  """Step s draws randint(fold_in(fold_in(fold_in(PRNGKey(seed), 1), c), s - c), (B,), 0, N)
  with c = s // 250 * 250 (the stream of the compiled chunks of 250 steps the demo trained with
  before it used the loop); a run resumed at any step reads the rows from there on."""
  import jax  # pylint: disable=import-outside-toplevel
  from attn.apps.focus import task as focus_task  # pylint: disable=import-outside-toplevel
  seed, B, N = 5, 3, 41
  key = jax.random.fold_in(jax.random.PRNGKey(seed), 1)
  rows = focus_task.batch_rows(N, B, seed, 0)
  got = [next(rows) for _ in range(760)]
  for s in (0, 1, 249, 250, 251, 499, 500, 759):
    c = s // 250 * 250
    want = jax.random.randint(jax.random.fold_in(jax.random.fold_in(key, c), s - c), (B,), 0, N)
    np.testing.assert_array_equal(got[s], want)
  for start in (1, 250, 263):
    resumed = focus_task.batch_rows(N, B, seed, start)
    for s in range(start, 760):
      np.testing.assert_array_equal(next(resumed), got[s])
