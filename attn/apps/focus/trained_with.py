"""The settings a sweep's trained models depend on, recorded beside them, so that a rerun with other
settings cannot reuse models trained on other data.

The focus and retrieve sweeps resume: rerunning a command finds each finished model (and resumes
an interrupted one) in <workdir>/runs/, and then writes results that record the command's
settings. A rerun with another --train_size or --seed used to reuse the old models and record the
new settings. `write` records, in trained_with.json, the settings the models train with (their
data, their initialization and batches, their optimizer and architecture) before any model
trains; `check` refuses, before anything is written, a rerun whose settings differ, in one line
naming each differing setting as its flag (there vs here), as a resumed run with other vocabulary
settings is refused (attn.data.vocab_record).

Settings that only measure or show the models (the test set, temperatures, sample stories, which
normalizers or modes to report) are not recorded: a rerun re-measures the finished models with
them. `steps` may be raised (each run trains on from its checkpoint to the new count, the loop's
resumption), never lowered (the models would have trained more steps than the results say).

A workdir written before trained_with.json existed: the settings are read back from the
config.json of each of its runs that holds a checkpoint (the sweep's `settings_of_run`); a
workdir without one holds no trained model. A trained_with.json that is there but cannot be read
is refused, not passed over for the runs' configs (and then rewritten): it is the evidence.
"""

from __future__ import annotations

import json
import os
from typing import Callable

from attn.common.files import read_json, write_json
from attn.training import workdir as workdir_lib

SETTINGS_FILE = "trained_with.json"
RAISABLE = ("steps",)  # settings a rerun may raise (the runs train on), never lower


def as_json(value):
  """A setting as JSON reads it back (tuples as lists), for comparing."""
  if isinstance(value, (tuple, list)):
    return [as_json(v) for v in value]
  if isinstance(value, dict):
    return {k: as_json(v) for k, v in value.items()}
  return value


def recorded(workdir: str, runs_dir: str,
             settings_of_run: Callable[[dict], dict]) -> list[tuple[str, dict]]:
  """(where, settings) of what `workdir`'s models were trained with: trained_with.json's, else
  (older workdirs, without the file) those of the config.json of each run in `runs_dir` that
  holds a checkpoint (`settings_of_run` reads one); [] when the workdir records none. A
  WorkdirError naming trained_with.json when it is there but not a JSON object."""
  path = os.path.join(workdir, SETTINGS_FILE)
  if os.path.lexists(path):
    return [(path, _read_record(path))]
  found = []
  names = sorted(os.listdir(runs_dir)) if os.path.isdir(runs_dir) else []
  for run in (os.path.join(runs_dir, n) for n in names):
    config = read_json(os.path.join(run, "config.json"))
    if workdir_lib.has_checkpoints(run) and isinstance(config, dict):
      try:
        found.append((os.path.join(run, "config.json"), settings_of_run(config)))
      except (KeyError, TypeError, AttributeError):  # a record of another layout: not evidence
        continue
  return found


def check(workdir: str, here: dict, records: list[tuple[str, dict]], what: str) -> None:
  """Raises WorkdirError when `here` (setting -> value, named as the flags) differs from a
  recorded setting of `records` (`recorded`); `what` names the models ("readers"). Reads only."""
  here = as_json(here)
  for where, there in records:
    differ = [k for k in here if k in there and there[k] != here[k]
              and not (k in RAISABLE and _raised(there[k], here[k]))]
    if differ:
      shown = ", ".join(f"{k}={_show(there[k])} there, {_show(here[k])} here" for k in differ)
      raise workdir_lib.WorkdirError(
          f"workdir {workdir} holds {what} trained with other settings ({shown}; recorded in "
          f"{where}); rerun with its settings or use another --workdir")


def write(workdir: str, here: dict) -> None:
  """Records `here` as the settings the models in `workdir` train with."""
  write_json(os.path.join(workdir, SETTINGS_FILE), as_json(here))


def _read_record(path: str) -> dict:
  """The settings trained_with.json at `path` records; a WorkdirError naming it when it cannot
  be read (cut short, not JSON, not an object): falling back to the runs' configs would check
  against other evidence and then overwrite the record with this command's settings."""
  try:
    with open(path, encoding="utf-8") as f:
      record = json.load(f)
  except (OSError, ValueError) as e:  # ValueError: JSONDecodeError, UnicodeDecodeError
    detail = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'no detail'}"
  else:
    if isinstance(record, dict):
      return record
    detail = f"a JSON {type(record).__name__}, not an object"
  raise workdir_lib.WorkdirError(
      f"{path}: the record of what this workdir's models were trained with cannot be read "
      f"({detail}): delete it to fall back to the runs' configs, or use another --workdir")


def _raised(there, here) -> bool:
  return isinstance(there, int) and isinstance(here, int) and here > there


def _show(value) -> str:
  return ",".join(map(str, value)) if isinstance(value, list) else str(value)
