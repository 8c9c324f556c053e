"""launch.py: grid expansion, commands, tables, config checks before anything runs, run records
(reuse, refusal, failures), and one real (tiny) sweep end to end.

Most tests drive `launch.launch` in-process with `subprocess.call` replaced by a fake experiment
that writes results.json (or not) and returns an exit status, so they train nothing; the config
checks are real (the smoke preset, the translate experiment's validate_config).
"""

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

import launch
from attn.errors import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = "--config=experiments/configs/translate.py:smoke"


def test_grid_is_the_cartesian_product_with_readable_names():
  runs = launch.grid(["model.decoder=none,bahdanau", "model.score=dot,additive,general"])
  assert len(runs) == 6
  assert runs[0] == ("decoder=none,score=dot", [("model.decoder", "none"), ("model.score", "dot")])
  assert launch.grid([]) == [("run", [])]


def test_bad_axis_is_a_config_error():
  with pytest.raises(ConfigError, match="key=value"):
    launch.parse_axis("model.decoder")


def test_command_passes_overrides_as_config_flags():
  cmd = launch.command("translate", "c.py:demo", "/w/x", [("model.decoder", "none")])
  assert cmd[1:] == ["-m", "experiments.translate", "--workdir=/w/x", "--config=c.py:demo",
                     "--config.model.decoder=none"]


def test_table_marks_failed_runs():
  table = launch.results_table([("a", {"bleu": 1.5, "params": 10}), ("b", None)], ["bleu", "params"])
  assert "| a | 1.500 | 10 |" in table and "| b | failed | failed |" in table


# ---------------------------------------------------------------------------------------------
# in-process launches with a fake experiment


@pytest.fixture
def fake(monkeypatch):
  """Replaces the experiment subprocess. `fake.outcome[name] = (exit status, results.json text or
  None)` for the run named `name` (default: exit 0 and a complete record). `fake.calls`: the names
  of the runs started, in order."""
  monkeypatch.chdir(REPO)  # the config path is relative, as on the command line

  class Fake:
    calls = []
    outcome = {}

    @staticmethod
    def call(cmd):
      wd = next(a.split("=", 1)[1] for a in cmd if a.startswith("--workdir="))
      name = os.path.basename(wd)
      overrides = dict(a[len("--config."):].split("=", 1) for a in cmd if a.startswith("--config."))
      Fake.calls.append(name)
      rc, text = Fake.outcome.get(name, (0, json.dumps({"bleu": 1.0, **overrides})))
      os.makedirs(wd, exist_ok=True)
      if text is not None:
        with open(os.path.join(wd, "results.json"), "w") as f:
          f.write(text)
      return rc

  monkeypatch.setattr(launch.subprocess, "call", Fake.call)
  return Fake


def sweep(workdir, *args, capsys=None):
  """launch's exit status (and its stdout, stderr when capsys is given) for these flags."""
  rc = launch.launch(launch.parse_args(["launch.py", "--experiment=translate", SMOKE,
                                        f"--workdir={workdir}", *args]), argv=["launch.py"])
  if capsys is None:
    return rc
  out, err = capsys.readouterr()
  return rc, out, err


def test_rerun_skips_finished_runs_and_records_the_command(tmp_path, fake, capsys):
  assert sweep(tmp_path, "--sweep=model.decoder=none,luong", "--set=model.score=dot") == 0
  assert fake.calls == ["decoder=none", "decoder=luong"]
  rec = json.loads((tmp_path / "decoder=luong" / "launch.json").read_text())
  assert rec["overrides"] == {"model.score": "dot", "model.decoder": "luong"}
  assert rec["exit_code"] == 0 and "--config.model.decoder=luong" in rec["command"]
  capsys.readouterr()
  rc, out, _ = sweep(tmp_path, "--sweep=model.decoder=none,luong", "--set=model.score=dot",
                     capsys=capsys)
  assert rc == 0 and fake.calls == ["decoder=none", "decoder=luong"]  # nothing ran again
  assert out.count("finished before") == 2


