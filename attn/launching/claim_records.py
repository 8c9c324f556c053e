"""A headline claim's record: writing it from a finished run (`record`) and reading it back
(`load_claim`); attn.launching.claims checks a rerun against it.

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
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shlex

from attn.common import files
from attn.errors import AttnError

log = logging.getLogger(__name__)

CHECK_SECONDS = 600.0  # what the default prefix is sized to take on the recording machine
TIMING_KEYS = ("eval_s", "tokens_per_sec")  # logged figures of speed, not of the model
AUTO = "auto"  # train.compute_dtype chosen when the run starts (config.json records the choice)


class ClaimError(AttnError, ValueError):
  """An unknown claim, a claim record that cannot be read, or a check that cannot be made."""


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


def curve_of(workdir: str) -> tuple[dict, dict, dict]:
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
  train, evals, eval_s = curve_of(workdir)
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
