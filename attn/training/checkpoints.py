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
import os

import jax

from attn.errors import AttnError
from attn.training.workdir import WorkdirError


class CheckpointError(AttnError):
  """A checkpoint could not be written."""


class Checkpoints:
  """Two orbax managers over `nnx.state((model, optimizer))` plus a JSON of the run's counters.

  A run object passed to `save` / `restore` has `state`, `step`, `best_score` (a tuple: the
  task's selection metrics, compared lexicographically), `best_step`, `wall_s`,
  `best_eval`, `train_tokens` and `eval_pending`; restore writes them back.
  """

  def __init__(self, workdir, keep: int = 1):
    """keep: how many of the latest steps checkpoints/ holds (more than one for averaging them,
    attn.training.averaging); best/ holds one."""
    import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
    self.ocp = ocp
    opts = lambda n: ocp.CheckpointManagerOptions(max_to_keep=n, create=True,
                                                  enable_async_checkpointing=False)
    self.latest_dir = os.path.join(os.path.abspath(workdir), "checkpoints")
    self.latest = ocp.CheckpointManager(self.latest_dir, options=opts(keep))
    self.best = ocp.CheckpointManager(os.path.join(os.path.abspath(workdir), "best"),
                                      options=opts(1))

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
    meta = {"step": run.step, "best_score": list(run.best_score), "best_step": run.best_step,
            "best_eval": run.best_eval, "wall_s": run.wall_s, "train_tokens": run.train_tokens,
            "eval_pending": bool(getattr(run, "eval_pending", False))}
    try:
      manager.save(run.step, args=self.ocp.args.Composite(
          state=self.ocp.args.StandardSave(run.state), meta=self.ocp.args.JsonSave(meta)),
                   force=True)
    except Exception as e:  # pylint: disable=broad-except  (orbax re-raises the writer's error)
      raise self._failed(run.step, e) from e

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
    earlier = getattr(run, "earlier_state", None)
    run.restored_earlier = False
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
        run.restored_earlier = True
    meta = out["meta"]
    run.state = state
    run.step = int(meta["step"])
    best = meta["best_score"]
    run.best_score = tuple(best) if isinstance(best, list) else (float(best),)
    run.best_step = int(meta.get("best_step", run.step))
    run.best_eval = dict(meta.get("best_eval", {}))
    run.wall_s, run.train_tokens = float(meta["wall_s"]), float(meta["train_tokens"])
    run.eval_pending = bool(meta.get("eval_pending", False))  # interrupted during its evaluation
    return True

  def close(self):
    """Stops orbax's threads. Never raises: it runs on the way out, possibly behind an error
    already being reported (a failed save), which must stay the one that is shown."""
    for manager in (self.latest, self.best):
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
