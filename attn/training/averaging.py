"""Checkpoint averaging: the parameters of a run's last few checkpoints, averaged.

    info = averaging.average_last("workdirs/m30k_subword", last=5)   # writes averaged/

Averaging the parameters of the last checkpoints of a run (Vaswani et al. 2017 sec. 6.1: the last
5, written every 10 minutes) smooths the noise of the last updates, like a final learning-rate
decay, at no training cost. The run must have kept them: `train.keep_checkpoints` >= `last`
(checkpoints/ keeps the latest `keep_checkpoints` steps, one every `train.checkpoint_every`).

The average of every parameter (nnx.Param) goes to `<workdir>/averaged/` as a checkpoint of the
run's format (the other variables and the optimizer state are the latest step's), with
average.json: the steps averaged, the average's scores on the eval split (greedy, as training
evaluates) and best/'s, so that the choice between them is made on the eval split only.
`experiments.score --checkpoints=averaged` decodes the test splits with it. The directory is
written to averaged.tmp/ and renamed, so it is complete or absent; a rerun replaces it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from attn.errors import ConfigError
from attn.training import evaluation
from attn.training.checkpoints import Checkpoints
from attn.training.building import load_run

log = logging.getLogger(__name__)

AVERAGED_DIR = "averaged"
INFO = "average.json"


def averaged_dir(workdir: str) -> str:
  return os.path.join(os.path.abspath(workdir), AVERAGED_DIR)


def read_info(workdir: str) -> dict | None:
  """average.json of the workdir's averaged checkpoint; None when it has none."""
  path = os.path.join(averaged_dir(workdir), INFO)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def mean_tree(trees):
  """The leafwise mean of same-structured pytrees, accumulated in float32 (a bf16 or f16 leaf keeps
  its dtype); integer leaves are the last tree's."""
  def mean(*xs):
    if not jnp.issubdtype(xs[-1].dtype, jnp.floating):
      return xs[-1]
    total = sum(x.astype(jnp.float32) for x in xs)
    return (total / len(xs)).astype(xs[-1].dtype)
  return jax.tree.map(mean, *trees)


def average_last(workdir: str, last: int, task: str = "translate", *,
                 progress: Callable[[str], None] = log.info) -> dict:
  """Averages the parameters of the last `last` checkpoints of `workdir`, evaluates the average on
  the eval split and writes averaged/ (see the module docstring). Returns average.json's dict."""
  if last < 2:
    raise ConfigError(f"--last={last}: averaging needs at least 2 checkpoints")
  run = load_run(workdir, task)
  ckpt = Checkpoints(workdir, keep=run.tc.keep_checkpoints)
  try:
    steps = ckpt.latest.all_steps()
    steps = sorted(steps)[-last:]
    if len(steps) < last:
      raise ConfigError(
          f"{workdir} keeps {len(steps)} checkpoint(s) (steps {steps}), fewer than --last={last}: "
          f"train it with --config.train.keep_checkpoints={last} (it keeps "
          f"{run.tc.keep_checkpoints})")
    best_eval = dict(run.progress.best_eval)
    params = []
    for step in steps:
      progress(f"{workdir}: reading the checkpoint of step {step}")
      ckpt.restore(ckpt.latest, run, step=step)
      nnx.update((run.model, run.optimizer), run.state)
      # A copy: the next restore updates the model's variables in place.
      params.append(jax.tree.map(jnp.asarray, nnx.state(run.model, nnx.Param)))
    nnx.update(run.model, mean_tree(params))
    run.state = nnx.state((run.model, run.optimizer))
    progress(f"{workdir}: evaluating the average of steps {steps} on the eval split")
    ev = evaluation.evaluate(run, "eval", run.tc.eval_decode_sentences)
    info = {"steps": steps, "step": steps[-1], "wall_s": run.progress.wall_s,
            "eval": {k: v for k, v in ev.items() if isinstance(v, float)},
            "best_step": run.progress.best_step, "best_eval": best_eval}
    _write(ckpt, run, workdir, info)
  finally:
    ckpt.close()
  return info


def _write(ckpt: Checkpoints, run, workdir: str, info: dict) -> None:
  target = averaged_dir(workdir)
  tmp = target + ".tmp"
  shutil.rmtree(tmp, ignore_errors=True)  # left by a write that was cut off
  manager = ckpt.ocp.CheckpointManager(tmp, options=ckpt.ocp.CheckpointManagerOptions(
      max_to_keep=1, create=True, enable_async_checkpointing=False))
  try:
    ckpt.save(manager, run)
  finally:
    manager.close()
  with open(os.path.join(tmp, INFO), "w") as f:
    json.dump(info, f, indent=1)
  shutil.rmtree(target, ignore_errors=True)
  os.replace(tmp, target)
  # Decodings of an earlier average (experiments.score's cache) no longer hold.
  shutil.rmtree(os.path.join(os.path.abspath(workdir), "scores", AVERAGED_DIR), ignore_errors=True)
