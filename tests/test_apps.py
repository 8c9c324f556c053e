"""Applications as units: one registry entry (attn.apps.APPS) makes a new application known to
the training loop, launch.py's listings and metric checks, the results table and the run tools.
The application below is defined and registered in this file alone."""

import json
import os
import subprocess
import sys

import pytest

from attn import apps, training
from attn.launching import entry_points
from attn.training.seq2seq_task import Seq2SeqTask
from attn.training import workdir as workdir_lib
from attn.training.task import missing_members
from experiments.configs import translate as translate_config


def last_word_accuracy(hyps, refs) -> float:
  """Share of outputs whose last word is the reference's (an empty output has none)."""
  hits = [bool(h.split()) and h.split()[-1] == r.split()[-1] for h, r in zip(hyps, refs)]
  return sum(hits) / len(hits)


class LastWordTask(Seq2SeqTask):
  """A task of its own: the built-in copy data, scored by whether the last word is right."""
  scores = ("last_word_accuracy",)
  nested = ()
  metrics = ("last_word_accuracy", "params")
  columns = ("decoder", "params", "last_word_accuracy")

  def score(self, bundle, role, hyps, src_lengths):
    del src_lengths
    refs = bundle.references(role)
    ids = sorted(hyps)
    return {"last_word_accuracy": last_word_accuracy([hyps[i] for i in ids],
                                                     [refs[i] for i in ids])}

  def selection_metrics(self, bundle):
    return ("last_word_accuracy",)


@pytest.fixture
def last_word_app():
  apps.APPS.add("last_word", apps.App("experiments.translate", "the last word, copied",
                                      task=LastWordTask))
  yield "last_word"
  apps.APPS.remove("last_word")


def _config():
  c = translate_config.get_config("smoke")
  c.data.task = "copy"
  c.data.update(dict(min_len=2, max_len=5, task_vocab_size=5, train_size=128, eval_size=16,
                     test_size=16, max_src_len=8, max_tgt_len=8, num_buckets=1, batch_size=32))
  c.model.rnn.update(dict(emb_dim=8, enc_hidden=16, dec_hidden=16, d_attn=16))
  c.train.update(dict(steps=6, learning_rate=1e-2, warmup_steps=2, eval_every=6,
                      checkpoint_every=6, log_every=3, eval_decode_sentences=16))
  return c


# The built-in applications (the one place that names them all; other tests read the registry).
BUILTIN = {"translate", "summarize", "caption", "recommend", "retrieve", "focus"}


def test_the_builtin_applications_are_registered_with_their_tasks():
  assert BUILTIN <= set(apps.APPS.names())
  for name, app in apps.APPS.items():
    assert app.module == f"experiments.{name}"
    # (calling a task's loader, on first use, checks the class against the Task contract)
    assert missing_members(app.task_class, launchable=app.launchable) == [], name
    if app.launchable:  # the task declares its own first score, which no other task reports
      firsts = [a.scores[0] for n, a in apps.APPS.items() if a.launchable and n != name]
      assert app.scores and app.scores[0] not in firsts, name
      assert set(app.metrics) <= set(app.known_metrics + app.nested), name


def test_an_application_registered_in_one_place_trains_lists_and_tabulates(last_word_app,
                                                                            tmp_path):
  assert isinstance(training.get_task(last_word_app), LastWordTask)
  assert last_word_app in entry_points.EXPERIMENTS.names()
  assert entry_points.metrics(last_word_app) == ("last_word_accuracy", "params")
  with pytest.raises(Exception, match="bleu is not in a last_word run's results"):
    entry_points.metrics(last_word_app, ["bleu"])

  workdir = str(tmp_path)
  results = training.train_and_evaluate(_config(), workdir, task=last_word_app)
  assert "bleu" not in results  # the task's own scores, not translation's
  with open(os.path.join(workdir, "predictions.txt"), encoding="utf-8") as f:
    hyps = f.read().splitlines()
  run = training.load_run(workdir, task=last_word_app)
  refs = run.bundle.references(results["split"])
  assert len(hyps) == len(refs) == 16
  assert results["last_word_accuracy"] == pytest.approx(last_word_accuracy(hyps, refs))
  with open(os.path.join(workdir, "results.json"), encoding="utf-8") as f:
    assert json.load(f)["last_word_accuracy"] == results["last_word_accuracy"]
  with open(os.path.join(workdir, "application.json"), encoding="utf-8") as f:
    assert json.load(f) == {"application": last_word_app}  # the workdir is bound to it

  # The run tools recognise the run by its task's scores; the table has the task's columns.
  assert entry_points.experiment_of(workdir) == last_word_app
  table = training.results_table([results])
  assert table.splitlines()[0].split("|")[1:-1] == [
      f" {c} " for c in ("decoder", "params", "last_word_accuracy")]