def test_rerun_with_other_overrides_is_refused_not_reused(tmp_path, fake, capsys):
  # Before: the changed --set ran nothing and printed the old numbers under the new command.
  assert sweep(tmp_path, "--sweep=model.decoder=none,luong", "--set=model.score=dot") == 0
  before = (tmp_path / "decoder=none" / "results.json").read_text()
  capsys.readouterr()
  rc, out, _ = sweep(tmp_path, "--sweep=model.decoder=none,luong,bahdanau",
                     "--set=model.score=general", capsys=capsys)
  assert rc == 1
  assert fake.calls == ["decoder=none", "decoder=luong", "decoder=bahdanau"]  # the new one ran
  refused = [l for l in out.splitlines() if "refused" in l]
  assert len(refused) == 2
  assert all("model.score: dot -> general" in l and "new --workdir" in l for l in refused)
  assert "| decoder=none | failed" in out and "| decoder=luong | failed" in out
  assert "| decoder=bahdanau | 1.000" in out
  assert (tmp_path / "decoder=none" / "results.json").read_text() == before  # not clobbered


def test_a_run_dir_launch_did_not_start_is_refused(tmp_path, fake, capsys):
  (tmp_path / "decoder=none").mkdir()
  (tmp_path / "decoder=none" / "results.json").write_text('{"bleu": 9.0}')
  rc, out, _ = sweep(tmp_path, "--sweep=model.decoder=none,luong", capsys=capsys)
  assert rc == 1 and fake.calls == ["decoder=luong"]
  assert "decoder=none: refused" in out and "no launch.json" in out


def test_a_run_that_exits_non_zero_is_failed_even_with_results_json(tmp_path, fake, capsys):
  # Before: it crashed after writing results.json and the table showed it as a success, exit 0.
  fake.outcome["decoder=luong"] = (1, json.dumps({"bleu": 5.0}))
  rc, out, _ = sweep(tmp_path, "--sweep=model.decoder=none,luong", capsys=capsys)
  assert rc == 1
  assert "decoder=luong: failed (exit status 1)" in out and "| decoder=luong | failed" in out
  assert "| decoder=none | 1.000" in out
  del fake.outcome["decoder=luong"]
  assert sweep(tmp_path, "--sweep=model.decoder=none,luong") == 0  # the failed one runs again
  assert fake.calls == ["decoder=none", "decoder=luong", "decoder=luong"]


@pytest.mark.parametrize("after", ["fixed", "still_truncated"])
def test_unreadable_results_json_is_rerun_not_a_traceback(tmp_path, fake, capsys, after):
  # Before: json.load raised JSONDecodeError and the whole sweep ended with a traceback.
  assert sweep(tmp_path, "--sweep=model.decoder=none,luong") == 0
  (tmp_path / "decoder=luong" / "results.json").write_text('{"bleu": 1.')
  if after == "still_truncated":
    fake.outcome["decoder=luong"] = (0, '{"bleu": 1.')
  capsys.readouterr()
  rc, out, _ = sweep(tmp_path, "--sweep=model.decoder=none,luong", capsys=capsys)
  assert fake.calls == ["decoder=none", "decoder=luong", "decoder=luong"]
  assert re.search(r"decoder=luong: .*results\.json is unreadable .*: not finished; running it "
                   r"again", out)
  if after == "fixed":
    assert rc == 0 and "| decoder=luong | 1.000" in out
  else:
    assert rc == 1 and "failed: " in out and "| decoder=luong | failed" in out


@pytest.mark.parametrize("args,message", [
    (["--sweep=model.decoder=none,bahdanau", "--sweep=model.score=additive,dot"],
     r"^error: decoder=bahdanau,score=dot: model\.score='dot' does not fit decoder 'bahdanau'"),
    (["--set=model.decodr=none"],
     r"^error: --config\.model\.decodr: the config has no such field \(Did you mean \"decoder\""),
    (["--sweep=model.decoder=none,bahdanu"],
     r"^error: decoder=bahdanu: model\.decoder: unknown decoder 'bahdanu'"),
    (["--set=model.emb_dim=big"], r"^error: flag --config\.model\.emb_dim=big: invalid literal"),
    (["--set=train.steps=0"], r"^error: train\.steps=0 must be >= 1"),
])
@pytest.mark.parametrize("dry_run", [False, True])
def test_bad_combinations_fail_before_anything_runs(tmp_path, fake, capsys, args, message,
                                                    dry_run):
  # Before: launch started the good runs and each bad one crashed in its own subprocess.
  rc, out, err = sweep(tmp_path, *args, *(["--dry_run"] if dry_run else []), capsys=capsys)
  assert rc == 2 and fake.calls == [] and "[1/" not in out
  lines = err.strip().splitlines()
  assert len(lines) == 1 and re.search(message, lines[0]), err
  assert not (tmp_path / "results.md").exists()


