"""`Run`: one training run's task, configs, data, model, state and mesh, how far it has come, and
the programs it compiles (the train step, several steps a call, the loss of the current state,
the dropout key) with the shardings the mesh gives them. `attn.training.loop` builds and
trains it."""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading

import jax
import numpy as np
from flax import nnx

from attn.training import distributed, resume
from attn.training.checkpoints import Progress
from attn.training.config import LoopConfig
from attn.training.step import step_key as _step_key
from attn.training.step import train_step, train_steps
from attn.training.task import Task

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Run:
  """What a training run holds, in three parts: what `setup` builds (the task, its configs and
  data, the model, optimizer and their state, the mesh), how far training has come
  (`progress`: what checkpoints save with the state) and whether a model feature was switched
  on since the last checkpoint (`switch`)."""
  workdir: str
  task: Task
  tc: LoopConfig  # the task's train section (Task.train_config)
  mc: object
  bundle: object
  model: object
  optimizer: object
  graphdef: object
  state: object
  mesh: object = None  # ("data", "model") Mesh the state and batches live on; None = default device
  shardings: object = None  # per-leaf NamedSharding of `state` (distributed.state_shardings)
  rows: object = None  # distributed.RowShard: the rows of each global batch this process reads
  donate: bool = False  # the train step donates the old state (train_and_evaluate; not setup(),
  #                       so a benchmark can call the step on run.state again)
  records: object = None  # resume.Records: config.json and model.json, written at the first save
  progress: Progress = dataclasses.field(default_factory=Progress)
  switch: resume.Switch = dataclasses.field(default_factory=resume.Switch)
  # dtype_choice.Choice: the compute dtype `tc` holds and why (train.compute_dtype=auto)
  dtype_choice: object = None

  def step_fn(self, compiler_options: dict | None = None):
    """The jitted train step of `device_batch`'s batches (the task's loss options bound; XLA
    `compiler_options`, None: the task's, `Task.compiler_options`): the state keeps its
    shardings (replicated, or the vocabulary matrices over "model"), the rows are split over
    "data", the metrics replicated."""
    fn = functools.partial(train_step, self.task, self.graphdef,
                           **self.task.loss_options(self.tc))
    if compiler_options is None:
      compiler_options = self.task.compiler_options(self.tc, self.mc)
    kw = dict(donate_argnums=(0,) if self.donate else (), compiler_options=compiler_options)
    if self.mesh is not None:
      rep = distributed.replicated(self.mesh)
      kw.update(in_shardings=(self.shardings, distributed.batch_sharding(self.mesh), rep),
                out_shardings=(self.shardings, rep))
    return jax.jit(fn, **kw)

  def steps_fn(self):
    """The jitted `train_steps` (train.steps_per_call): (state, the steps' device batches
    stacked on a leading axis (`device_batches`), seed, first step) -> (state, the last step's
    metrics), with the step's shardings and options."""
    fn = functools.partial(train_steps, self.task, self.graphdef,
                           **self.task.loss_options(self.tc))
    kw = dict(donate_argnums=(0,) if self.donate else (),
              compiler_options=self.task.compiler_options(self.tc, self.mc))
    if self.mesh is not None:
      rep = distributed.replicated(self.mesh)
      kw.update(in_shardings=(self.shardings, distributed.stacked_batch_sharding(self.mesh), rep,
                              rep), out_shardings=(self.shardings, rep))
    return jax.jit(fn, **kw)

  def device_batches(self, batches) -> dict | None:
    """Host batches of consecutive steps as one stacked global batch ([n, rows, ...] arrays),
    or None when their shapes differ (buckets): those steps then run one by one."""
    local = [self.task.device_batch(b) for b in batches]
    shapes = {tuple((k, np.shape(v)) for k, v in sorted(b.items())) for b in local}
    if len(shapes) > 1:
      return None
    stacked = {k: np.stack([b[k] for b in local]) for k in local[0]}
    if self.mesh is None:
      return jax.device_put(stacked)
    return jax.device_put(stacked, distributed.stacked_batch_sharding(self.mesh))

  def device_batch(self, batch) -> dict:
    """A host batch (this process's rows: `rows`) as the global arrays the step takes."""
    batch = self.task.device_batch(batch)
    if self.mesh is None:
      return batch
    return distributed.global_batch(batch, self.mesh, self.rows)

  @functools.cached_property
  def state_loss_fn(self):
    """jit of (state, global batch) -> (summed loss, tokens, summed NLL), replicated: the loss
    of the current parameters on a training batch, without dropout, with the task's loss options
    (`Task.loss_options`), computed over the mesh like the step. One program serves the
    divergence check before a save and an application's figures of the final parameters."""
    options = self.task.loss_options(self.tc)

    def loss(state, batch):
      model, _ = nnx.merge(self.graphdef, state)
      return self.task.loss(model, batch, **options)
    return jax.jit(loss, **({} if self.mesh is None
                            else {"out_shardings": distributed.replicated(self.mesh)}))

  def compile_state_loss(self, batch) -> threading.Thread:
    """Starts compiling `state_loss_fn` for the state and host batch `batch`'s device shapes in
    a thread of its own, and returns the thread (join it before the run ends). The loop calls it
    where several steps run a call: a small model's step leaves a core idle, and its loss program,
    first needed at the first save, is then compiled beside the steps instead of after them."""
    fn = self.state_loss_fn  # made here: the thread only compiles it
    # Without a mesh the call's arguments are uncommitted (the default device's state, a numpy
    # batch), and so must the abstract ones be, or jit keys the call apart and compiles again.
    placed = lambda x: None if self.mesh is None else x.sharding
    abstract = lambda tree: jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=placed(x)), tree)
    args = abstract(self.state), abstract(self.device_batch(batch))

    def compile_():
      try:
        fn.lower(*args).compile()  # fills fn's cache: its first call does not compile again
      except Exception as e:  # pylint: disable=broad-except  (the first call compiles and raises)
        log.debug(f"compiling the loss program ahead failed: {e}")
    thread = threading.Thread(target=compile_, name="compile-state-loss", daemon=True)
    thread.start()
    return thread

  def step_key(self, step: int):
    """The dropout key of `step`: a function of the seed and the step only, so a resumed run
    draws the same masks as an uninterrupted one and no two steps share a mask. Replicated over
    the mesh, where there is one."""
    seed, step = np.int32(self.tc.seed + 1), np.int32(step)
    if self.mesh is None:
      return _step_key(seed, step)
    sharding = distributed.replicated(self.mesh)
    if jax.process_count() > 1:  # every process's key, placed as one global array
      return distributed.place(_step_key(seed, step), sharding)
    return _step_key(seed, step, sharding=sharding)
