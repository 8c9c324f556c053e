"""Headline claims anyone can check: the presets behind them stop at a step count, a finished run
is recorded as a claim (its curve, config, versions, CPU), its tolerance is measured over seeds
and dtypes, and experiments.check_claim reruns a prefix: a rerun holds, another learning rate
departs at the first logged step beyond the tolerance, mistakes are one error line."""

import json
import os
import subprocess
import sys

import pytest

from attn import training
from attn.benchmarks.harness import cpu_info
from attn.launching import claim_records, claims, entry_points
from attn.training.config import _SCHEDULES, TrainConfig
from experiments.configs import summarize as summarize_config
from experiments.configs import translate as translate_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = os.path.join(REPO, "experiments", "configs", "translate.py") + ":smoke"
# The copy task at its smallest; warm-up of one step, so the first step runs at learning rate 0
# and the loss logged at step 2 is the initial model's whatever the learning rate.
TINY = [("data.task", "copy"), ("data.min_len", 2), ("data.max_len", 5),
        ("data.task_vocab_size", 5), ("data.train_size", 256), ("data.eval_size", 32),
        ("data.test_size", 32), ("data.max_src_len", 8), ("data.max_tgt_len", 8),
        ("data.num_buckets", 1), ("data.batch_size", 32), ("train.learning_rate", 0.01),
        ("train.warmup_steps", 1), ("train.eval_every", 6), ("train.checkpoint_every", 6),
        ("train.log_every", 2), ("train.eval_decode_sentences", 32)]


def _command(workdir, **train):
  overrides = TINY + [(f"train.{k}", v) for k, v in train.items()]
  return (f"python -m experiments.translate --config={SMOKE} \\\n    "
          + " ".join(f"--config.{k}={v}" for k, v in overrides) + f" --workdir={workdir}")


def _train(workdir, **train):
  """Trains the tiny run as its command would; returns the command."""
  command = _command(workdir, **train)
  overrides = [(k, str(v)) for k, v in TINY] + [(f"train.{k}", str(v)) for k, v in train.items()]
  training.train_and_evaluate(entry_points.build_config(SMOKE, overrides), str(workdir),
                              task="translate")
  return command


@pytest.fixture(scope="module")
def tiny_claim(tmp_path_factory):
  """(curves_dir, name): a 12-step claim recorded from its finished run (seed 0, float32), its
  tolerance measured with seed 1 in float32 and in bfloat16."""
  root = tmp_path_factory.mktemp("claims")
  curves = str(root / "curves")
  command = _train(root / "run", steps=12)
  claim_records.record("tiny", str(root / "run"), [command], curves, cpu=cpu_info())
  claims.measure_tolerance("tiny", curves, seeds=(1,), dtypes=("float32", "bfloat16"))
  return curves, "tiny"


def _cli(*args):
  return subprocess.run([sys.executable, "-m", "experiments.check_claim", *args], cwd=REPO,
                        capture_output=True, text=True, timeout=600)


# ---- The presets behind the headline figures.

HEADLINE_PRESETS = [(translate_config, "multi30k"), (translate_config, "multi30k_transformer"),
                    (translate_config, "multi30k_subword"), (translate_config, "demo"),
                    (summarize_config, "aeslc"), (summarize_config, "aeslc_test")]


@pytest.mark.parametrize("module,preset", HEADLINE_PRESETS,
                         ids=[p for _, p in HEADLINE_PRESETS])
def test_headline_presets_stop_at_their_step_count_where_their_schedule_ends(module, preset):
  """A time budget would stop each machine at another step (and another point of the schedule)."""
  tc = TrainConfig.from_config(module.get_config(preset).train)
  assert tc.max_wall_s == 0, preset
  if tc.schedule == "cosine":
    lr = _SCHEDULES["cosine"](tc)
    assert float(lr(tc.steps)) == pytest.approx(tc.learning_rate * tc.end_lr_fraction)
    assert float(lr(int(tc.steps * 0.95))) > float(lr(tc.steps))  # still decaying near the end


# ---- Recording.

