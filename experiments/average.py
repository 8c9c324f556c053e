r"""Averages the parameters of a finished run's last checkpoints into its averaged/ checkpoint.

    # a run that kept its last 5 checkpoints (one every train.checkpoint_every steps)
    python -m experiments.translate --config=experiments/configs/translate.py:multi30k_subword \
        --config.train.keep_checkpoints=5 --workdir=workdirs/m30k_subword
    python -m experiments.average --workdirs=workdirs/m30k_subword --last=5
    python -m experiments.score --workdirs=workdirs/m30k_subword --checkpoints=best,averaged \
        --out=workdirs/scores_averaged

Prints, for each run, the average's scores on the eval split beside best/'s (the choice between
them is made there, never on a test split) and writes `<workdir>/averaged/` with average.json.
See attn/training/averaging.py.
"""

from __future__ import annotations

import dataclasses
import functools


import attn.apps  # noqa: F401  (registers the built-in applications)
from attn.config.configurable import option
from attn.errors import ConfigError
from attn.launching import cli, entry_points



def averaged_experiments() -> tuple[str, ...]:
  """The experiments whose runs are averaged here: those experiments.score scores again (their
  task's `rescored` scores), which the averaged checkpoint is then scored with."""
  return tuple(n for n, exp in entry_points.EXPERIMENTS.items()
               if getattr(exp.task_class, "rescored", ()))


@dataclasses.dataclass(frozen=True)
class AverageSettings:
  """The flags of `python -m experiments.average`."""
  workdirs: tuple[str, ...] = option((), "Finished runs (translate or summarize), comma-separated.")
  last: int = option(5, "How many of each run's latest checkpoints to average (the run must have "
                        "kept them: train.keep_checkpoints).")

  def __post_init__(self):
    if not self.workdirs:
      raise ConfigError("--workdirs: give at least one finished run")
    if self.last < 2:
      raise ConfigError(f"--last={self.last}: averaging needs at least 2 checkpoints")


def _line(workdir: str, info: dict) -> str:
  keys = [k for k in info["eval"] if k in info["best_eval"] and k != "nll"]
  pair = lambda k: f"{k} {info['eval'][k]:.3f} (best/ {info['best_eval'][k]:.3f})"
  return (f"{workdir}: average of steps {', '.join(map(str, info['steps']))} on the eval split: "
          + ", ".join(pair(k) for k in keys) + f"; best/ is step {info['best_step']}")


def main(argv):
  del argv
  settings = cli.settings_from_flags(AverageSettings)
  tasks = entry_points.finished_experiments(settings.workdirs, averaged_experiments())
  # pylint: disable-next=import-outside-toplevel  (after flag parsing: jax, the data libraries)
  from attn.training import averaging
  progress = functools.partial(print, flush=True)
  for workdir, task in tasks.items():
    info = averaging.average_last(workdir, settings.last, task, progress=progress)
    print(_line(workdir, info), flush=True)


if __name__ == "__main__":
  cli.define_settings_flags(AverageSettings)  # (--workdirs: AverageSettings refuses none)
  cli.run(main)
