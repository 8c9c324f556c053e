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
import logging
import os
import time

import jax
import numpy as np
import optax
from flax import nnx

from attn.models import count_params
from attn.training import evaluation
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
  best_score: float = -np.inf
  wall_s: float = 0.0  # training wall time accumulated across restarts
  train_tokens: float = 0.0
  window_rates: list = dataclasses.field(default_factory=list)  # tok/s of each logging window

  def step_fn(self):
    """The jitted train step of this run (label smoothing bound)."""
    # No buffer donation: async checkpoint saves may still be reading the previous state.
    return jax.jit(functools.partial(train_step, self.task, self.graphdef,
                                     label_smoothing=self.tc.label_smoothing))


def setup(config, workdir, task: Task | str = "translate") -> Run:
  """Validates the config, loads the data and builds the model and optimizer of a run."""
  from attn import data  # pylint: disable=import-outside-toplevel  (needs the data extras)

  task = get_task(task) if isinstance(task, str) else task
  tc = TrainConfig.from_config(config.train)
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    f.write(config.to_json_best_effort(indent=1))
  bundle = data.load(config.data, workdir)
  mc = task.model_config(config.model, bundle)
  model = task.build_model(mc, seed=tc.seed)
  optimizer = nnx.Optimizer(model, make_optimizer(tc), wrt=nnx.Param)
  graphdef, state = nnx.split((model, optimizer))
  return Run(workdir, task, tc, mc, bundle, model, optimizer, graphdef, state)


def _progress(run, m, seconds, steps, tokens):
  """One progress line; rates over the last logging window (eval time excluded)."""
  eta = seconds / max(steps, 1) * (run.tc.steps - run.step)
  return (f"step {run.step}/{run.tc.steps} loss {m['loss']:.3f} ppl {np.exp(m['nll']):.1f} "
          f"|g| {m['grad_norm']:.2f} tok/s {tokens / max(seconds, 1e-9):.0f} "
          f"ETA {time.strftime('%H:%M:%S', time.gmtime(eta))}")


def train(run: Run, ckpt: Checkpoints, writer: MetricsWriter, *, stop_after=None):
  """Runs steps from run.step to tc.steps (or `stop_after` steps, for tests of resuming)."""
  tc = run.tc
  step_fn = run.step_fn()
  base_key = jax.random.PRNGKey(tc.seed + 1)
  step_start = run.step
  it = run.bundle.train_iter(run.step)
  t_seg = time.time()  # start of the current timed segment (evals and saves excluded)
  win = {"s": 0.0, "steps": 0, "tokens": 0.0}  # the logging window
  last = None
  selection = run.task.selection_metric(run.bundle)
  while run.step < tc.steps and (stop_after is None or run.step - step_start < stop_after):
    if tc.max_wall_s and run.wall_s >= tc.max_wall_s:
      break  # resumed a run that had already used its time
    batch = evaluation.device_batch(next(it))
    run.state, last = step_fn(run.state, batch, jax.random.fold_in(base_key, run.step))
    run.step += 1
    ntok = float(batch["tgt_lengths"].sum())
    run.train_tokens += ntok
    win["steps"] += 1
    win["tokens"] += ntok
    if run.step % tc.log_every == 0 or run.step == tc.steps:
      m = {k: float(v) for k, v in jax.device_get(last).items()}  # waits for the step
      now = time.time()
      run.wall_s += now - t_seg
      win["s"] += now - t_seg
      t_seg = now
      rate = win["tokens"] / max(win["s"], 1e-9)
      run.window_rates.append(rate)
      writer.write(run.step, "train", {**m, "tokens_per_sec": rate})
      log.info(_progress(run, m, win["s"], win["steps"], win["tokens"]))
      win = {"s": 0.0, "steps": 0, "tokens": 0.0}
    out_of_time = bool(tc.max_wall_s) and run.wall_s + time.time() - t_seg >= tc.max_wall_s
    if out_of_time:
      log.info(f"train.max_wall_s={tc.max_wall_s:.0f} reached at step {run.step}: stopping")
    last_step = run.step == tc.steps or out_of_time
    eval_now = (run.step % tc.eval_every == 0 or last_step) and "eval" in run.bundle.splits
    save_now = run.step % tc.checkpoint_every == 0 or last_step
    if eval_now or save_now:
      jax.block_until_ready(run.state)
      now = time.time()
      run.wall_s += now - t_seg
      win["s"] += now - t_seg
    if eval_now:
      ev = evaluation.evaluate(run, "eval", tc.eval_decode_sentences)
      writer.write(run.step, "eval", {k: v for k, v in ev.items() if isinstance(v, float)})
      log.info(f"eval at step {run.step}: " + ", ".join(
          f"{k} {v:.3f}" for k, v in ev.items() if isinstance(v, float)))
      if ev[selection] > run.best_score:
        run.best_score = ev[selection]
        ckpt.save(ckpt.best, run)
    if save_now:
      ckpt.save(ckpt.latest, run)
    if eval_now or save_now:
      t_seg = time.time()
    if out_of_time:
      break
  jax.block_until_ready(run.state)
  run.wall_s += time.time() - t_seg
  return last


def train_and_evaluate(config, workdir, task: Task | str = "translate") -> dict:
  """Trains (resuming from `workdir` if it holds a checkpoint), then decodes and scores the test
  split. Returns the results dict also written to `workdir/results.json`."""
  run = setup(config, workdir, task)
  log.info(f"model {run.mc.decoder}/{run.mc.score}/{run.mc.normalizer}: "
           f"{count_params(run.model):,} parameters")
  ckpt = Checkpoints(workdir)
  if ckpt.restore(ckpt.latest, run):
    log.info(f"resumed from step {run.step}")
  writer = MetricsWriter(workdir)
  try:
    train(run, ckpt, writer)
  finally:
    ckpt.wait()
  results = evaluation.write_results(run, ckpt)
  ckpt.wait()
  return results