def test_an_unknown_application_is_one_line_naming_the_known_ones():
  with pytest.raises(Exception, match=f"unknown application 'nope'; known: "
                     f"{', '.join(apps.APPS.names())}$"):
    training.get_task("nope")


@pytest.mark.parametrize("name,results_file", [("retrieve", "retrieve.json"),
                                               ("focus", "focus.json")])
@pytest.mark.parametrize("tool", ["inspect", "diagnose"])
def test_the_run_tools_name_a_run_of_an_application_they_do_not_read(tmp_path, name,
                                                                     results_file, tool):
  (tmp_path / results_file).write_text("{}")
  (tmp_path / "model.json").write_text("{}")
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  p = subprocess.run([sys.executable, "-m", f"experiments.{tool}", f"--workdir={tmp_path}"],
                     cwd=repo, capture_output=True, text=True, timeout=300)
  lines = p.stderr.strip().splitlines()
  assert p.returncode == 2 and len(lines) == 1, p.stderr[-2000:]
  assert f"holds a {name} run ({results_file}" in lines[0], lines
  assert f"python -m experiments.{name} --help" in lines[0], lines
  assert sorted(os.listdir(tmp_path)) == sorted(["model.json", results_file])  # nothing written


_FOREIGN_RECORDS = [
    ({"application.json": {"application": "caption"}}, "caption"),
    # a run written before application.json: its finished results name it
    ({"results.json": {"hr10": 0.5, "ndcg10": 0.3}}, "recommend"),
    ({"metrics.jsonl": {"split": "eval", "step": 10, "digit_accuracy": 0.5}}, "caption"),
    ({"retrieve.json": {}, "model.json": {}}, "retrieve"),
]
_ENTRY_POINTS = [("experiments.translate", "experiments/configs/translate.py:smoke"),
                 ("experiments.recommend", "experiments/configs/recommend.py:tiny")]


@pytest.mark.parametrize("records,held,module,preset", [
    (records, held, module, preset) for records, held in _FOREIGN_RECORDS
    for module, preset in _ENTRY_POINTS if not module.endswith(held)])
def test_a_workdir_of_another_application_is_refused_before_anything_is_written(
    tmp_path, records, held, module, preset):
  for name, record in records.items():
    (tmp_path / name).write_text(json.dumps(record))
  before = sorted(os.listdir(tmp_path))
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  p = subprocess.run([sys.executable, "-m", module, f"--config={preset}",
                      f"--workdir={tmp_path}"], cwd=repo, capture_output=True, text=True,
                     timeout=300)
  lines = p.stderr.strip().splitlines()
  assert p.returncode == 2 and len(lines) == 1, p.stderr[-2000:]
  assert f"holds a {held} run; a {module.split('.')[1]} run would overwrite its files" in lines[0]
  assert sorted(os.listdir(tmp_path)) == before  # no data cache, vocabulary or record written


