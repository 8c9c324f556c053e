"""What a resumed run may do, decided once its checkpoint is restored and before any record of
the workdir is rewritten.

- `check_progress`: a run that would train no step although the command asks it to (more
  `train.steps`, or a model feature switched on) stops with one line that says why and what to
  raise, instead of decoding the old model again and exiting 0. `train.max_wall_s` is the budget
  of the whole run, counted across resumes (a resumed run keeps the comparisons it was set up
  for); rerunning a finished command unchanged still decodes and scores the test split again.
- `Records`: config.json and model.json describe the model the checkpoints hold. After a switch
  (`ModelConfig.SWITCH_ON_WHEN_RESUMING`) they are written only once a checkpoint of the switched
  model is saved, so a switched phase that is killed (or refused) before its first save leaves
  the workdir as it was: resumable with the switch or without it.
"""

from __future__ import annotations

import dataclasses
import logging
import os

from attn.common import files
from attn.errors import ConfigError
from attn.training import distributed
from attn.training import workdir as workdir_lib
from attn.training.config import config_record

log = logging.getLogger(__name__)


def recorded_train(workdir: str) -> dict:
  """The `train` section of the workdir's config.json (the last run's command); {} if none."""
  return recorded_section(workdir, "train")


def recorded_section(workdir: str, name: str) -> dict:
  """Section `name` of the workdir's config.json (the last run's command); {} if none."""
  config = files.read_json(os.path.join(workdir, "config.json"))
  section = config.get(name) if isinstance(config, dict) else None
  return section if isinstance(section, dict) else {}


def _why_nothing(run) -> str:
  tc, p = run.tc, run.progress
  if p.step >= tc.steps:
    return (f"the checkpoint is at step {p.step} and train.steps={tc.steps}: raise "
            f"--config.train.steps above {p.step}")
  return (f"train.max_wall_s={tc.max_wall_s:g} is spent: the run has trained {p.wall_s:.0f} s "
          f"(to step {p.step} of {tc.steps}), and the budget counts the whole run across "
          f"resumes: raise --config.train.max_wall_s above {p.wall_s:.0f}")


def check_progress(run, previous_train: dict, switched: dict) -> None:
  """Raises ConfigError when the restored `run` can train no further step but the command asks
  for training: `switched` (model fields switched on since the checkpoint, by dotted path) is
  not empty, or train.steps was raised above `previous_train`'s. Otherwise a run with nothing
  left to train says so and goes on to decode."""
  tc, p = run.tc, run.progress
  if p.step < tc.steps and not (tc.max_wall_s and p.wall_s >= tc.max_wall_s):
    return
  if switched:
    names = ", ".join(f"model.{k}" for k in sorted(switched))
    raise ConfigError(
        f"{names} switched on, but this run would train no step with it: {_why_nothing(run)}. "
        "Nothing was changed in the workdir")
  before = previous_train.get("steps")
  if isinstance(before, int) and tc.steps > before:
    raise ConfigError(f"train.steps was raised from {before} to {tc.steps}, but this run would "
                      f"train no step: {_why_nothing(run)}. Nothing was changed in the workdir")
  log.info(f"nothing left to train ({_why_nothing(run)}); decoding the test split with the "
           "checkpoint chosen so far")


@dataclasses.dataclass
class Switch:
  """Model features switched on since the workdir's checkpoints were written
  (`ModelConfig.SWITCH_ON_WHEN_RESUMING`; workdir.check_model)."""
  switched: dict = dataclasses.field(default_factory=dict)  # those features, by dotted path
  # The abstract state of the model before the switch, for restoring its checkpoints (None: no
  # switch; attn.training.checkpoints.Checkpoints.restore)
  earlier_state: object = None
  restored_earlier: bool = False  # the last restore read a checkpoint from before the switch


class Records:
  """Writes config.json and model.json of `config` (process 0 only), now or at the first save
  of the model they describe (`pending`; see the module docstring)."""

  def __init__(self, config, workdir: str, model_config):
    self.config, self.workdir, self.mc = config, workdir, model_config
    self.pending = True

  def write(self) -> None:
    if self.pending and distributed.is_primary():
      files.write_text(os.path.join(self.workdir, "config.json"), config_record(self.config))
      workdir_lib.record_model(self.workdir, self.mc)
    self.pending = False


def save(ckpt, manager, run) -> None:
  """Saves `run` with `manager` (ckpt.latest or ckpt.best; attn.training.checkpoints), then
  writes the run's records if they are still pending: they now describe a saved model."""
  ckpt.save(manager, run)
  if run.records is not None:
    run.records.write()
