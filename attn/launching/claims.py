"""Headline claims anyone can check: a finished run's recorded curve, and a short rerun of its
first steps compared with it.

A claim is a recipe and its step count; its record (the curve a finished run left, written
and read by attn.launching.claim_records) is what a check compares with.

`check` trains the claim's first phase (its recorded config, overrides applied) for its first N
steps in a temporary workdir: the schedule is the recorded one (it still ends at the phase's
`train.steps`), training just stops after N steps (`attn.training.train(stop_after=N)`). It
compares the loss at every logged step up to N, and the metrics of the first evaluation inside N
(if any), with the record.

The tolerance is measured, not guessed (`measure_tolerance`): the same prefix trained with
several seeds and compute dtypes; at each logged step the band is the range (max - min) of the
losses of those runs and of the recorded run; a step the measurement did not reach gets the
largest relative range it saw (range / |mean loss|) times the recorded loss. The first
evaluation's metrics get the same treatment. A check holds when every compared value is within
its band of the record.

Library code: it never reads absl FLAGS; the entry point is experiments/check_claim.py.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import shutil
import tempfile

from attn.common.tables import markdown_table
from attn.config.configurable import option
from attn.errors import ConfigError
from attn.launching.claim_records import Claim, ClaimError, curve_of, load_claim

log = logging.getLogger(__name__)



@dataclasses.dataclass(frozen=True)
class Settings:
  """experiments.check_claim's flags, one for one (besides --command and the --config.KEY=VALUE
  overrides, which the entry point takes itself)."""
  steps: int | None = option(
      None, "steps of the claim's (first phase's) prefix to train and compare; unset: the "
            "claim's check_steps, about 10 minutes on the 2-core machine that recorded it")
  data_dir: str = option("", "the claim's data directory here (replaces data.dir)")
  curves_dir: str = option("docs/results/curves", "where the claims' records are")
  record: str = option("", "record the finished run in --workdir as claim NAME (--command: "
                           "the command that ran it, once per phase)")
  workdir: str = option("", "the finished run to record (with --record)")
  measure_tolerance: bool = option(
      False, "measure the claim's tolerance (the spread of its prefix over --seeds and "
             "--dtypes) and write it into the record")
  seeds: tuple[int, ...] = option((0, 1, 2), "seeds of --measure_tolerance's runs")
  dtypes: tuple[str, ...] = option(("float32", "bfloat16"),
                                   "compute dtypes of --measure_tolerance's runs")

  def __post_init__(self):
    if self.steps is not None and self.steps < 1:
      raise ClaimError(f"--steps={self.steps} must be >= 1")
    if not self.seeds or not self.dtypes:
      raise ClaimError("--seeds and --dtypes each need at least one value")


# ---- Training a prefix.

def claim_config(claim: Claim, overrides=(), data_dir: str = ""):
  """The ConfigDict of the claim's first phase as recorded, `data_dir` as data.dir and then
  `overrides` ((dotted key, text value) pairs, as --config.KEY=VALUE) applied. ConfigError (one
  line) for a field the config lacks or a value of the wrong type."""
  import ml_collections  # pylint: disable=import-outside-toplevel
  from absl import flags  # pylint: disable=import-outside-toplevel
  from ml_collections import config_flags  # pylint: disable=import-outside-toplevel
  from attn.launching import cli  # pylint: disable=import-outside-toplevel
  from attn.training.config import migrate_config  # pylint: disable=import-outside-toplevel
  config = ml_collections.ConfigDict(migrate_config(copy.deepcopy(claim.first_phase["config"])))
  if data_dir:
    config.data.dir = data_dir
  overrides = list(overrides)
  if not overrides:
    return config
  argv = ["check_claim"] + [f"--config.{k}={v}" for k, v in overrides]
  fv = flags.FlagValues()
  try:
    config_flags.DEFINE_config_dict("config", config, "The claim's config.", flag_values=fv,
                                    lock_config=True, sys_argv=argv)
    fv(argv)
  except (flags.Error, AttributeError, KeyError) as e:
    raise ConfigError(cli.describe_flag_error(e, argv)) from None
  return fv.config


def train_prefix(config, application: str, steps: int, workdir: str) -> tuple[dict, dict, str]:
  """Trains `config` of `application` for its first `steps` steps in the fresh `workdir`: the
  schedule is the config's (ending at train.steps), training stops after `steps`. Returns
  ({step: loss}, {step: eval metrics}, the compute dtype that ran) as its metrics.jsonl logged
  them."""
  from attn import training  # pylint: disable=import-outside-toplevel
  run = training.setup(config, workdir, task=application)
  run.donate = True  # as train_and_evaluate trains
  ckpt = training.Checkpoints(workdir, keep=run.tc.keep_checkpoints)
  try:
    training.train(run, ckpt, training.MetricsWriter(workdir), stop_after=steps)
  finally:
    ckpt.close()
  train, evals, _ = curve_of(workdir)
  return train, evals, run.tc.compute_dtype


def _check_steps(claim: Claim, steps: int | None) -> int:
  """`steps`, or the claim's default, checked against what the record holds (ClaimError)."""
  phase = claim.first_phase
  n = int(claim.head.get("check_steps") or phase["steps"]) if steps is None else steps
  if n < 1:
    raise ClaimError(f"--steps={n} must be >= 1")
  several = len(claim.head["phases"]) > 1
  if n > phase["steps"]:
    raise ClaimError(f"--steps={n} is beyond the claim's {phase['steps']} recorded steps"
                     + (" of its first phase (a check trains the first phase's prefix)"
                        if several else ""))
  if not any(s <= n for s in claim.train):
    raise ClaimError(f"--steps={n}: no logged step within it; the claim's first is at step "
                     f"{min(claim.train)}")
  return n


