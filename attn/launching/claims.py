"""Headline claims anyone can check: a finished run's recorded curve, and a short rerun of its
first steps compared with it.

A claim is a recipe (one command, or several run one after the other on the same workdir: a
multi-phase recipe such as AESLC's coverage phase) and its step count. Its record is a file
`<curves_dir>/<name>.jsonl`, one JSON object a line:

- the first line, the claim: `claim` (its name), `application`, `phases` (per command: the
  `command` as typed, the `config` it ran with and its `steps`), `steps` (of the whole run),
  `compute_dtype` (what ran: float32 or bfloat16), `jax`, `jaxlib`, `cpu` (the model name from
  /proc/cpuinfo and its bfloat16 flags), `steps_per_s` (training steps a second of the whole run),
  `check_steps` (the default prefix `check` trains: about `CHECK_SECONDS` on the recording
  machine) and `tolerance` (None until `measure_tolerance` has measured it);
- then the workdir's metrics.jsonl as the run logged it, cut to what a check compares: one
  `{"step", "split": "train", "loss"}` per logged training step and one `{"step", "split":
  "eval", <metric>: value, ...}` per evaluation, over the steps of every phase.

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
import json
import logging
import math
import os
import shlex
import shutil
import tempfile

from attn.common import files
from attn.common.tables import markdown_table
from attn.config.configurable import option
from attn.errors import AttnError, ConfigError

log = logging.getLogger(__name__)

CHECK_SECONDS = 600.0  # what the default prefix is sized to take on the recording machine
TIMING_KEYS = ("eval_s", "tokens_per_sec")  # logged figures of speed, not of the model
AUTO = "auto"  # train.compute_dtype chosen when the run starts (config.json records the choice)


class ClaimError(AttnError, ValueError):
  """An unknown claim, a claim record that cannot be read, or a check that cannot be made."""


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


@dataclasses.dataclass
class Claim:
  """A claim's record: `head` (the first line) and its curve (`train`: {step: loss}; `eval`:
  {step: {metric: value}}), read from `path`."""
  path: str
  head: dict
  train: dict
  eval: dict

  @property
  def name(self) -> str:
    return self.head["claim"]

  @property
  def first_phase(self) -> dict:
    return self.head["phases"][0]

  def rows(self) -> list[dict]:
    """The curve as the record's lines after the first."""
    out = [{"step": s, "split": "train", "loss": v} for s, v in self.train.items()]
    out += [{"step": s, "split": "eval", **m} for s, m in self.eval.items()]
    return sorted(out, key=lambda r: (r["step"], r["split"] != "train"))

  def write(self) -> None:
    """Rewrites the record atomically."""
    lines = [json.dumps(self.head)] + [json.dumps(r) for r in self.rows()]
    files.write_text(self.path, "\n".join(lines) + "\n")


def known_claims(curves_dir: str) -> list[str]:
  """The names of the claims recorded in `curves_dir` (its *.jsonl files), sorted."""
  if not os.path.isdir(curves_dir):
    return []
  return sorted(n[:-len(".jsonl")] for n in os.listdir(curves_dir) if n.endswith(".jsonl"))


def load_claim(name: str, curves_dir: str) -> Claim:
  """The claim `name` of `curves_dir`; ClaimError (one line) listing the known ones if none."""
  path = os.path.join(curves_dir, f"{name}.jsonl")
  if os.sep in name or name in (".", "..") or not os.path.isfile(path):
    known = known_claims(curves_dir)
    raise ClaimError(f"no claim {name!r} in {curves_dir}; known: "
                     + (", ".join(known) if known else "none recorded yet"))
  head, train, evals = None, {}, {}
  with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
      except ValueError:
        raise ClaimError(f"{path}, line {number}: not JSON") from None
      if head is None:
        head = row
      elif row.get("split") == "train":
        train[int(row["step"])] = float(row["loss"])
      elif row.get("split") == "eval":
        evals[int(row["step"])] = {k: v for k, v in row.items() if k not in ("step", "split")}
  if not isinstance(head, dict) or "phases" not in head:
    raise ClaimError(f"{path}: its first line is not a claim (no phases)")
  return Claim(path, head, train, evals)


# ---- Recording a finished run.

def _command_config(command: str):
  """The ConfigDict `command` runs with, built from its --config=FILE:PRESET and --config.K=V
  arguments as the experiment would (None when it names no --config=)."""
  from attn.launching import entry_points  # pylint: disable=import-outside-toplevel
  words = shlex.split(command.replace("\\\n", " "))
  config = next((w.split("=", 1)[1] for w in words if w.startswith("--config=")), None)
  if config is None:
    return None
  overrides = [tuple(w[len("--config."):].split("=", 1)) for w in words
               if w.startswith("--config.") and "=" in w]
  return entry_points.build_config(config, overrides)


def _as_json(config) -> dict:
  """A ConfigDict (or a dict) as config.json holds it."""
  if isinstance(config, dict):
    return json.loads(json.dumps(config))
  from attn.training.config import config_record  # pylint: disable=import-outside-toplevel
  return json.loads(config_record(config))


