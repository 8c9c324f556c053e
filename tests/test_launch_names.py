"""launch.py's tables: the experiment's own default metrics, misspelled --metrics refused before
anything runs, and run names (directories, table rows) that stay apart when two axes share a
field name. In-process launches with the fake experiment of tests/test_launch.py."""

import json
import types

import pytest

import launch
from attn.launching import cli, entry_points, sweeps
from test_launch import fake, sweep  # noqa: F401  pylint: disable=unused-import

SUMMARIZE = "--config=experiments/configs/summarize.py:smoke"
TRANSFORMER = "--config=experiments/configs/translate.py:demo_transformer"
ROLES = ["--vary=model.transformer.enc_self.normalizer=sparsemax",
         "--vary=model.transformer.cross.normalizer=sparsemax"]


def summarize_sweep(monkeypatch, workdir, *args):
  """launch of the summarize experiment. Its module is not imported: each experiment module
  defines --config on absl's FLAGS, once per process (translate's tests import theirs); a
  stand-in with its validate_config checks the configs as the module would."""
  module = types.SimpleNamespace(__name__="experiments.summarize",
                                 validate_config=cli.training_entry_point("summarize")[0])
  monkeypatch.setattr(entry_points, "load_experiment", lambda name: module)
  return sweeps.launch(launch.parse_args(["launch.py", "--experiment=summarize", SUMMARIZE,
                                          f"--workdir={workdir}", *args]), ["launch.py"])


def test_summarize_is_tabulated_and_plotted_with_rouge_by_default(tmp_path, fake, monkeypatch):
  # Before: the table had translation's columns (bleu, exact_match), all empty, and no plot.
  scores = {"rouge1": 31.5, "rouge2": 12.25, "rougeL": 30.0, "params": 1234,
            "tokens_per_sec": 99.0, "wall_s": 3.0}
  fake.outcome = {n: (0, json.dumps(scores)) for n in ("score=additive", "score=general")}
  assert summarize_sweep(monkeypatch, tmp_path, "--sweep=model.rnn.score=additive,general") == 0
  md = (tmp_path / "results.md").read_text()
  assert "| run | rouge1 | rouge2 | rougeL | params | tokens_per_sec | wall_s |" in md
  assert "| score=general | 31.500 | 12.250 | 30.000 | 1,234 |" in md
  assert "bleu" not in md and (tmp_path / "results.png").stat().st_size > 1000
  assert entry_points.metrics("translate") == ("bleu", "exact_match", "params",
                                               "tokens_per_sec", "wall_s")


@pytest.mark.parametrize("experiment,config,metrics,bad", [
    ("summarize", SUMMARIZE, "rouge1,rogue2", "rogue2 is"),
    ("translate", "--config=experiments/configs/translate.py:smoke", "blue,exact_match,wal_s",
     "blue, wal_s are"),
    ("translate", "--config=experiments/configs/translate.py:smoke", "rouge1", "rouge1 is"),
    # a dotted name walks into a nested field only: bleu is a number, exact_match_by_src_lenn
    # is misspelled
    ("translate", "--config=experiments/configs/translate.py:smoke",
     "bleu.10-19,exact_match_by_src_len.10-19,exact_match_by_src_lenn.0-9",
     "bleu.10-19, exact_match_by_src_lenn.0-9 are")])
def test_a_misspelled_metric_is_one_line_before_anything_runs(tmp_path, fake, capsys, experiment,
                                                              config, metrics, bad):
  # Before: an empty column, after every run had trained.
  with pytest.raises(SystemExit) as exit_:
    launch.main(launch.parse_args(["launch.py", f"--experiment={experiment}", config,
                                   f"--workdir={tmp_path}", f"--metrics={metrics}",
                                   "--sweep=model.rnn.score=additive,general"]))
  assert exit_.value.code == 2 and fake.calls == []
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1, err
  assert err[0].startswith(f"error: --metrics={metrics}: {bad} not in a {experiment} run's "
                           "results; known: "), err
  exp = entry_points.EXPERIMENTS.get(experiment)
  known, _, nested = err[0].split("known: ")[1].partition("; nested (whole, or <field>.<key> "
                                                          "for one entry): ")
  assert known.split(", ") == list(exp.known_metrics)
  assert (nested.split(", ") if nested else []) == list(exp.nested)
  assert set(entry_points.metrics(experiment)) <= set(known.split(", "))
  assert list(tmp_path.iterdir()) == []


def test_labels_are_the_shortest_unambiguous_suffixes():
  assert sweeps.labels(["model.rnn.decoder", "model.rnn.score"]) == {
      "model.rnn.decoder": "decoder", "model.rnn.score": "score"}
  assert sweeps.labels(["model.transformer.enc_self.normalizer", "model.rnn.decoder",
                        "model.transformer.cross.normalizer", "a.b", "c.a.b"]) == {
      "model.transformer.enc_self.normalizer": "enc_self.normalizer",
      "model.transformer.cross.normalizer": "cross.normalizer", "model.rnn.decoder": "decoder",
      "a.b": "a.b", "c.a.b": "c.a.b"}
  runs = sweeps.grid(["model.transformer.enc_self.normalizer=softmax,sparsemax",
                      "model.transformer.cross.normalizer=softmax,sparsemax"])
  assert runs[1][0] == "enc_self.normalizer=softmax,cross.normalizer=sparsemax"
  with pytest.raises(sweeps.ConfigError, match="--sweep model.rnn.score is given twice"):
    sweeps.grid(["model.rnn.score=dot", "model.rnn.score=general"])


def test_vary_over_one_field_in_two_roles_gets_two_run_dirs_and_labels(tmp_path, fake, capsys):
  # Before: both runs got the directory normalizer=sparsemax; the second refused the first's
  # launch.json, the table had two identical "normalizer=sparsemax" rows, reruns refused forever.
  rc, _, err = sweep(tmp_path, TRANSFORMER, *ROLES, capsys=capsys)
  assert rc == 0, err
  names = ["base", "enc_self.normalizer=sparsemax", "cross.normalizer=sparsemax"]
  assert fake.calls == names
  for name, key in zip(names[1:], ("enc_self", "cross")):
    rec = json.loads((tmp_path / name / "launch.json").read_text())
    assert rec["exit_code"] == 0
    assert rec["overrides"] == {f"model.transformer.{key}.normalizer": "sparsemax"}
  md = (tmp_path / "results.md").read_text()
  assert all(md.count(f"| {n} |") == 1 for n in names), md
  rc, out, _ = sweep(tmp_path, TRANSFORMER, *ROLES, capsys=capsys)  # a rerun reuses both
  assert rc == 0 and out.count("finished before") == 3 and len(fake.calls) == 3
  # alone, a role's field keeps its short name; the seed keeps its plain one
  runs = sweeps.plan("translate", None, "w", [], [], [0], [ROLES[0][len("--vary="):]])
  assert [r.name for r in runs] == ["base,seed=0", "normalizer=sparsemax,seed=0"]