def _prefix_dir() -> str:
  return tempfile.mkdtemp(prefix="check_claim-")


# ---- Comparing with the record.

@dataclasses.dataclass(frozen=True)
class Row:
  """One compared value: `what` (loss, or eval <metric>) at `step`."""
  step: int
  what: str
  recorded: float
  here: float | None  # None: this run did not log it
  tolerance: float

  @property
  def difference(self) -> float | None:
    return None if self.here is None else self.here - self.recorded

  @property
  def within(self) -> bool:
    return self.here is not None and abs(self.here - self.recorded) <= self.tolerance


@dataclasses.dataclass(frozen=True)
class Comparison:
  """A check's outcome: the compared rows in step order, the prefix length, the dtypes."""
  claim: str
  steps: int
  rows: tuple[Row, ...]
  recorded_dtype: str
  dtype: str
  phases: int

  @property
  def departed(self) -> Row | None:
    """The first row (by step) outside its tolerance, or None: the run holds to the record."""
    return next((r for r in self.rows if not r.within), None)

  def report(self) -> str:
    """Both curves side by side, then one verdict line."""
    head = ["step", "value", "recorded", "this run", "difference", "tolerance", "within"]
    body = [[r.step, r.what, f"{r.recorded:.4f}",
             "(not logged)" if r.here is None else f"{r.here:.4f}",
             "" if r.difference is None else f"{r.difference:+.4f}", f"{r.tolerance:.4f}",
             "yes" if r.within else "NO"] for r in self.rows]
    lines = [f"claim {self.claim}: the first {self.steps} steps"
             + (" of its first phase (of {}; later phases are not checked)".format(self.phases)
                if self.phases > 1 else "")
             + f"; compute dtype {self.dtype} here, {self.recorded_dtype} recorded", "",
             markdown_table(head, body), ""]
    bad = self.departed
    if bad is None:
      lines.append(f"holds: every compared value of the first {self.steps} steps is within its "
                   "measured tolerance of the record")
    elif bad.here is None:
      lines.append(f"departs at step {bad.step}: this run logged no {bad.what} there")
    else:
      lines.append(f"departs at step {bad.step}: {bad.what} {bad.here:.4f} here, "
                   f"{bad.recorded:.4f} recorded (difference {bad.difference:+.4f}, tolerance "
                   f"{bad.tolerance:.4f})")
    return "\n".join(lines)


def _band(tolerance: dict, kind: str, step: int, recorded: float, metric: str = "loss") -> float:
  """The tolerance of `metric` (loss, or an eval metric) at `step`: the measured range there, else
  the largest relative range measured times |recorded|."""
  if kind == "train":
    by_step, relative = dict(map(tuple, tolerance["loss"])), tolerance["loss_relative"]
  else:
    evals = tolerance.get("eval", {})
    by_step = ({int(tolerance["eval_step"]): evals[metric]}
               if metric in evals and tolerance.get("eval_step") is not None else {})
    relative = tolerance.get("eval_relative", {}).get(metric, 0.0)
  return float(by_step[step]) if step in by_step else float(relative) * abs(recorded)