def _phases(workdir: str, commands, as_run: dict, dtype: str) -> list[dict]:
  """One {command, config, steps} per command: the last with the workdir's config.json (the
  config as run), the earlier ones with the config their command builds, its compute dtype the
  one that ran (`dtype`: train.compute_dtype=auto is resolved when the run starts and kept when
  it resumes). ClaimError when an earlier command names no config or the last command's train
  section is not the one that ran."""
  phases = []
  for i, command in enumerate(commands):
    last = i == len(commands) - 1
    built = _command_config(command)
    if built is None and not last:
      raise ClaimError(f"--command #{i + 1} names no --config=FILE:PRESET: an earlier phase's "
                       "config is built from its command")
    config = as_run if last else _as_json(built)
    if config["train"].get("compute_dtype") == AUTO:
      config["train"]["compute_dtype"] = dtype
    if last and built is not None:
      said, ran = _as_json(built)["train"], as_run.get("train", {})
      differ = sorted(k for k in set(said) | set(ran) if said.get(k) != ran.get(k)
                      and not (k == "compute_dtype" and said.get(k) == AUTO))
      if differ:
        raise ClaimError(f"the last --command is not the run in {workdir}: train."
                         + ", train.".join(f"{k} is {ran.get(k)!r} there, {said.get(k)!r} in the "
                                           "command" for k in differ))
    phases.append({"command": command, "config": config, "steps": int(config["train"]["steps"])})
  steps = [p["steps"] for p in phases]
  if steps != sorted(set(steps)):
    raise ClaimError(f"the phases' train.steps {steps} do not increase: each phase trains on "
                     "from where the one before stopped")
  return phases


def _curve(workdir: str) -> tuple[dict, dict, dict]:
  """({step: loss}, {step: eval metrics}, {step: eval seconds}) of the workdir's metrics.jsonl."""
  train, evals, eval_s = {}, {}, {}
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return train, evals, eval_s
  with open(path, encoding="utf-8") as f:
    for line in f:
      try:
        row = json.loads(line)
      except ValueError:
        continue  # a line cut short by a killed process (MetricsWriter skips it too)
      step = int(row.get("step", 0))
      if row.get("split") == "train" and "loss" in row:
        train[step] = float(row["loss"])
      elif row.get("split") == "eval":
        evals[step] = {k: v for k, v in row.items()
                       if k not in ("step", "split") + TIMING_KEYS and isinstance(v, (int, float))}
        eval_s[step] = float(row.get("eval_s", 0.0))
  return train, evals, eval_s


def default_check_steps(log_every: int, phase_steps: int, steps_per_s: float,
                        eval_s: dict, budget_s: float = CHECK_SECONDS) -> int:
  """The longest prefix, in whole logging windows (so its last step is compared), whose training
  at `steps_per_s` and recorded evaluations (`eval_s`: {step: seconds}) fit `budget_s`; at least
  one window, at most the phase."""
  if log_every >= phase_steps:
    return phase_steps
  best = log_every
  for n in range(log_every, phase_steps + 1, log_every):
    cost = n / max(steps_per_s, 1e-9) + sum(s for step, s in eval_s.items() if step <= n)
    if cost > budget_s:
      break
    best = n
  return best


def ran_dtype(config: dict, results: dict) -> str:
  """The compute dtype that ran: results.json's when it says, else config.json's."""
  return str(results.get("compute_dtype") or config.get("train", {}).get("compute_dtype", ""))


def record(name: str, workdir: str, commands, curves_dir: str, *, cpu: dict) -> str:
  """Writes claim `name` (`<curves_dir>/<name>.jsonl`) from the finished run in `workdir`, trained
  by `commands` (one per phase, in order); `cpu`: the recording machine's CPU (attn.benchmarks
  .harness.cpu_info()). Returns the record's path. ClaimError (one line) for a bad name, a
  workdir that holds no finished run, or commands that are not the run's."""
  import jax  # pylint: disable=import-outside-toplevel
  import jaxlib  # pylint: disable=import-outside-toplevel
  from attn.training import workdir as workdir_lib  # pylint: disable=import-outside-toplevel
  if not name or os.sep in name or name.startswith(".") or name.endswith(".jsonl"):
    raise ClaimError(f"--record={name!r}: a claim is named by a plain file name (no path "
                     "separator, no leading dot, no .jsonl)")
  if not commands:
    raise ClaimError("--record needs the command that ran the claim: --command=\"python -m ...\" "
                     "(once per phase, in order)")
  for needed in ("config.json", "results.json", "metrics.jsonl"):
    if not os.path.exists(os.path.join(workdir, needed)):
      raise ClaimError(f"{workdir} has no {needed}: not a finished run")
  as_run = files.read_json(os.path.join(workdir, "config.json"))
  results = files.read_json(os.path.join(workdir, "results.json"))
  if not isinstance(as_run, dict) or not isinstance(results, dict):
    raise ClaimError(f"{workdir}: config.json or results.json is not a JSON object")
  application = workdir_lib.recorded_application(workdir)
  if application is None:
    raise ClaimError(f"{workdir}: its records do not say which application trained it")
  phases = _phases(workdir, list(commands), as_run, ran_dtype(as_run, results))
  train, evals, eval_s = _curve(workdir)
  if not train:
    raise ClaimError(f"{workdir}/metrics.jsonl holds no logged training step")
  steps = int(results.get("step", max(train)))
  steps_per_s = steps / max(float(results.get("wall_s", 0.0)), 1e-9)
  first = phases[0]
  head = {
      "claim": name, "application": application, "phases": phases, "steps": steps,
      "compute_dtype": ran_dtype(as_run, results), "jax": jax.__version__,
      "jaxlib": jaxlib.__version__, "cpu": cpu, "steps_per_s": steps_per_s,
      "check_steps": default_check_steps(int(first["config"]["train"].get("log_every", 1)),
                                         first["steps"], steps_per_s, eval_s),
      "tolerance": None}
  os.makedirs(curves_dir, exist_ok=True)
  claim = Claim(os.path.join(curves_dir, f"{name}.jsonl"), head, train, evals)
  claim.write()
  return claim.path


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
  train, evals, _ = _curve(workdir)
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