def test_launch_usage_errors_are_one_line(tmp_path, fake, capsys):
  for args, message in [(["--sweep=model.decoder"], "--sweep/--set expects key=value"),
                        (["--config=experiments/configs/nothere.py:smoke"],
                         "--config=experiments/configs/nothere.py:smoke: no file"),
                        (["--experiment=transalte"], "there is no experiments/transalte.py; "
                                                     "known: bench_kernel")]:
    with pytest.raises(SystemExit) as exit_:
      launch.main(launch.parse_args(["launch.py", SMOKE, f"--workdir={tmp_path}", *args]))
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
  assert fake.calls == []


def test_launch_cli_error_is_one_line_without_traceback(tmp_path):
  # Before: a bad --sweep printed absl's usage (the whole docstring) and exited 1; an unknown
  # --experiment ran the subprocess, which failed with a traceback.
  p = subprocess.run([sys.executable, "launch.py", "--experiment=transalte", SMOKE,
                      f"--workdir={tmp_path}"], cwd=REPO, capture_output=True, text=True,
                     timeout=300)
  lines = p.stderr.strip().splitlines()
  assert p.returncode == 2 and len(lines) == 1, p.stderr[-3000:]
  assert lines[0].startswith("error: --experiment=transalte: there is no experiments/transalte.py")


def docstring_examples(doc):
  """The argument lists of every `python launch.py ...` command in `doc` (continuations joined)."""
  text = doc.replace("\\\n", " ")
  return [shlex.split(line.strip())[2:] for line in text.splitlines()
          if line.strip().startswith("python launch.py")]


def test_docstring_examples_are_valid_configs(monkeypatch):
  # Before: the grid example swept score=dot with the Bahdanau decoder, which cannot use it.
  monkeypatch.chdir(REPO)
  examples = docstring_examples(launch.__doc__)
  assert len(examples) >= 2
  for args in examples:
    opts = launch.parse_args(["launch.py", *args])
    runs = launch.plan(opts.experiment, opts.config, opts.workdir, opts.set, opts.sweep)
    assert launch.check_configs(launch.load_experiment(opts.experiment), opts.config, runs) == [], \
        args


def test_a_sweep_runs_each_combination_and_writes_table_and_plot(tmp_path):
  cmd = [sys.executable, "launch.py", "--experiment=translate", SMOKE, f"--workdir={tmp_path}",
         "--sweep=model.decoder=none,luong"]
  p = subprocess.run(cmd + ["--set=model.score=dot"], cwd=REPO, capture_output=True, text=True,
                     timeout=600)
  assert p.returncode == 0, p.stderr[-3000:]
  for name in ("decoder=none", "decoder=luong"):
    res = json.loads((tmp_path / name / "results.json").read_text())
    assert res["decoder"] == name.split("=")[1] and res["score"] == "dot"
    assert json.loads((tmp_path / name / "launch.json").read_text())["exit_code"] == 0
  md = (tmp_path / "results.md").read_text()
  assert "| decoder=none |" in md and "| decoder=luong |" in md
  assert (tmp_path / "results.png").stat().st_size > 1000
  # The same sweep with another --set trains nothing: both runs are refused, exit 1.
  p = subprocess.run(cmd + ["--set=model.score=general"], cwd=REPO, capture_output=True,
                     text=True, timeout=600)
  assert p.returncode == 1, p.stderr[-3000:]
  assert p.stdout.count("model.score: dot -> general") == 2 and "Traceback" not in p.stderr