def test_a_record_holds_the_command_config_versions_cpu_and_the_curve(tiny_claim):
  curves, name = tiny_claim
  path = os.path.join(curves, f"{name}.jsonl")
  assert os.path.getsize(path) < 100_000
  lines = [json.loads(l) for l in open(path)]
  head, rows = lines[0], lines[1:]
  assert head["claim"] == name and head["application"] == "translate"
  (phase,) = head["phases"]
  assert phase["command"].startswith("python -m experiments.translate")
  assert phase["config"]["train"]["steps"] == 12 == phase["steps"] == head["steps"]
  assert head["compute_dtype"] == "float32" and head["jax"] and head["jaxlib"]
  assert head["cpu"]["model"] and head["steps_per_s"] > 0
  assert [r["step"] for r in rows if r["split"] == "train"] == [2, 4, 6, 8, 10, 12]
  assert [r["step"] for r in rows if r["split"] == "eval"] == [6, 12]
  assert all("loss" in r for r in rows if r["split"] == "train")
  assert all("nll" in r and "bleu" in r and "eval_s" not in r
             for r in rows if r["split"] == "eval")
  # The measured spread: per logged step, the range over the recorded run and every other run.
  tol = head["tolerance"]
  assert len(tol["runs"]) == 2 and {r["seed"] for r in tol["runs"]} == {1}
  assert {r["compute_dtype"] for r in tol["runs"]} == {"float32", "bfloat16"}
  recorded = {r["step"]: r["loss"] for r in rows if r["split"] == "train"}
  for step, band in tol["loss"]:
    values = [recorded[step]] + [dict(map(tuple, r["loss"]))[step] for r in tol["runs"]]
    assert band == pytest.approx(max(values) - min(values))
  assert tol["eval_step"] == 6 and tol["eval"]["nll"] > 0


def test_the_default_prefix_is_sized_to_ten_minutes_of_the_recorded_run():
  # 2 steps/s: 1,200 steps in 600 s, less the evaluations' recorded time, in whole windows of 50.
  assert claim_records.default_check_steps(50, 4200, 2.0, {}) == 1200
  assert claim_records.default_check_steps(50, 4200, 2.0, {500: 150.0, 3000: 150.0}) == 900
  assert claim_records.default_check_steps(50, 4200, 100.0, {}) == 4200  # the whole run fits
  assert claim_records.default_check_steps(50, 40, 0.01, {}) == 40


def test_a_record_refuses_a_command_that_is_not_the_run(tiny_claim, tmp_path):
  curves, name = tiny_claim
  workdir = os.path.join(os.path.dirname(curves), "run")
  with pytest.raises(claim_records.ClaimError, match="train.steps is 12 there, 13 in the command"):
    claim_records.record("other", workdir, [_command(workdir, steps=13)], str(tmp_path), cpu={})
  with pytest.raises(claim_records.ClaimError, match="not a finished run"):
    claim_records.record("other", str(tmp_path), [_command(workdir, steps=12)], str(tmp_path), cpu={})


def test_the_command_line_records_a_finished_run(tiny_claim, tmp_path):
  curves, _ = tiny_claim
  workdir = os.path.join(os.path.dirname(curves), "run")
  out = str(tmp_path / "curves")
  p = _cli("--record=again", f"--workdir={workdir}", f"--curves_dir={out}",
           f"--command={_command(workdir, steps=12)}")
  assert p.returncode == 0, p.stderr[-3000:]
  again = claim_records.load_claim("again", out)
  assert again.train == claim_records.load_claim("tiny", curves).train
  assert again.head["tolerance"] is None and "--measure_tolerance" in p.stdout
  p = _cli("--record=again", f"--workdir={workdir}", f"--curves_dir={out}")  # no --command
  assert p.returncode == 2 and p.stderr.strip().splitlines() == [
      'error: --record needs the command that ran the claim: --command="python -m ..." (once '
      'per phase, in order)']


# ---- Checking.

def test_a_recorded_claim_holds_when_rerun(tiny_claim):
  curves, name = tiny_claim
  result = claims.check(name, curves)  # the default prefix: the whole 12 steps here
  assert result.departed is None, result.report()
  assert [r.step for r in result.rows if r.what == "loss"] == [2, 4, 6, 8, 10, 12]
  assert {r.what for r in result.rows if r.step == 6} >= {"loss", "eval nll", "eval bleu"}
  # the same program on the same machine: the very same numbers
  assert all(abs(r.difference) < 1e-6 for r in result.rows), result.report()
  assert "holds:" in result.report().splitlines()[-1]


