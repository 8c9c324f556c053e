"""launch.py and attn/launching (sweeps, rundirs, report, entry_points): grid expansion, commands, tables, config checks before anything runs, run records
(reuse, refusal, failures), --parallel, --seeds (mean ± std tables), --launcher=slurm and
--collect, and two real (tiny) sweeps end to end: one local, one through the Slurm array script.

Most tests drive `sweeps.launch` in-process with `subprocess.call` replaced by a fake experiment
that writes results.json (or not) and returns an exit status, so they train nothing; the config
checks are real (the smoke preset, the translate experiment's validate_config). The Slurm tests put
a fake `sbatch` on PATH that records what it was given and, end to end, runs the array's tasks.
"""

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time

import pytest

import launch
from attn.launching import entry_points, launchers, report, rundirs, sweeps
from attn.training.results import results_table
from attn.errors import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = "--config=experiments/configs/translate.py:smoke"


def test_grid_is_the_cartesian_product_with_readable_names():
  runs = sweeps.grid(["model.decoder=none,bahdanau", "model.score=dot,additive,general"])
  assert len(runs) == 6
  assert runs[0] == ("decoder=none,score=dot", [("model.decoder", "none"), ("model.score", "dot")])
  assert sweeps.grid([]) == [("run", [])]


def test_vary_is_one_factor_at_a_time_from_a_shared_base():
  runs = sweeps.plan("translate", "c.py:x", "w", ["train.steps=5"],
                     [], [0, 1], ["model.num_heads=1,8", "model.dropout=0.3"])
  assert [r.name for r in runs] == [f"{n},seed={s}" for n in
                                    ("base", "num_heads=1", "num_heads=8", "dropout=0.3")
                                    for s in (0, 1)]
  by_name = {r.name: r.overrides for r in runs}
  assert by_name["base,seed=1"] == (("train.steps", "5"), ("train.seed", "1"))
  assert by_name["dropout=0.3,seed=0"] == (("train.steps", "5"), ("model.dropout", "0.3"),
                                           ("train.seed", "0"))
  with pytest.raises(ConfigError, match="do not combine"):
    sweeps.plan("translate", None, "w", [], ["model.score=dot"], [], ["model.dropout=0.3"])
  with pytest.raises(ConfigError, match="given twice"):
    sweeps.one_at_a_time(["model.dropout=0", "model.dropout=0.3"])


def test_bad_axis_is_a_config_error():
  with pytest.raises(ConfigError, match="key=value"):
    sweeps.parse_axis("model.rnn.decoder")


def test_command_passes_overrides_as_config_flags():
  cmd = sweeps.command("translate", "c.py:demo", "/w/x", [("model.rnn.decoder", "none")])
  assert cmd[1:] == ["-m", "experiments.translate", "--workdir=/w/x", "--config=c.py:demo",
                     "--config.model.rnn.decoder=none"]


def test_table_marks_failed_runs():
  table = results_table([("a", {"bleu": 1.5, "params": 10}), ("b", None)], ["bleu", "params"])
  assert "| a | 1.500 | 10 |" in table and "| b | failed | failed |" in table


# ---------------------------------------------------------------------------------------------
# in-process launches with a fake experiment


@pytest.fixture
def fake(monkeypatch):
  """Replaces the experiment subprocess. `fake.outcome[name] = (exit status, results.json text or
  None)` for the run named `name` (default: exit 0 and a complete record); `fake.delay[name]`:
  seconds it takes. `fake.calls`: the names of the runs started, in order; `fake.peak`: the most
  running at once. A run's output ("output of <name>") goes where launch sends it."""
  monkeypatch.chdir(REPO)  # the config path is relative, as on the command line

  class Fake:
    calls = []
    outcome = {}
    delay = {}
    running = peak = 0
    lock = threading.Lock()

    @staticmethod
    def call(cmd, stdout=None, stderr=None):  # pylint: disable=unused-argument
      wd = next(a.split("=", 1)[1] for a in cmd if a.startswith("--workdir="))
      name = os.path.basename(wd)
      overrides = dict(a[len("--config."):].split("=", 1) for a in cmd if a.startswith("--config."))
      with Fake.lock:
        Fake.calls.append(name)
        Fake.running += 1
        Fake.peak = max(Fake.peak, Fake.running)
      time.sleep(Fake.delay.get(name, 0))
      (stdout or sys.stdout).write(f"output of {name}\n")
      rc, text = Fake.outcome.get(name, (0, json.dumps({"bleu": 1.0, **overrides})))
      os.makedirs(wd, exist_ok=True)
      if text is not None:
        with open(os.path.join(wd, "results.json"), "w") as f:
          f.write(text)
      with Fake.lock:
        Fake.running -= 1
      return rc

  monkeypatch.setattr(launchers.subprocess, "call", Fake.call)
  monkeypatch.setattr(launchers, "call_stopping_as_ctrl_c", Fake.call)  # a Slurm task's call
  return Fake