@pytest.mark.parametrize("text,wrong", [
    ('["translate"]', "holds a JSON list, not an object naming the application"),
    ('"translate"', "holds a JSON string, not an object naming the application"),
    ('{"application": ', "is not valid JSON"),
    ('{"app": "translate"}', "has no application name (application=None)"),
])
def test_a_broken_application_record_is_one_line_naming_the_file(tmp_path, text, wrong):
  # Before: a list or string raised AttributeError ('list' object has no attribute 'get') in
  # every training entry point; invalid JSON was taken as no record and overwritten.
  (tmp_path / "application.json").write_text(text)
  path = str(tmp_path / "application.json")
  with pytest.raises(workdir_lib.WorkdirError) as e:
    workdir_lib.claim(str(tmp_path), "translate")
  assert str(e.value).startswith(f"{path} {wrong}"), e.value
  assert os.listdir(tmp_path) == ["application.json"]
  assert (tmp_path / "application.json").read_text() == text  # left as it was


def test_a_list_in_application_json_ends_the_entry_point_in_one_line(tmp_path):
  (tmp_path / "application.json").write_text("[]")
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  p = subprocess.run([sys.executable, "-m", "experiments.translate",
                      "--config=experiments/configs/translate.py:smoke", f"--workdir={tmp_path}"],
                     cwd=repo, capture_output=True, text=True, timeout=300)
  lines = p.stderr.strip().splitlines()
  assert p.returncode == 2 and len(lines) == 1, p.stderr[-2000:]
  assert lines[0] == (f"error: {tmp_path / 'application.json'} holds a JSON list, not an object "
                      'naming the application, {"application": "<name>"}: fix it, or delete it '
                      "if the workdir holds no run")
  assert os.listdir(tmp_path) == ["application.json"]


@pytest.mark.parametrize("module", ["experiments.retrieve", "experiments.focus"])
def test_retrieve_and_focus_refuse_a_finished_translate_run(tmp_path, module):
  """A sweep given a translate run's workdir stops before writing (it used to overwrite the
  run's model.json, and the run then resumed into an orbax traceback)."""
  (tmp_path / "results.json").write_text(json.dumps({"bleu": 30.0, "chrf": 50.0}))
  (tmp_path / "model.json").write_text(json.dumps({"arch": "rnn"}))
  before = {n: (tmp_path / n).read_text() for n in os.listdir(tmp_path)}
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  p = subprocess.run([sys.executable, "-m", module, f"--workdir={tmp_path}", "--steps=2"],
                     cwd=repo, capture_output=True, text=True, timeout=300)
  lines = p.stderr.strip().splitlines()
  assert p.returncode == 2 and len(lines) == 1, p.stderr[-2000:]
  assert "holds a translate run" in lines[0], lines
  assert {n: (tmp_path / n).read_text() for n in os.listdir(tmp_path)} == before


@pytest.mark.parametrize("app,field,value", [
    # slow: one more recommend run; num_users pins the same refusal
    pytest.param("recommend", "seed", 7, marks=pytest.mark.slow),
    ("recommend", "num_users", 123),
    # slow: a caption run; recommend's pins the refusal fast
    pytest.param("caption", "distractor_rate", 0.5, marks=pytest.mark.slow)])
def test_a_resumed_run_with_other_data_settings_is_refused(tmp_path, app, field, value):
  """recommend and caption generate their data from the data section: a resumed run with other
  settings would train the checkpoints on other data (translate refuses it through its
  vocabularies' record)."""
  import importlib
  presets = importlib.import_module(f"experiments.configs.{app}")
  config = presets.get_config("tiny")
  config.train.update(dict(steps=2, checkpoint_every=1, eval_every=2, log_every=1))
  training.train_and_evaluate(config, str(tmp_path), task=app)
  recorded = json.loads((tmp_path / "config.json").read_text())["data"]
  assert recorded[field] != value
  config.train.steps = 3
  config.data[field] = value
  with pytest.raises(Exception, match=rf"data.{field}={value!r} differs from the run being "
                     "resumed"):
    training.train_and_evaluate(config, str(tmp_path), task=app)
  config.data[field] = type(value)(recorded[field])
  config.data.batch_size = config.data.batch_size + 1  # the batch size may change
  assert training.train_and_evaluate(config, str(tmp_path), task=app)["step"] == 3