def test_another_learning_rate_departs_at_the_first_step_beyond_the_tolerance(tiny_claim):
  curves, name = tiny_claim
  p = _cli(name, f"--curves_dir={curves}", "--config.train.learning_rate=0.1")
  assert p.returncode == 1, p.stderr[-3000:]
  table = [l.split("|")[1:-1] for l in p.stdout.splitlines() if l.startswith("| ")][1:]
  table = [[c.strip() for c in row] for row in table]
  # step 2 is the initial model's loss under any learning rate (warm-up starts at 0): it holds
  assert table[0][:2] == ["2", "loss"] and table[0][4] == "+0.0000" and table[0][6] == "yes"
  first_out = next(row for row in table if row[6] == "NO")
  assert abs(float(first_out[4])) > float(first_out[5])
  assert all(abs(float(r[4])) <= float(r[5]) for r in table[:table.index(first_out)])
  assert p.stdout.splitlines()[-1].startswith(f"departs at step {first_out[0]}: {first_out[1]} ")


def test_a_multi_phase_claim_keeps_every_phase_and_checks_the_first(tmp_path):
  workdir, curves = tmp_path / "run", str(tmp_path / "curves")
  first = _train(workdir, steps=6)
  second = _train(workdir, steps=10)  # resumed: trains on to step 10 with the longer schedule
  claim_records.record("phased", str(workdir), [first, second], curves, cpu=cpu_info())
  claim = claim_records.load_claim("phased", curves)
  assert [p["steps"] for p in claim.head["phases"]] == [6, 10]
  assert claim.first_phase["config"]["train"]["steps"] == 6  # built from the first command
  assert sorted(claim.train) == [2, 4, 6, 8, 10]  # the curve covers both phases
  assert claim.head["check_steps"] <= 6
  with pytest.raises(claim_records.ClaimError, match="beyond the claim's 6 recorded steps of its first "
                                              "phase"):
    claims.check("phased", curves, steps=8)
  claims.measure_tolerance("phased", curves, seeds=(0,), dtypes=("float32",))
  result = claims.check("phased", curves)
  # the first phase's schedule (ending at 6), not the last config's: the same numbers again
  assert result.departed is None and all(abs(r.difference) < 1e-6 for r in result.rows)
  assert "of its first phase" in result.report()


# ---- Mistakes: one error line, exit status 2, before any training.

def test_an_unknown_claim_is_one_error_line_listing_the_known_ones(tiny_claim):
  curves, _ = tiny_claim
  p = _cli("no_such_claim", f"--curves_dir={curves}")
  assert p.returncode == 2, p.stderr[-3000:]
  lines = p.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: no claim 'no_such_claim'")
  assert lines[0].endswith("known: tiny")
  listed = _cli(f"--curves_dir={curves}")
  assert listed.returncode == 0 and listed.stdout.strip().endswith(": tiny")


@pytest.mark.parametrize("steps,message", [
    (0, "error: --steps=0 must be >= 1"),
    (13, "error: --steps=13 is beyond the claim's 12 recorded steps")])
def test_a_bad_steps_is_one_error_line(tiny_claim, steps, message):
  curves, name = tiny_claim
  p = _cli(name, f"--curves_dir={curves}", f"--steps={steps}")
  assert p.returncode == 2, p.stderr[-3000:]
  lines = p.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(message), lines


def test_a_claim_without_a_measured_tolerance_says_how_to_measure_it(tmp_path, tiny_claim):
  curves, name = tiny_claim
  claim = claim_records.load_claim(name, curves)
  claim.head["tolerance"] = None
  claim.path = str(tmp_path / f"{name}.jsonl")
  claim.write()
  with pytest.raises(claim_records.ClaimError, match="--measure_tolerance"):
    claims.compare(claim_records.load_claim(name, str(tmp_path)), 12, {}, {}, "float32")
