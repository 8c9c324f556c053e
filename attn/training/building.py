"""From an experiment config to a Run: the config checked (`validate_config`), the device mesh
(`make_mesh`), the data, model and optimizer built (`setup`, `build_run`; train.compute_dtype=auto
resolved here, attn.training.dtype_choice), and a finished run restored for reading (`load_run`).
attn.training.loop trains what these build. Library code: it never reads absl FLAGS."""

from __future__ import annotations

import json
import logging
import os

import jax
from flax import nnx

from attn.errors import ConfigError
from attn.training import distributed, dtype_choice, resume
from attn.training import workdir as workdir_lib
from attn.training.checkpoints import restore_for_reading
from attn.training.config import LoopConfig, migrate_config
from attn.training.run import Run
from attn.training.task import SECTIONS, Task, application_of, check_section_names, get_task

log = logging.getLogger(__name__)


def validate_config(config, task: Task | str = "translate") -> LoopConfig:
  """Checks every section of an experiment config without reading data or building the model:
  raises ConfigError / DataError naming the first bad field. Returns the train section.

  Whatever the task's own checks, every field its `sections` declare as a registry name is
  checked here first (attn.training.task.check_section_names): an application gets that
  without writing a check of its own."""
  task = get_task(task) if isinstance(task, str) else task
  for section in SECTIONS:
    if section not in config:
      raise ConfigError(f"the config has no `{section}` section")
  check_section_names(task, config)
  tc = task.train_config(config.train)
  task.check_model_config(config.model, task.data_config(config.data), tc)
  return tc


def make_mesh(config, tc: LoopConfig, task: Task | str = "translate"):
  """The device mesh of `train.mesh_shape`, checked against the devices and the batch size
  (ConfigError before anything is written)."""
  task = get_task(task) if isinstance(task, str) else task
  mesh = distributed.make_mesh(tc.mesh_shape)
  if tc.steps_per_call > 1 and jax.process_count() > 1:
    raise ConfigError(f"train.steps_per_call={tc.steps_per_call}: several steps a call stack "
                      "one process's batches; with several processes set it to 1")
  dc = task.data_config(config.data)
  # (tokens_per_batch: 0, fixed batch sizes, for a data section that does not size by tokens)
  distributed.check_batch_rows(dc.batch_size, getattr(dc, "tokens_per_batch", 0),
                               distributed.data_size(mesh), tc.mesh_shape)
  return mesh


def setup(config, workdir, task: Task | str = "translate") -> Run:
  """Validates the config, loads the data and builds the model and optimizer of a run.

  Nothing is written before the whole config is valid; config.json is replaced atomically, and
  only once the workdir is known to hold no checkpoints of another model.
  """
  name = task if isinstance(task, str) else application_of(task)
  task = get_task(task) if isinstance(task, str) else task
  tc = validate_config(config, task)
  mesh = make_mesh(config, tc, task)
  task.check_data(config.data)  # a missing data file: refused before the workdir is touched
  workdir_lib.prepare(workdir)
  workdir_lib.claim(workdir, name)
  return build_run(config, workdir, task, tc, mesh=mesh)


def build_run(config, workdir, task: Task, tc: LoopConfig, *, record=True, mesh=None) -> Run:
  """setup() after validation, on a prepared workdir (record=False: write no config or model
  record, for reading a finished run, or for train_and_evaluate, which writes them once it has
  restored the checkpoint; mesh=None: the state stays on the default device).

  With several processes, process 0 prepares the data (cache, vocabularies) before the others
  read it, and alone writes config.json and the model record."""
  with distributed.primary_first("preparing the data"):
    bundle = task.load_data(config.data, workdir)
  mc = task.model_config(config.model, bundle)
  switched = workdir_lib.check_model(workdir, mc)
  # train.compute_dtype=auto becomes float32 or bfloat16 here, the one place it is resolved:
  # what follows (the model, the step, config.json) sees the concrete dtype.
  dc = task.data_config(config.data)
  choice = dtype_choice.resolve(
      tc.compute_dtype, lambda: dtype_choice.matmul_shapes(
          mc, dc.batch_size, getattr(dc, "tokens_per_batch", 0)),
      workdir=workdir, resumed=workdir_lib.has_checkpoints(workdir))
  if choice.dtype != tc.compute_dtype:
    tc = tc.replace(compute_dtype=choice.dtype)
    log.info(choice.line())
  if record:
    dtype_choice.record(workdir, choice)
    resume.Records(dtype_choice.with_dtype(config, tc.compute_dtype), workdir, mc).write()
  model = task.build_model(mc, seed=tc.seed, compute_dtype=tc.compute_dtype)
  optimizer = nnx.Optimizer(model, task.make_optimizer(tc), wrt=nnx.Param)
  graphdef, state = nnx.split((model, optimizer))
  run = Run(workdir, task, tc, mc, bundle, model, optimizer, graphdef, state,
            switch=resume.Switch(switched), dtype_choice=choice)
  if mesh is not None:
    run.mesh, run.rows = mesh, distributed.row_shard(mesh)
    run.shardings = distributed.state_shardings(state, mesh)
    run.state = distributed.place(state, run.shardings)
  if switched:
    run.switch.earlier_state = _abstract_state(task, mc.replace_paths(switched), tc)
  return run


def _abstract_state(task: Task, mc, tc: LoopConfig):
  """nnx.state((model, optimizer)) of model config `mc` as shapes only (nothing allocated)."""
  def build():
    model = task.build_model(mc, seed=tc.seed, compute_dtype=tc.compute_dtype)
    return model, nnx.Optimizer(model, task.make_optimizer(tc), wrt=nnx.Param)
  return nnx.split(nnx.eval_shape(build))[1]


def load_run(workdir, task: Task | str = "translate", *, overrides=None,
             checkpoint_dir=None) -> Run:
  """The finished run in `workdir`, its best checkpoint (else the latest; `checkpoint_dir`: a
  kept mark's) restored into `run.model`, for analysis: the viewer, the diagnosis, scoring.
  Reads config.json and the saved vocabularies; writes no config, record or checkpoint.
  overrides: {"data.test_split": ..., "train.beam_size": ...} replacing recorded settings."""
  import ml_collections  # pylint: disable=import-outside-toplevel
  task = get_task(task) if isinstance(task, str) else task
  for name in ("config.json", "results.json"):
    if not os.path.exists(os.path.join(workdir, name)):
      raise workdir_lib.WorkdirError(
          f"{workdir} has no {name}: not a finished run (train it first, e.g. python -m "
          f"experiments.translate --config=experiments/configs/translate.py:demo "
          f"--workdir={workdir})")
  with open(os.path.join(workdir, "config.json")) as f:
    config = ml_collections.ConfigDict(migrate_config(json.load(f)))
  for path, value in (overrides or {}).items():
    section, field = path.split(".")
    config[section][field] = value
  run = build_run(config, workdir, task, validate_config(config, task), record=False)
  restore_for_reading(workdir, run, checkpoint_dir)
  nnx.update((run.model, run.optimizer), run.state)
  return run
