"""Orbax checkpoints of a run: `checkpoints/` keeps the latest step (to resume), `best/` the best
eval score (what the test split is decoded with).

Saves are synchronous: a save that fails (a full disk, a quota) stops the run at that step with a
CheckpointError, before another step is taken. (Asynchronous saves let training run on for steps
it could not keep and report the failure only later, through orbax's worker threads.) A save
costs one write of the parameters and optimizer state every `train.checkpoint_every` steps.
Orbax writes each step to a temporary directory and renames it when complete, so earlier
checkpoints stay restorable.

Several processes (jax.distributed): every process calls save and restore with the same step;
orbax writes each array shard once and the metadata (and the JSON of counters) from process 0,
so the workdir must be on a filesystem that every host sees. Restore reshards onto the current
mesh: a checkpoint saved on 4 devices restores on 1, and the other way round.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os

import jax

from attn.errors import AttnError
from attn.training.workdir import WorkdirError


class CheckpointError(AttnError):
  """A checkpoint could not be written."""


@dataclasses.dataclass
class Progress:
  """How far a run has come: the counters a checkpoint saves with the state (all but
  `window_rates`, this process's own timing) and restores."""
  step: int = 0
  best_score: tuple = ()  # the task's selection metrics at the best eval so far (() = none yet)
  best_step: int = 0
  best_eval: dict = dataclasses.field(default_factory=dict)  # that eval's float metrics
  wall_s: float = 0.0  # training wall time accumulated across restarts
  train_tokens: float = 0.0  # tokens (or positions) the loss counted, across restarts
  eval_pending: bool = False  # the evaluation due at `step` has not finished (saved with it)
  window_rates: list = dataclasses.field(default_factory=list)  # tok/s of each logging window

  def record(self) -> dict:
    """The JSON a checkpoint stores (`window_rates` left out)."""
    return {"step": self.step, "best_score": list(self.best_score), "best_step": self.best_step,
            "best_eval": self.best_eval, "wall_s": self.wall_s,
            "train_tokens": self.train_tokens, "eval_pending": bool(self.eval_pending)}

  @classmethod
  def from_record(cls, meta: dict, window_rates=()) -> "Progress":
    """The progress of a checkpoint's JSON (older checkpoints: a float best_score, no
    best_step, best_eval or eval_pending), keeping this process's `window_rates`."""
    step, best = int(meta["step"]), meta["best_score"]
    return cls(step=step, best_score=tuple(best) if isinstance(best, list) else (float(best),),
               best_step=int(meta.get("best_step", step)),
               best_eval=dict(meta.get("best_eval", {})), wall_s=float(meta["wall_s"]),
               train_tokens=float(meta["train_tokens"]),
               eval_pending=bool(meta.get("eval_pending", False)),  # Ctrl-C before its eval ended
               window_rates=list(window_rates))


class Checkpoints:
  """Two orbax managers over `nnx.state((model, optimizer))` plus a JSON of the run's counters.

  A run object passed to `save` / `restore` has `state`, `progress` (a `Progress`) and
  `switch` (`earlier_state`: the abstract state from before a model feature was switched on,
  or None; restore sets `restored_earlier`); restore writes state and progress back.
  """

  def __init__(self, workdir, keep: int = 1):
    """keep: how many of the latest steps checkpoints/ holds (more than one for averaging them,
    attn.training.averaging); best/ holds one."""
    import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
    self.ocp = ocp
    self.workdir = os.path.abspath(workdir)
    self.latest_dir = os.path.join(self.workdir, "checkpoints")
    self.latest = ocp.CheckpointManager(self.latest_dir, options=self._options(keep))

  def _options(self, keep: int):
    return self.ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                             enable_async_checkpointing=False)

  @functools.cached_property
  def best(self):
    """best/'s manager, made when first asked for: a run with no eval split never is, and a
    manager costs a tenth of a second of a reader's few seconds (its threads, its directory)."""
    return self.ocp.CheckpointManager(os.path.join(self.workdir, "best"),
                                      options=self._options(1))

  def _committed_steps(self) -> list[int]:
    """Steps whose save completed, read from disk (a failed save leaves only a -tmp directory)."""
    if not os.path.isdir(self.latest_dir):
      return []
    return sorted(int(n) for n in os.listdir(self.latest_dir) if n.isdigit())

  def _failed(self, step, err) -> CheckpointError:
    kept = (self._committed_steps() or [None])[-1]
    reason = " ".join(str(err).split())[:300]
    return CheckpointError(
        f"saving the checkpoint of step {step} failed ({type(err).__name__}: {reason}); training "
        f"stopped. " + (f"The checkpoint of step {kept} is intact: free space and rerun the same "
                        "command to resume" if kept is not None else "No checkpoint was kept"))

  def save(self, manager, run):
    """Saves `run.state` and `run.progress` as step `run.progress.step` of `manager`."""
    meta = run.progress.record()
    try:
      manager.save(run.progress.step, args=self.ocp.args.Composite(
          state=self.ocp.args.StandardSave(run.state), meta=self.ocp.args.JsonSave(meta)),
                   force=True)
    except Exception as e:  # pylint: disable=broad-except  (orbax re-raises the writer's error)
      raise self._failed(run.progress.step, e) from e

  def restore(self, manager, run, step: int | None = None) -> bool:
    """Restores the manager's `step` (None: its latest) into `run`; False when it holds none."""
    step = manager.latest_step() if step is None else step
    if step is None:
      return False
    # The target carries the current shardings, so a checkpoint written on another mesh (4
    # devices, 2 hosts) restores onto this one: orbax stores arrays, not a device layout.
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), run.state)
    restore = lambda target: manager.restore(step, args=self.ocp.args.Composite(
        state=self.ocp.args.StandardRestore(target), meta=self.ocp.args.JsonRestore()))
    earlier = run.switch.earlier_state
    run.switch.restored_earlier = False
    if earlier is None:
      out = restore(abstract)
      state = out["state"]
    else:
      # A run that switched a model feature on (ModelConfig.SWITCH_ON_WHEN_RESUMING) may hold
      # checkpoints written before the switch, without the new parameters: restore those into
      # the earlier model's state and keep the new parameters' (zero) initial values.
      try:
        out = restore(abstract)
        state = out["state"]
      except Exception:  # pylint: disable=broad-except  (orbax: the trees differ)
        out = restore(_with_shardings(earlier, run.state))
        state = graft(run.state, out["state"])
        run.switch.restored_earlier = True
    run.state = state
    run.progress = Progress.from_record(out["meta"], run.progress.window_rates)
    return True

  def close(self):
    """Stops orbax's threads. Never raises: it runs on the way out, possibly behind an error
    already being reported (a failed save), which must stay the one that is shown."""
    for manager in (self.latest, self.__dict__.get("best")):
      with contextlib.suppress(Exception):
        manager.close()