def compare(claim: Claim, steps: int, train: dict, evals: dict, dtype: str) -> Comparison:
  """The loss at each of the claim's logged steps up to `steps` and the metrics of its first
  evaluation within them, against this run's (`train`, `evals`: as train_prefix returns them),
  each with its band of the claim's measured tolerance."""
  tol = claim.head.get("tolerance")
  if not tol:
    raise ClaimError(f"claim {claim.name} has no measured tolerance yet: measure it first "
                     f"(python -m experiments.check_claim {claim.name} --measure_tolerance)")
  rows = [Row(s, "loss", v, train.get(s), _band(tol, "train", s, v))
          for s, v in sorted(claim.train.items()) if s <= steps]
  first_eval = min((s for s in claim.eval if s <= steps), default=None)
  if first_eval is not None:
    ran = evals.get(first_eval, {})
    for metric, v in sorted(claim.eval[first_eval].items()):
      if isinstance(v, (int, float)) and not isinstance(v, bool):
        rows.append(Row(first_eval, f"eval {metric}", float(v), _number(ran.get(metric)),
                        _band(tol, "eval", first_eval, float(v), metric)))
  rows.sort(key=lambda r: (r.step, r.what != "loss"))
  return Comparison(claim.name, steps, tuple(rows), claim.head.get("compute_dtype", ""), dtype,
                    len(claim.head["phases"]))


def _number(v):
  return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def check(name: str, curves_dir: str, *, steps: int | None = None, overrides=(),
          data_dir: str = "") -> Comparison:
  """Trains the first `steps` steps (None: the claim's check_steps) of claim `name`'s first phase
  in a temporary workdir, removed afterwards, and compares them with the record."""
  claim = load_claim(name, curves_dir)
  n = _check_steps(claim, steps)
  config = claim_config(claim, overrides, data_dir)
  workdir = _prefix_dir()
  try:
    train, evals, dtype = train_prefix(config, claim.head["application"], n, workdir)
  finally:
    shutil.rmtree(workdir, ignore_errors=True)
  return compare(claim, n, train, evals, dtype)


# ---- Measuring the tolerance.

def spread(curves: list[dict]) -> tuple[dict, float]:
  """({step: max - min over `curves`}, the largest (max - min) / |mean| over those steps) of the
  steps every curve ({step: value}) has."""
  steps = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
  by_step, relative = {}, 0.0
  for s in steps:
    values = [c[s] for c in curves]
    by_step[s] = max(values) - min(values)
    mean = sum(values) / len(values)
    if mean and math.isfinite(mean):
      relative = max(relative, by_step[s] / abs(mean))
  return by_step, relative


def measure_tolerance(name: str, curves_dir: str, *, seeds, dtypes, steps: int | None = None,
                      overrides=(), data_dir: str = "", cpu: dict | None = None) -> dict:
  """Trains the claim's prefix once per seed and compute dtype, measures the spread of their
  logged losses and first evaluation together with the recorded run's, and writes it into the
  record as its `tolerance`. Returns it."""
  claim = load_claim(name, curves_dir)
  n = _check_steps(claim, steps)
  base = claim_config(claim, overrides, data_dir)
  runs = []
  for dtype in dtypes:
    for seed in seeds:
      config = copy.deepcopy(base)
      config.train.seed, config.train.compute_dtype = int(seed), str(dtype)
      workdir = _prefix_dir()
      try:
        log.info(f"claim {name}: prefix of {n} steps, seed {seed}, compute dtype {dtype}")
        train, evals, ran = train_prefix(config, claim.head["application"], n, workdir)
      finally:
        shutil.rmtree(workdir, ignore_errors=True)
      runs.append({"seed": int(seed), "compute_dtype": ran,
                   "loss": [[s, v] for s, v in sorted(train.items())],
                   "eval": {str(s): m for s, m in sorted(evals.items())}})
  recorded = {s: v for s, v in claim.train.items() if s <= n}
  curves = [recorded] + [{s: v for s, v in r["loss"] if s <= n} for r in runs]
  loss, loss_relative = spread(curves)
  tolerance = {"steps": n, "seeds": [int(s) for s in seeds], "dtypes": [str(d) for d in dtypes],
               "cpu": cpu, "loss": [[s, v] for s, v in sorted(loss.items())],
               "loss_relative": loss_relative, "eval_step": None, "eval": {},
               "eval_relative": {}, "runs": runs,
               "how": "per logged step, the range (max - min) of the loss over the recorded run "
                      "and one run per seed and compute dtype of the same prefix; steps beyond "
                      "it: the largest range / |mean| seen, times the recorded loss; the first "
                      "evaluation's metrics likewise"}
  first_eval = min((s for s in claim.eval if s <= n), default=None)
  if first_eval is not None:
    per_metric = {}
    for metric, v in claim.eval[first_eval].items():
      values = [_number(v)] + [_number(r["eval"].get(str(first_eval), {}).get(metric))
                               for r in runs]
      if all(x is not None for x in values):
        per_metric[metric] = [{0: x} for x in values]
    tolerance["eval_step"] = first_eval
    for metric, curves in per_metric.items():
      by_step, relative = spread(curves)
      tolerance["eval"][metric], tolerance["eval_relative"][metric] = by_step[0], relative
  claim.head["tolerance"] = tolerance
  claim.write()
  return tolerance
