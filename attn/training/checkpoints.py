"""Orbax checkpoints of a run: `checkpoints/` keeps the latest step (to resume), `best/` the best
eval score (what the test split is decoded with)."""

from __future__ import annotations

import os

import jax


class Checkpoints:
  """Two orbax managers over `nnx.state((model, optimizer))` plus a JSON of the run's counters.

  A run object passed to `save` / `restore` has `state`, `step`, `best_score`, `wall_s` and
  `train_tokens`; restore writes them back.
  """

  def __init__(self, workdir):
    import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
    self.ocp = ocp
    opts = lambda **kw: ocp.CheckpointManagerOptions(max_to_keep=1, create=True, **kw)
    self.latest = ocp.CheckpointManager(os.path.join(os.path.abspath(workdir), "checkpoints"),
                                        options=opts(enable_async_checkpointing=True))
    self.best = ocp.CheckpointManager(os.path.join(os.path.abspath(workdir), "best"),
                                      options=opts(enable_async_checkpointing=False))

  def save(self, manager, run):
    meta = {"step": run.step, "best_score": float(run.best_score), "wall_s": run.wall_s,
            "train_tokens": run.train_tokens}
    manager.save(run.step, args=self.ocp.args.Composite(
        state=self.ocp.args.StandardSave(run.state), meta=self.ocp.args.JsonSave(meta)), force=True)

  def restore(self, manager, run) -> bool:
    """Restores the manager's latest step into `run`; False when it holds none."""
    step = manager.latest_step()
    if step is None:
      return False
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), run.state)
    out = manager.restore(step, args=self.ocp.args.Composite(
        state=self.ocp.args.StandardRestore(abstract), meta=self.ocp.args.JsonRestore()))
    run.state = out["state"]
    run.step, run.best_score = int(out["meta"]["step"]), float(out["meta"]["best_score"])
    run.wall_s, run.train_tokens = float(out["meta"]["wall_s"]), float(out["meta"]["train_tokens"])
    return True

  def wait(self):
    self.latest.wait_until_finished()
    self.best.wait_until_finished()