def _by_path(tree) -> dict:
  return {jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_leaves_with_path(tree)}


def _with_shardings(earlier, current):
  """The abstract `earlier` state with the sharding of the same leaf in `current`."""
  placed = _by_path(current)
  return jax.tree_util.tree_map_with_path(
      lambda p, x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                        sharding=placed[jax.tree_util.keystr(p)].sharding),
      earlier)


def graft(current, restored):
  """`current` with every leaf that `restored` also holds (same path) taken from `restored`."""
  old = _by_path(restored)
  return jax.tree_util.tree_map_with_path(
      lambda p, x: old.get(jax.tree_util.keystr(p), x), current)


def restore_for_reading(workdir: str, run, directory: str | None = None) -> None:
  """Restores a finished run's best checkpoint (else its latest) into `run`, for the tools that
  read a run without training it; a WorkdirError when `workdir` holds neither. `directory`: a
  checkpoint directory of the run to restore instead (a kept mark, attn.training.marks)."""
  ckpt = Checkpoints(workdir)
  try:
    if directory is not None:
      manager = ckpt.ocp.CheckpointManager(os.path.abspath(directory))
      try:
        if not ckpt.restore(manager, run):
          raise WorkdirError(f"{directory} holds no checkpoint to restore")
      finally:
        manager.close()
    elif not (ckpt.restore(ckpt.best, run) or ckpt.restore(ckpt.latest, run)):
      raise WorkdirError(f"{workdir} holds no checkpoint to restore")
  finally:
    ckpt.close()