def sweep(workdir, *args, capsys=None):
  """launch's exit status (and its stdout, stderr when capsys is given) for these flags."""
  rc = sweeps.launch(launch.parse_args(["launch.py", "--experiment=translate", SMOKE,
                                        f"--workdir={workdir}", *args]), ["launch.py"])
  if capsys is None:
    return rc
  out, err = capsys.readouterr()
  return rc, out, err


def test_rerun_skips_finished_runs_and_records_the_command(tmp_path, fake, capsys):
  assert sweep(tmp_path, "--sweep=model.rnn.decoder=none,luong", "--set=model.rnn.score=dot") == 0
  assert fake.calls == ["decoder=none", "decoder=luong"]
  rec = json.loads((tmp_path / "decoder=luong" / "launch.json").read_text())
  assert rec["overrides"] == {"model.rnn.score": "dot", "model.rnn.decoder": "luong"}
  assert rec["exit_code"] == 0 and "--config.model.rnn.decoder=luong" in rec["command"]
  capsys.readouterr()
  rc, out, _ = sweep(tmp_path, "--sweep=model.rnn.decoder=none,luong", "--set=model.rnn.score=dot",
                     capsys=capsys)
  assert rc == 0 and fake.calls == ["decoder=none", "decoder=luong"]  # nothing ran again
  assert out.count("finished before") == 2


def test_rerun_with_other_overrides_is_refused_not_reused(tmp_path, fake, capsys):
  # Before: the changed --set ran nothing and printed the old numbers under the new command.
  assert sweep(tmp_path, "--sweep=model.rnn.decoder=none,luong", "--set=model.rnn.score=dot") == 0
  before = (tmp_path / "decoder=none" / "results.json").read_text()
  capsys.readouterr()
  rc, out, _ = sweep(tmp_path, "--sweep=model.rnn.decoder=none,luong,bahdanau",
                     "--set=model.rnn.score=general", capsys=capsys)
  assert rc == 1
  assert fake.calls == ["decoder=none", "decoder=luong", "decoder=bahdanau"]  # the new one ran
  refused = [l for l in out.splitlines() if "refused" in l]
  assert len(refused) == 2
  assert all("model.rnn.score: dot -> general" in l and "new --workdir" in l for l in refused)
  assert "| decoder=none | failed" in out and "| decoder=luong | failed" in out
  assert "| decoder=bahdanau | 1.000" in out
  assert (tmp_path / "decoder=none" / "results.json").read_text() == before  # not clobbered


def test_a_run_dir_launch_did_not_start_is_refused(tmp_path, fake, capsys):
  (tmp_path / "decoder=none").mkdir()
  (tmp_path / "decoder=none" / "results.json").write_text('{"bleu": 9.0}')
  rc, out, _ = sweep(tmp_path, "--sweep=model.rnn.decoder=none,luong", capsys=capsys)
  assert rc == 1 and fake.calls == ["decoder=luong"]
  assert "decoder=none: refused" in out and "no launch.json" in out


def test_a_run_that_exits_non_zero_is_failed_even_with_results_json(tmp_path, fake, capsys):
  # Before: it crashed after writing results.json and the table showed it as a success, exit 0.
  fake.outcome["decoder=luong"] = (1, json.dumps({"bleu": 5.0}))
  rc, out, _ = sweep(tmp_path, "--sweep=model.rnn.decoder=none,luong", capsys=capsys)
  assert rc == 1
  assert "decoder=luong: failed (exit status 1)" in out and "| decoder=luong | failed" in out
  assert "| decoder=none | 1.000" in out
  del fake.outcome["decoder=luong"]
  assert sweep(tmp_path, "--sweep=model.rnn.decoder=none,luong") == 0  # the failed one runs again
  assert fake.calls == ["decoder=none", "decoder=luong", "decoder=luong"]


