"""train_and_evaluate(config, workdir): train a model, keep checkpoints, decode, score.

The loop, in named pieces: `setup` (data, model, optimizer) -> restore -> `train` (steps with
progress, evaluation and checkpoints) -> `evaluation.write_results` (restore the best, decode the
test split, write the result files). What is task-specific (the model, its loss, decoding,
metrics) comes from a registered `Task`. Library code: it never reads absl FLAGS.

Workdir layout: config.json, vocab files and data cache (attn.data), checkpoints/ (latest, for
resuming), best/ (best eval score), metrics.jsonl and TensorBoard events, predictions.txt,
results.json, attention.npz, attention.png.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import time

import jax
import numpy as np
import optax
from flax import nnx

from attn.errors import AttnError, ConfigError
from attn.models import count_params
from attn.training import evaluation
from attn.training import results as results_lib
from attn.training import workdir as workdir_lib
from attn.training.checkpoints import Checkpoints
from attn.training.config import TrainConfig, make_optimizer
from attn.training.metrics_log import MetricsWriter
from attn.training.task import Task, get_task

log = logging.getLogger(__name__)


def train_step(task: Task, graphdef, state, batch, key, *, label_smoothing):
  """One optimizer step. state = nnx.state((model, optimizer)); returns (state, metrics)."""
  model, optimizer = nnx.merge(graphdef, state)

  def loss_fn(model):
    total, ntok, nll = task.loss(model, batch, key, label_smoothing)
    return total / ntok, (ntok, nll)

  (loss, (ntok, nll)), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
  optimizer.update(model, grads)
  params = nnx.state(model, nnx.Param)
  metrics = {"loss": loss, "nll": nll / ntok, "tokens": ntok, "grad_norm": optax.tree.norm(grads),
             "param_norm": optax.tree.norm(params)}
  return nnx.state((model, optimizer)), metrics


class TrainingDiverged(AttnError):
  """The training loss became non-finite or exploded: nothing after it is saved."""


@dataclasses.dataclass
class Run:
  """Everything a training run holds; built by `setup`, advanced by `train`."""
  workdir: str
  task: Task
  tc: TrainConfig
  mc: object
  bundle: object
  model: object
  optimizer: object
  graphdef: object
  state: object
  step: int = 0
  best_score: tuple = ()  # the task's selection metrics at the best eval so far (() = none yet)
  best_step: int = 0
  best_eval: dict = dataclasses.field(default_factory=dict)  # that eval's float metrics
  wall_s: float = 0.0  # training wall time accumulated across restarts
  train_tokens: float = 0.0
  window_rates: list = dataclasses.field(default_factory=list)  # tok/s of each logging window

  def step_fn(self):
    """The jitted train step of this run (label smoothing bound)."""
    return jax.jit(functools.partial(train_step, self.task, self.graphdef,
                                     label_smoothing=self.tc.label_smoothing))

  def step_key(self, step: int):
    """The dropout key of `step`: a function of the seed and the step only, so a resumed run
    draws the same masks as an uninterrupted one and no two steps share a mask."""
    return jax.random.fold_in(jax.random.PRNGKey(self.tc.seed + 1), step)


def validate_config(config, task: Task | str = "translate") -> TrainConfig:
  """Checks every section of an experiment config without reading data or building the model:
  raises ConfigError / DataError naming the first bad field. Returns the train section."""
  from attn.data.config import DataConfig  # pylint: disable=import-outside-toplevel
  task = get_task(task) if isinstance(task, str) else task
  for section in ("data", "model", "train"):
    if section not in config:
      raise ConfigError(f"the config has no `{section}` section")
  tc = TrainConfig.from_config(config.train)
  DataConfig.from_config(config.data)
  task.check_model_config(config.model)
  return tc


def setup(config, workdir, task: Task | str = "translate") -> Run:
  """Validates the config, loads the data and builds the model and optimizer of a run.

  Nothing is written before the whole config is valid; config.json is replaced atomically, and
  only once the workdir is known to hold no checkpoints of another model.
  """
  task = get_task(task) if isinstance(task, str) else task
  tc = validate_config(config, task)
  workdir_lib.prepare(workdir)
  return _build_run(config, workdir, task, tc)


def _build_run(config, workdir, task: Task, tc: TrainConfig, *, record=True) -> Run:
  """setup() after validation, on a prepared workdir (record=False: write no config or model
  record, for reading a finished run)."""
  from attn import data  # pylint: disable=import-outside-toplevel  (needs the data extras)

  bundle = data.load(config.data, workdir)
  mc = task.model_config(config.model, bundle)
  workdir_lib.check_model(workdir, mc)
  if record:
    results_lib.write_text(os.path.join(workdir, "config.json"),
                           config.to_json_best_effort(indent=1))
    workdir_lib.record_model(workdir, mc)
  model = task.build_model(mc, seed=tc.seed)
  optimizer = nnx.Optimizer(model, make_optimizer(tc), wrt=nnx.Param)
  graphdef, state = nnx.split((model, optimizer))
  return Run(workdir, task, tc, mc, bundle, model, optimizer, graphdef, state)


def load_run(workdir, task: Task | str = "translate") -> Run:
  """The finished run in `workdir`, its best checkpoint (else the latest) restored into
  `run.model`, for analysis: the viewer, the diagnosis, notebooks. Reads config.json and the
  saved vocabularies; writes no config, record or checkpoint."""
  import ml_collections  # pylint: disable=import-outside-toplevel
  task = get_task(task) if isinstance(task, str) else task
  for name in ("config.json", "results.json"):
    if not os.path.exists(os.path.join(workdir, name)):
      raise workdir_lib.WorkdirError(
          f"{workdir} has no {name}: not a finished run (train it first, e.g. python -m "
          f"experiments.translate --config=experiments/configs/translate.py:demo "
          f"--workdir={workdir})")
  with open(os.path.join(workdir, "config.json")) as f:
    config = ml_collections.ConfigDict(json.load(f))
  run = _build_run(config, workdir, task, validate_config(config, task), record=False)
  ckpt = Checkpoints(workdir)
  try:
    if not (ckpt.restore(ckpt.best, run) or ckpt.restore(ckpt.latest, run)):
      raise workdir_lib.WorkdirError(f"{workdir} holds no checkpoint to restore")
  finally:
    ckpt.close()
  nnx.update((run.model, run.optimizer), run.state)
  return run


def _progress(run, m, seconds, steps, tokens):
  """One progress line; rates over the last logging window (eval time excluded)."""
  eta = seconds / max(steps, 1) * (run.tc.steps - run.step)
  return (f"step {run.step}/{run.tc.steps} loss {m['loss']:.3f} ppl {np.exp(m['nll']):.1f} "
          f"|g| {m['grad_norm']:.2f} tok/s {tokens / max(seconds, 1e-9):.0f} "
          f"ETA {time.strftime('%H:%M:%S', time.gmtime(eta))}")


def check_divergence(run: Run, m: dict, ckpt: Checkpoints) -> None:
  """Raises TrainingDiverged when the loss, the gradient norm or the (updated) parameters are not
  finite, or the loss is above divergence_factor x log(V) (the loss of a uniform guess): the
  parameters are then worthless and must not be saved. `m`: the step's metrics (train_step); the
  loss is of the parameters before the step, param_norm of those after it."""
  loss = m["loss"]
  limit = run.tc.divergence_factor * np.log(max(run.mc.tgt_vocab, 2))
  finite = all(np.isfinite(m[k]) for k in ("loss", "grad_norm", "param_norm"))
  if finite and not (run.tc.divergence_factor and loss > limit):
    return
  saved = ckpt.latest.latest_step()
  raise TrainingDiverged(
      f"training diverged at step {run.step}: loss {loss:.4g}, gradient norm "
      f"{m['grad_norm']:.4g}, parameter norm {m['param_norm']:.4g}"
      + ("" if not finite else f"; the loss is above {limit:.3g} (train.divergence_factor="
         f"{run.tc.divergence_factor:g} x log of the target vocabulary)")
      + f" with train.learning_rate={run.tc.learning_rate:g}. Nothing from this point was saved"
      + (f"; the last checkpoint is step {saved}" if saved is not None else "")
      + ". Lower the learning rate (or raise train.warmup_steps) and start a new workdir.")


def loss_after_step(run: Run, batch) -> float:
  """Mean token loss of the current parameters on `batch` (one forward pass, no dropout)."""
  graphdef, params = evaluation.params_view(run)
  nll, ntok = evaluation.jitted(evaluation.eval_step, run.task, graphdef)(params, batch)
  return float(nll) / max(float(ntok), 1.0)


def is_better(score: tuple, best: tuple) -> bool:
  """Lexicographic on the selection metrics; an equal score counts as better, so of equally
  scored evaluations the later (longer-trained) model is kept."""
  return score >= best


def train(run: Run, ckpt: Checkpoints, writer: MetricsWriter, *, stop_after=None):
  """Runs steps from run.step to tc.steps (or `stop_after` steps, for tests of resuming).

  Every progress line, evaluation and save first checks the loss (`check_divergence`); a failed
  save raises CheckpointError at its step. Ctrl-C saves the current step, then re-raises.
  """
  tc = run.tc
  step_fn = run.step_fn()
  step_start = run.step
  it = run.bundle.train_iter(run.step)
  t_seg = time.time()  # start of the current timed segment (evals and saves excluded)
  win = {"s": 0.0, "steps": 0, "tokens": 0.0}  # the logging window
  last = None
  selection = run.task.selection_metrics(run.bundle)
  try:
    while run.step < tc.steps and (stop_after is None or run.step - step_start < stop_after):
      if tc.max_wall_s and run.wall_s >= tc.max_wall_s:
        break  # resumed a run that had already used its time
      batch = evaluation.device_batch(next(it))
      # One statement, so an interrupt cannot land between the new state and its step count.
      run.state, last, run.step = (*step_fn(run.state, batch, run.step_key(run.step)),
                                   run.step + 1)
      ntok = float(batch["tgt_lengths"].sum())
      run.train_tokens += ntok
      win["steps"] += 1
      win["tokens"] += ntok
      last_step = run.step == tc.steps
      out_of_time = bool(tc.max_wall_s) and run.wall_s + time.time() - t_seg >= tc.max_wall_s
      eval_now = (run.step % tc.eval_every == 0 or last_step or out_of_time) and (
          "eval" in run.bundle.splits)
      save_now = run.step % tc.checkpoint_every == 0 or last_step or out_of_time
      if run.step % tc.log_every == 0 or last_step or eval_now or save_now:
        m = {k: float(v) for k, v in jax.device_get(last).items()}  # waits for the step
        check_divergence(run, m, ckpt)
        now = time.time()
        run.wall_s += now - t_seg
        win["s"] += now - t_seg
        t_seg = now
        if eval_now or save_now:
          # The step's loss is of the parameters before it; what is about to be saved is after.
          check_divergence(run, {**m, "loss": loss_after_step(run, batch)}, ckpt)
        if run.step % tc.log_every == 0 or last_step:
          rate = win["tokens"] / max(win["s"], 1e-9)
          run.window_rates.append(rate)
          writer.write(run.step, "train", {**m, "tokens_per_sec": rate})
          log.info(_progress(run, m, win["s"], win["steps"], win["tokens"]))
          win = {"s": 0.0, "steps": 0, "tokens": 0.0}
      if out_of_time:
        log.info(f"train.max_wall_s={tc.max_wall_s:.0f} reached at step {run.step}: stopping")
      if eval_now:
        ev = evaluation.evaluate(run, "eval", tc.eval_decode_sentences)
        floats = {k: v for k, v in ev.items() if isinstance(v, float)}
        writer.write(run.step, "eval", floats)
        log.info(f"eval at step {run.step}: " + ", ".join(f"{k} {v:.3f}" for k, v in floats.items()))
        score = tuple(ev[k] for k in selection)
        if is_better(score, run.best_score):
          run.best_score, run.best_step, run.best_eval = score, run.step, floats
          ckpt.save(ckpt.best, run)
      if save_now:
        ckpt.save(ckpt.latest, run)
      if eval_now or save_now:
        t_seg = time.time()
      if out_of_time:
        break
  except KeyboardInterrupt:
    if last is not None and run.step != ckpt.latest.latest_step():
      jax.block_until_ready(run.state)
      ckpt.save(ckpt.latest, run)
      log.warning(f"interrupted at step {run.step}: checkpoint saved; rerun the same command "
                  "to resume")
    raise
  jax.block_until_ready(run.state)
  run.wall_s += time.time() - t_seg
  return last


def train_and_evaluate(config, workdir, task: Task | str = "translate") -> dict:
  """Trains (resuming from `workdir` if it holds a checkpoint), then decodes and scores the test
  split. Returns the results dict also written to `workdir/results.json` (the last file written:
  its presence means the run finished)."""
  task = get_task(task) if isinstance(task, str) else task
  tc = validate_config(config, task)  # before the workdir is touched
  workdir_lib.prepare(workdir)
  with workdir_lib.lock(workdir):
    run = _build_run(config, workdir, task, tc)
    log.info(f"model {run.mc.decoder}/{run.mc.score}/{run.mc.normalizer}: "
             f"{count_params(run.model):,} parameters")
    ckpt = Checkpoints(workdir)
    try:
      resumed = ckpt.restore(ckpt.latest, run)
      if resumed:
        log.info(f"resumed from step {run.step}")
      writer = MetricsWriter(workdir, resumed_step=run.step if resumed else 0)
      train(run, ckpt, writer)
      results = evaluation.write_results(run, ckpt)
    finally:
      ckpt.close()
    return results