@pytest.mark.parametrize("after", ["fixed", "still_truncated"])
def test_unreadable_results_json_is_rerun_not_a_traceback(tmp_path, fake, capsys, after):
  # Before: json.load raised JSONDecodeError and the whole sweep ended with a traceback.
  assert sweep(tmp_path, "--sweep=model.rnn.decoder=none,luong") == 0
  (tmp_path / "decoder=luong" / "results.json").write_text('{"bleu": 1.')
  if after == "still_truncated":
    fake.outcome["decoder=luong"] = (0, '{"bleu": 1.')
  capsys.readouterr()
  rc, out, _ = sweep(tmp_path, "--sweep=model.rnn.decoder=none,luong", capsys=capsys)
  assert fake.calls == ["decoder=none", "decoder=luong", "decoder=luong"]
  assert re.search(r"decoder=luong: .*results\.json is unreadable .*: not finished; running it "
                   r"again", out)
  if after == "fixed":
    assert rc == 0 and "| decoder=luong | 1.000" in out
  else:
    assert rc == 1 and "failed: " in out and "| decoder=luong | failed" in out


@pytest.mark.parametrize("args,message", [
    (["--sweep=model.rnn.decoder=none,bahdanau", "--sweep=model.rnn.score=additive,dot"],
     r"^error: decoder=bahdanau,score=dot: model\.rnn\.score='dot' does not fit decoder "
     r"'bahdanau'"),
    (["--set=model.rnn.decodr=none"],
     r"^error: --config\.model\.rnn\.decodr: the config has no such field \(Did you mean "
     r"\"decoder\""),
    (["--sweep=model.rnn.decoder=none,bahdanu"],
     r"^error: decoder=bahdanu: unknown model\.rnn\.decoder 'bahdanu'; known: bahdanau"),
    (["--set=model.rnn.emb_dim=big"],
     r"^error: flag --config\.model\.rnn\.emb_dim=big: invalid literal"),
    (["--set=train.steps=0"], r"^error: train\.steps=0 must be >= 1"),
    (["--sweep=train.beam_stop=bound,soon"],
     r"^error: beam_stop=soon: train\.beam_stop='soon' unknown; known: bound, k_finished"),
    # Before: these passed --dry_run and failed inside the run (a traceback in the first step
    # or at the first evaluation), or trained every word as <unk>.
    (["--set=model.rnn.pointer=True", "--set=data.shared_vocab=True",
      "--set=data.extended_vocab=True", "--sweep=train.label_smoothing=0,0.1"],
     r"^error: label_smoothing=0\.1: train\.label_smoothing=0\.1 with model\.rnn\.pointer=True: "
     r"label smoothing is not defined"),
    (["--set=model.rnn.score=location", "--sweep=model.max_src_len=16,8"],
     r"^error: max_src_len=8: model\.max_src_len=8 is below the widest source batch, 16 tokens"),
    (["--sweep=model.rnn.scope=window", "--set=model.rnn.half_width=-1"],
     r"model\.rnn\.half_width must be positive, got -1"),
    (["--set=data.vocab_size=3"], r"^error: data config: vocab_size=3 leaves no room for a word"),
    # Before: a misspelt task passed --dry_run and was refused inside the run, after the workdir
    # had its .lock and application.json.
    (["--set=model.fused=tritn"],
     r"^error: unknown model\.fused 'tritn'; known: auto, triton, .*cpu_blocked"),
    (["--set=model.fused=1"], r"^error: model\.fused=1: give True, False, 'auto' or a kernel "
                              r"target's name"),
    (["--set=data.task=revers"],
     r"^error: unknown data\.task 'revers'; known: copy, dates, jsonl, numbers, parallel_text, "
     r"reverse, tfds$"),
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


def test_fused_takes_a_boolean_auto_or_a_target_name(tmp_path, fake, capsys):
  # Before: any value but a boolean was refused as "Non-boolean argument to boolean flag" (the
  # flag's type came from the default, False), though the field's help offers target names.
  rc, out, err = sweep(tmp_path, "--set=model.rnn.decoder=luong",
                       "--set=model.rnn.input_feeding=False",
                       "--sweep=model.fused=false,True,auto,cpu_blocked", "--dry_run",
                       capsys=capsys)
  assert rc == 0 and err == "", err
  assert [l.split("--config.model.fused=")[1] for l in out.splitlines()] == [
      "false", "True", "auto", "cpu_blocked"]
  values = [entry_points.build_config(SMOKE[len("--config="):], [("model.fused", v)]).model.fused
            for v in ("false", "True", "auto", "cpu_blocked")]
  assert values == [False, True, "auto", "cpu_blocked"]
  assert entry_points.build_config(SMOKE[len("--config="):], []).model.fused is False


def test_launch_usage_errors_are_one_line(tmp_path, fake, capsys):
  for args, message in [(["--sweep=model.decoder"], "--sweep/--set expects key=value"),
                        (["--config=experiments/configs/nothere.py:smoke"],
                         "--config=experiments/configs/nothere.py:smoke: no file"),
                        (["--experiment=transalte"], "--experiment=transalte: not an experiment "
                                                     "launch.py runs; known: "
                                                     + ", ".join(entry_points.EXPERIMENTS.names())),
                        # entry points that are not experiments launch.py can run
                        (["--experiment=browser"], "--experiment=browser: not an experiment"),
                        (["--experiment=bench_kernel"], "--experiment=bench_kernel: not an")]:
    with pytest.raises(SystemExit) as exit_:
      launch.main(launch.parse_args(["launch.py", SMOKE, f"--workdir={tmp_path}", *args]))
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
  assert fake.calls == []


def test_every_experiment_launch_accepts_is_an_entry_point_that_checks_its_configs():
  # launch.py imports one experiment per process (each defines --config on absl's FLAGS), so
  # each module is read, not imported.
  from attn import apps  # pylint: disable=import-outside-toplevel
  assert "translate" in entry_points.EXPERIMENTS.names()
  assert entry_points.EXPERIMENTS.names() == [n for n, a in apps.APPS.items() if a.launchable]
  for _, exp in entry_points.EXPERIMENTS.items():
    source = open(importlib.util.find_spec(exp.module).origin, encoding="utf-8").read()
    assert "define_training_flags(" in source and "validate_config" in source, exp.module


def test_launch_cli_error_is_one_line_without_traceback(tmp_path):
  # Before: a bad --sweep printed absl's usage (the whole docstring) and exited 1; an unknown
  # --experiment ran the subprocess, which failed with a traceback.
  p = subprocess.run([sys.executable, "launch.py", "--experiment=transalte", SMOKE,
                      f"--workdir={tmp_path}"], cwd=REPO, capture_output=True, text=True,
                     timeout=300)
  lines = p.stderr.strip().splitlines()
  assert p.returncode == 2 and len(lines) == 1, p.stderr[-3000:]
  assert lines[0].startswith("error: --experiment=transalte: not an experiment launch.py runs")


def docstring_examples(doc):
  """The argument lists of every `python launch.py ...` command in `doc` (continuations joined)."""
  text = doc.replace("\\\n", " ")
  return [shlex.split(line.strip())[2:] for line in text.splitlines()
          if line.strip().startswith("python launch.py")]


def test_docstring_examples_are_valid_configs(monkeypatch):
  # Before: the grid example swept score=dot with the Bahdanau decoder, which cannot use it.
  monkeypatch.chdir(REPO)
  examples = docstring_examples(launch.__doc__)
  assert len(examples) >= 5
  assert any("--launcher=slurm" in a and "--collect" in a for a in examples)
  for args in examples:
    opts = launch.parse_args(["launch.py", *args])
    launchers.make(opts)  # the launcher's flags are valid too
    entry_points.metrics(opts.experiment, opts.metrics)  # and its --metrics
    seeds = sweeps.parse_seeds(opts.seeds, opts.set, opts.sweep)
    runs = sweeps.plan(opts.experiment, opts.config, opts.workdir, opts.set, opts.sweep, seeds)
    assert entry_points.check_configs(entry_points.load_experiment(opts.experiment), opts.config, runs) == [], \
        args


# slow: two real smoke runs; the `fake` experiment's sweeps above pin the launcher, and the docs
# test checks `make run`'s sweep with --dry_run
@pytest.mark.slow
def test_a_sweep_runs_each_combination_and_writes_table_and_plot(tmp_path):
  cmd = [sys.executable, "launch.py", "--experiment=translate", SMOKE, f"--workdir={tmp_path}",
         "--sweep=model.rnn.decoder=none,luong"]
  p = subprocess.run(cmd + ["--set=model.rnn.score=dot"], cwd=REPO, capture_output=True, text=True,
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
  p = subprocess.run(cmd + ["--set=model.rnn.score=general"], cwd=REPO, capture_output=True,
                     text=True, timeout=600)
  assert p.returncode == 1, p.stderr[-3000:]
  assert p.stdout.count("model.rnn.score: dot -> general") == 2 and "Traceback" not in p.stderr


# ---------------------------------------------------------------------------------------------
# --parallel, --seeds


def test_parallel_runs_n_at_once_logs_each_run_and_tabulates_in_grid_order(tmp_path, fake,
                                                                           capsys):
  fake.delay = {"decoder=none": 0.8, "decoder=luong": 0.2, "decoder=bahdanau": 0.2}
  fake.outcome["decoder=bahdanau"] = (3, None)
  rc, out, _ = sweep(tmp_path, "--sweep=model.rnn.decoder=none,luong,bahdanau", "--parallel=2",
                     capsys=capsys)
  assert rc == 1 and fake.peak == 2 and sorted(fake.calls) == ["decoder=bahdanau",
                                                               "decoder=luong", "decoder=none"]
  ended = [l for l in out.splitlines() if re.match(r"\[\d/3\] \S+: (finished|failed)", l)]
  assert [l.split()[1] for l in ended] == ["decoder=luong:", "decoder=bahdanau:", "decoder=none:"]
  assert re.search(r"\[1/3\] decoder=none: finished in \d+ s", out)
  # the failure shows the end of the run's log; the runs' output is not on the terminal
  assert re.search(r"decoder=bahdanau: failed \(exit status 3\) after \d+ s; the end of .*"
                   r"decoder=bahdanau/launch.log:\n(    .*\n)*    output of decoder=bahdanau\n",
                   out)
  assert "output of decoder=none" not in out
  for name in ("decoder=none", "decoder=luong"):
    assert f"output of {name}" in (tmp_path / name / "launch.log").read_text()
  rows = [l.split(" |")[0] for l in out.splitlines() if l.startswith("| decoder=")]
  assert rows == ["| decoder=none", "| decoder=luong", "| decoder=bahdanau"]  # grid order
  assert "| decoder=bahdanau | failed" in out


def test_seeds_are_runs_of_their_own_with_a_seed_override():
  runs = sweeps.plan("translate", "c.py:x", "w", ["model.score=dot"], ["model.decoder=none,luong"],
                     [0, 7])
  assert [r.name for r in runs] == ["decoder=none,seed=0", "decoder=none,seed=7",
                                    "decoder=luong,seed=0", "decoder=luong,seed=7"]
  assert runs[1].workdir == os.path.join("w", "decoder=none,seed=7")
  assert runs[1].overrides == (("model.score", "dot"), ("model.decoder", "none"),
                               ("train.seed", "7"))
  assert {r.group for r in runs} == {"decoder=none", "decoder=luong"}
  only = sweeps.plan("translate", None, "w", [], [], [3])
  assert [(r.name, r.workdir) for r in only] == [("seed=3", os.path.join("w", "seed=3"))]
  assert sweeps.plan("translate", None, "w", [], [])[0].workdir == "w"  # without seeds: as before


def test_seed_table_reports_mean_std_over_seeds_and_n(tmp_path, fake, capsys):
  for seed, bleu in enumerate([1.0, 2.0, 3.0]):
    fake.outcome[f"decoder=none,seed={seed}"] = (0, json.dumps({"bleu": bleu, "params": 10}))
  for seed in (0, 1):
    fake.outcome[f"decoder=luong,seed={seed}"] = (0, json.dumps({"bleu": 4.0, "params": 12}))
  fake.outcome["decoder=luong,seed=2"] = (1, None)
  rc, out, _ = sweep(tmp_path, "--sweep=model.rnn.decoder=none,luong", "--seeds=0,1,2",
                     "--metrics=bleu,params", capsys=capsys)
  assert rc == 1 and len(fake.calls) == 6
  md = (tmp_path / "results.md").read_text()
  assert "| run | n | bleu | params |" in md
  assert "| decoder=none | 3 | 2.000 ± 1.000 | 10 |" in md  # std with ddof=1 (ddof=0: 0.816)
  assert "| decoder=luong | 2 of 3 | 4.000 ± 0.000 | 12 |" in md
  assert "| decoder=none,seed=1 | 2.000 | 10 |" in md  # the per-seed table
  assert "| decoder=luong,seed=2 | failed | failed |" in md
  rec = json.loads((tmp_path / "decoder=none,seed=1" / "launch.json").read_text())
  assert rec["overrides"] == {"model.rnn.decoder": "none", "train.seed": "1"}
  assert (tmp_path / "results.png").stat().st_size > 1000
  assert report.bars([(r, *rundirs.status(r)) for r in sweeps.plan(
      "translate", SMOKE[len("--config="):], str(tmp_path), [], ["model.rnn.decoder=none,luong"],
      [0, 1, 2])], "bleu", [0, 1, 2]) == [("decoder=none", 2.0, 1.0), ("decoder=luong", 4.0, 0.0)]


@pytest.mark.parametrize("args,message", [
    (["--seeds=0,1,1"], "--seeds=0,1,1: seed 1 is listed twice"),
    (["--seeds=0,x"], "--seeds=0,x: 'x' is not an integer"),
    (["--seeds=0,1.5"], "'1.5' is not an integer"),
    (["--seeds=0,1", "--set=train.seed=3"], "--seeds sets train.seed: give either --seeds or"),
    (["--seeds=0,1", "--sweep=train.seed=1,2"], "--seeds sets train.seed"),
    # A value listed twice planned two runs in one directory (n=4 from two seeds, a smaller std).
    (["--seeds=0,1", "--sweep=model.rnn.decoder=none,none"],
     "--sweep=model.rnn.decoder=none,none: value 'none' is listed twice"),
    (["--vary=model.rnn.decoder=luong,bahdanau,luong"],
     "--vary=model.rnn.decoder=luong,bahdanau,luong: value 'luong' is listed twice"),
    (["--launcher=pbs"], "--launcher=pbs: unknown launcher 'pbs'; known: local, slurm"),
    (["--slurm_partition=gpu"], "--slurm_partition applies to --launcher=slurm, not "
                                "--launcher=local"),
    (["--launcher=slurm", "--slurm_time=1h"], "--slurm_time=1h: expects minutes, HH:MM:SS"),
    (["--launcher=slurm", "--slurm_mem=lots"], "--slurm_mem=lots: expects a size"),
    (["--launcher=slurm", "--slurm_extra=qos=high"], "--slurm_extra=qos=high: expects an sbatch "
                                                     "option"),
])
def test_seed_and_launcher_mistakes_are_one_line_usage_errors(tmp_path, fake, capsys, args,
                                                             message):
  with pytest.raises(SystemExit) as exit_:
    launch.main(launch.parse_args(["launch.py", SMOKE, f"--workdir={tmp_path / 'w'}", *args]))
  assert exit_.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
  assert fake.calls == [] and not (tmp_path / "w").exists()


# ---------------------------------------------------------------------------------------------
# --launcher=slurm, --collect

_FAKE_SBATCH = '''#!PYTHON
"""A fake sbatch: records its argv, the script and which launch.json records exist when it is
called (in calls.jsonl next to it), prints a job id; RUN_TASKS: first runs every array task of the
script, one after the other, with SLURM_ARRAY_TASK_ID set and its output where --output says."""
import glob, json, os, re, subprocess, sys
script = sys.argv[-1]
text = open(script).read()
workdir = os.path.dirname(os.path.dirname(os.path.abspath(script)))
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "calls.jsonl"), "a") as f:
  f.write(json.dumps({"argv": sys.argv[1:], "script": text, "records": sorted(
      glob.glob(os.path.join(workdir, "*", "launch.json")))}) + "\\n")
if FAIL:
  sys.exit("sbatch: error: invalid partition specified: nope")
if RUN_TASKS:
  last = int(re.search(r"^#SBATCH --array=0-(\\d+)", text, re.M).group(1))
  out = re.search(r"^#SBATCH --output=(\\S+)", text, re.M).group(1)
  for i in range(last + 1):
    env = dict(os.environ, SLURM_ARRAY_JOB_ID="12345", SLURM_ARRAY_TASK_ID=str(i))
    with open(out.replace("%A", "12345").replace("%a", str(i)), "w") as log:
      subprocess.call(["bash", script], env=env, stdout=log, stderr=subprocess.STDOUT)
print("Submitted batch job 12345")
'''


def fake_sbatch(directory, *, run_tasks=False, fail=False):
  """Writes the fake sbatch into `directory`; a function returning its calls so far."""
  directory.mkdir(parents=True, exist_ok=True)
  path = directory / "sbatch"
  path.write_text(_FAKE_SBATCH.replace("PYTHON", sys.executable)
                  .replace("RUN_TASKS", str(run_tasks)).replace("FAIL", str(fail)))
  path.chmod(0o755)
  calls = directory / "calls.jsonl"
  return lambda: [json.loads(l) for l in calls.read_text().splitlines()] if calls.exists() else []


def array_task(script, index):
  """The run directory that array task `index` of an sbatch script runs (bash reads RUNS)."""
  table = script.split("\nRUNS=(")[1].split("\n)")[0]
  return subprocess.run(["bash", "-c", f'RUNS=({table}\n)\necho "${{RUNS[{index}]}}"'],
                        capture_output=True, text=True, check=True).stdout.strip()


SLURM = ["--launcher=slurm", "--parallel=2", "--slurm_partition=gpu", "--slurm_time=01:00:00",
         "--slurm_cpus=4", "--slurm_gpus=1", "--slurm_mem=16G", "--slurm_account=lab",
         "--slurm_extra=--qos=high", "--slurm_extra=#SBATCH --constraint=a100"]


def test_slurm_submits_unfinished_runs_as_one_array_and_collect_tabulates(tmp_path, fake, capsys,
                                                                         monkeypatch):
  calls = fake_sbatch(tmp_path / "bin")
  monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
  wd = tmp_path / "sweep"
  args = ["--sweep=model.rnn.decoder=none,luong", *SLURM]
  rc, out, _ = sweep(wd, *args, capsys=capsys)
  assert rc == 0 and fake.calls == []  # nothing ran here
  assert "submitted 2 runs as Slurm job 12345" in out
  (call,) = calls()
  assert call["argv"] == [str(wd / "slurm" / "sweep.sbatch")]
  assert call["records"] == [str(wd / n / "launch.json") for n in ("decoder=luong", "decoder=none")]
  lines = call["script"].splitlines()
  directives = [l for l in lines if l.startswith("#SBATCH")]
  assert directives[1:] == [
      "#SBATCH --array=0-1%2", f"#SBATCH --output={wd}/slurm/%A_%a.out",
      "#SBATCH --partition=gpu", "#SBATCH --time=01:00:00", "#SBATCH --cpus-per-task=4",
      "#SBATCH --gpus=1", "#SBATCH --mem=16G", "#SBATCH --account=lab", "#SBATCH --qos=high",
      "#SBATCH --constraint=a100"]
  first_command = next(i for i, l in enumerate(lines) if l and not l.startswith("#"))
  assert lines.index(directives[-1]) < first_command  # sbatch reads #SBATCH lines up to there
  assert [array_task(call["script"], i) for i in (0, 1)] == [str(wd / "decoder=none"),
                                                           str(wd / "decoder=luong")]
  rec = json.loads((wd / "decoder=luong" / "launch.json").read_text())
  assert rec["overrides"] == {"model.rnn.decoder": "luong"} and rec["exit_code"] is None
  assert rec["slurm_job"] == "12345_1" and rec["slurm_log"] == f"{wd}/slurm/12345_1.out"

  # Task 1 runs on a node: the command recorded in its run directory, and its exit status.
  monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "12345")
  monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1")
  assert launchers.task(str(wd / "decoder=luong")) == 0 and fake.calls == ["decoder=luong"]
  assert json.loads((wd / "decoder=luong" / "launch.json").read_text())["exit_code"] == 0
  capsys.readouterr()

  # --collect runs and submits nothing: the finished run's numbers, the other one pending.
  rc, out, _ = sweep(wd, *args, "--collect", capsys=capsys)
  assert rc == 1 and len(calls()) == 1 and fake.calls == ["decoder=luong"]
  assert "decoder=none: pending: submitted as Slurm job 12345_0 and not started" in out
  md = (wd / "results.md").read_text()
  assert "| decoder=none | pending |" in md and "| decoder=luong | 1.000 |" in md

  # Resubmitting submits only the unfinished run.
  rc, out, _ = sweep(wd, *args, capsys=capsys)
  assert rc == 0 and "decoder=luong: finished before" in out
  script = calls()[-1]["script"]
  assert "#SBATCH --array=0-0%2" in script and array_task(script, 0) == str(wd / "decoder=none")
  monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "0")
  assert launchers.task(str(wd / "decoder=none")) == 0
  assert launchers.task(str(wd / "decoder=none")) == 0  # a copy of a finished run: nothing runs
  assert fake.calls == ["decoder=luong", "decoder=none"]
  rc, out, _ = sweep(wd, *args, "--collect", capsys=capsys)
  assert rc == 0 and "| decoder=none | 1.000 |" in out and len(calls()) == 2


def test_slurm_refuses_run_dirs_recorded_with_other_overrides(tmp_path, fake, capsys,
                                                              monkeypatch):
  calls = fake_sbatch(tmp_path / "bin")
  monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
  assert sweep(tmp_path, "--sweep=model.rnn.decoder=none,luong", "--set=model.rnn.score=dot") == 0
  before = (tmp_path / "decoder=none" / "launch.json").read_text()
  capsys.readouterr()
  rc, out, _ = sweep(tmp_path, "--sweep=model.rnn.decoder=none,luong,bahdanau",
                     "--set=model.rnn.score=general", "--launcher=slurm", capsys=capsys)
  assert rc == 1
  assert sum("refused" in l and "model.rnn.score: dot -> general" in l
             for l in out.splitlines()) == 2
  (call,) = calls()
  assert "#SBATCH --array=0-0\n" in call["script"]  # no --parallel: no limit
  assert array_task(call["script"], 0) == str(tmp_path / "decoder=bahdanau")
  assert (tmp_path / "decoder=none" / "launch.json").read_text() == before


@pytest.mark.parametrize("problem,message", [
    ("no_sbatch", "--launcher=slurm: no sbatch on PATH"),
    ("sbatch_fails", "failed (exit status 1): sbatch: error: invalid partition specified: nope"),
])
def test_slurm_submission_problems_are_one_line(tmp_path, fake, capsys, monkeypatch, problem,
                                                message):
  fake_sbatch(tmp_path / "bin", fail=True)
  monkeypatch.setenv("PATH", str(tmp_path / ("bin" if problem == "sbatch_fails" else "empty")))
  with pytest.raises(SystemExit) as exit_:
    launch.main(launch.parse_args(["launch.py", SMOKE, f"--workdir={tmp_path / 'w'}",
                                   "--sweep=model.rnn.decoder=none,luong", "--launcher=slurm"]))
  assert exit_.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
  if problem == "no_sbatch":
    assert not (tmp_path / "w").exists()  # checked before anything is written
  else:  # recorded before submission: they show as never started, and are submitted again
    rec = json.loads((tmp_path / "w" / "decoder=none" / "launch.json").read_text())
    assert rec["exit_code"] is None and "slurm_job" not in rec


def test_collect_without_a_launch_lists_runs_not_started(tmp_path, fake, capsys):
  rc, out, _ = sweep(tmp_path, "--sweep=model.rnn.decoder=none,luong", "--collect", capsys=capsys)
  assert rc == 1 and fake.calls == []
  assert "[1/2] decoder=none: not started" in out and "| decoder=luong | pending |" in out


def test_slurm_array_end_to_end_with_a_fake_sbatch(tmp_path, capsys, monkeypatch):
  # The fake sbatch runs the one array task here: the real script, task entry and experiment
  # (the smoke preset with one bucket shape to compile: ~10 s on an idle 2-core machine).
  calls = fake_sbatch(tmp_path / "bin", run_tasks=True)
  monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
  monkeypatch.chdir(REPO)
  wd = tmp_path / "cluster"
  args = ["--sweep=model.rnn.decoder=none", "--set=data.num_buckets=1", "--seeds=1",
          "--launcher=slurm", "--slurm_time=00:10:00"]
  rc, out, err = sweep(wd, *args, capsys=capsys)
  assert rc == 0 and "as Slurm job 12345" in out, err
  run_dir = wd / "decoder=none,seed=1"
  rec = json.loads((run_dir / "launch.json").read_text())
  assert rec["exit_code"] == 0 and rec["slurm_job"] == "12345_0", rec
  assert json.loads((run_dir / "config.json").read_text())["train"]["seed"] == 1
  assert "exit status 0" in (wd / "slurm" / "12345_0.out").read_text()
  rc, out, err = sweep(wd, *args, "--collect", capsys=capsys)
  assert rc == 0 and "[1/1] decoder=none,seed=1: finished" in out, err
  md = (wd / "results.md").read_text()
  assert re.search(r"\| decoder=none \| 1 \| \d", md) and "pending" not in md, md
  assert (wd / "results.png").stat().st_size > 1000 and len(calls()) == 1


def test_an_experiments_override_given_to_launch_points_to_set_and_sweep(tmp_path, capsys):
  with pytest.raises(SystemExit) as exit_:
    launch.parse_flags(["launch.py", SMOKE, f"--workdir={tmp_path}", "--config.train.steps=2"])
  assert exit_.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "Unknown command line flag 'config.train.steps'" in err[0], err
  assert "--set=train.steps=VALUE" in err[0] and "--sweep=" in err[0], err
