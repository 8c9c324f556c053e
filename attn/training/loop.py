"""train_and_evaluate(config, workdir, task): train a model, keep checkpoints, evaluate, write
the results.

The loop, in named pieces: `setup` (data, model, optimizer: attn.training.building) -> restore
-> `train` (steps with progress, evaluation and checkpoints) -> `Task.write_results` (restore
the best, evaluate the test split, write the result files). Everything that differs by
application (the train section, the optimizer, the batches, the model, its loss and the
divergence reference, the evaluation and the result files) comes from a registered `Task`
(attn.training.task); the loop names no application. Library code: it never reads absl FLAGS.

Data parallel: the state lives on a ("data", "model") mesh (`train.mesh_shape`) and every
batch's rows are split over "data", on one process or several (attn.training.distributed says
how, and what only process 0 writes).

Workdir layout: config.json, model.json, checkpoints/ (latest, for resuming), best/ (best eval
score), metrics.jsonl and TensorBoard events, and what the task writes: results.json (last),
attention.npz and for a sequence-to-sequence task the vocab files and data cache (attn.data),
predictions.txt and attention.png.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time

import jax
import numpy as np

from attn.common import compile_cache
from attn.models import count_params
from attn.training import distributed, dtype_choice, marks, resume
from attn.training.interrupts import InterruptGuard
from attn.training import workdir as workdir_lib
from attn.training.checkpoints import Checkpoints
from attn.training.divergence import (  # noqa: F401  (TrainingDiverged: raised from here)
    TrainingDiverged, check_divergence, loss_after_step)
from attn.training.metrics_log import MetricsWriter
from attn.training.run import Run
from attn.training.step import train_step  # noqa: F401  (re-exported: attn.training.train_step)
from attn.training.task import Task, application_of, get_task
from attn.training.building import build_run, make_mesh, validate_config

log = logging.getLogger(__name__)


def _progress(run, m, seconds, steps, tokens):
  """One progress line; rates over the last logging window (eval time excluded)."""
  p = run.progress
  eta = seconds / max(steps, 1) * (run.tc.steps - p.step)
  return (f"step {p.step}/{run.tc.steps} loss {m['loss']:.3f} ppl {np.exp(m['nll']):.1f} "
          f"|g| {m['grad_norm']:.2f} tok/s {tokens / max(seconds, 1e-9):.0f} "
          f"ETA {time.strftime('%H:%M:%S', time.gmtime(eta))}")


def is_better(score: tuple, best: tuple) -> bool:
  """Lexicographic on the selection metrics; an equal score counts as better, so of equally
  scored evaluations the later (longer-trained) model is kept."""
  return score >= best


@dataclasses.dataclass
class _Timing:
  """Training time: the timed segment in progress (evaluations and saves are left out of it;
  t_seg None: none is, e.g. during an evaluation) and the logging window, the training seconds,
  steps and tokens since the last progress line (`logged`: its step, None before the first)."""
  t_seg: float | None
  s: float = 0.0
  steps: int = 0
  tokens: float = 0.0
  logged: int | None = None

  def close_segment(self, run: Run) -> None:
    """Adds the segment's time (if one is in progress) to the run and the window; the next
    segment starts now."""
    now = time.time()
    if self.t_seg is not None:
      run.progress.wall_s += now - self.t_seg
      self.s += now - self.t_seg
    self.t_seg = now


def train(run: Run, ckpt: Checkpoints, writer: MetricsWriter, *, stop_after=None):
  """Runs steps from run.progress.step to tc.steps (or `stop_after` steps, for tests of resuming).

  Every progress line, evaluation and save first checks the loss (`check_divergence`); a failed
  save raises CheckpointError at its step. Ctrl-C saves the current step (with its training time,
  and its evaluation marked as due if it has not finished), unless it diverged since the last
  check; then re-raises.
  """
  p = run.progress
  tc = run.tc
  step_fn, steps_fn = run.step_fn(), None
  step_start = p.step
  it = run.task.train_batches(run.bundle, tc, p.step,
                              None if run.rows is None else run.rows.select)
  timing, last, last_batch, ahead = _Timing(None), None, None, None
  # A resumed run that had already used its time trains no further. (Decided once, from the
  # restored counters, which every process shares; later stops are agreed on, in _after_step.)
  spent = bool(tc.max_wall_s) and p.wall_s >= tc.max_wall_s
  guard = InterruptGuard()
  try:
    with guard:
      if p.eval_pending and run.task.has_eval(run.bundle):  # it was interrupted: before a step
        # (The checkpoint keeps saying so until the next save: evaluating again is harmless.)
        log.info(f"evaluating step {p.step}, whose evaluation was interrupted")
        _evaluate(run, ckpt, writer, guard)
      timing.t_seg = time.time()  # training time starts after that evaluation
      stopped = False
      while (not (spent or stopped) and p.step < tc.steps
             and (stop_after is None or p.step - step_start < stop_after)):
        n = _steps_this_call(run, step_start, stop_after)
        hosts = [next(it) for _ in range(n)]
        stacked = run.device_batches(hosts) if n > 1 else None
        if stacked is not None and ahead is None:
          ahead = run.compile_state_loss(hosts[-1])
        # n steps as one call; one step a call (steps_per_call 1, or batches of other shapes)
        groups = [(hosts, stacked)] if stacked is not None else [([h], None) for h in hosts]
        for group, batches in groups:
          k = len(group)
          if batches is None:
            fn, args = step_fn, (run.device_batch(group[0]), run.step_key(p.step))
          else:
            steps_fn = steps_fn or run.steps_fn()
            fn, args = steps_fn, (batches, np.int32(tc.seed + 1), np.int32(p.step))
          # the global batches' tokens, everywhere
          ntok = sum(run.task.train_tokens(run.bundle, tc, p.step + j) for j in range(k))
          # Ctrl-C is held while the call runs: it donates the old state, so an interrupt raised
          # before the new state and its step count are assigned would leave nothing to save.
          with guard.step():
            (run.state, last), p.step = fn(run.state, *args), p.step + k
            last_batch = group[-1]
            p.train_tokens += ntok
            # Due from the moment the step exists: a Ctrl-C before the evaluation has finished
            # (in this call, or later in _after_step) saves the step with it still to run.
            p.eval_pending = p.eval_pending or _eval_due(run)
            timing.steps += k  # (with the step: a Ctrl-C's progress line counts this call)
            timing.tokens += ntok
          stopped = _after_step(run, ckpt, writer, timing, last, group[-1], guard)
          if stopped:
            break
  except KeyboardInterrupt:
    _save_on_interrupt(run, ckpt, writer, timing, last, last_batch)
    raise
  finally:
    if ahead is not None:
      ahead.join()
  jax.block_until_ready(run.state)
  timing.close_segment(run)
  return last


def _steps_this_call(run: Run, step_start: int, stop_after) -> int:
  """How many steps the next call runs: train.steps_per_call, fewer where a progress line, an
  evaluation, a save, the last step or `stop_after` falls earlier (those happen after a call)."""
  p, tc = run.progress, run.tc
  n = min(tc.steps_per_call, tc.steps - p.step)
  everies = [tc.log_every, tc.checkpoint_every] + (
      [tc.eval_every] if run.task.has_eval(run.bundle) else [])
  n = min([n] + [every - p.step % every for every in everies])
  if stop_after is not None:
    n = min(n, step_start + stop_after - p.step)
  return max(n, 1)


def _after_step(run: Run, ckpt: Checkpoints, writer: MetricsWriter, timing: _Timing, last,
                host_batch, guard: InterruptGuard | None = None) -> bool:
  """What follows step run.progress.step (`last`: its metrics, `host_batch`: its batch as the
  task gave it, placed on the devices only for the divergence check before a save): the
  progress line, the evaluation and the saves that are due (each save with Ctrl-C held by
  `guard`). True when train.max_wall_s stops training."""
  p = run.progress
  tc = run.tc
  last_step = p.step == tc.steps
  wall_now = p.wall_s + time.time() - timing.t_seg
  out_of_time = bool(tc.max_wall_s) and wall_now >= tc.max_wall_s
  mark_now = marks.due(run.workdir, tc.mark_wall_s, wall_now)
  if jax.process_count() > 1 and (tc.max_wall_s or tc.mark_wall_s):
    out_of_time = distributed.agree(out_of_time)  # process 0's clock decides for all
    mark_now = mark_now if distributed.agree(bool(mark_now)) else []
  eval_now = _eval_due(run) or (
      (out_of_time or bool(mark_now)) and run.task.has_eval(run.bundle))
  save_now = p.step % tc.checkpoint_every == 0 or last_step or out_of_time or bool(mark_now)
  log_now = _log_due(run)
  if log_now or eval_now or save_now:
    m = {k: float(v) for k, v in jax.device_get(last).items()}  # waits for the step
    check_divergence(run, m, ckpt)
    timing.close_segment(run)
    if eval_now or save_now:
      timing.t_seg = None  # the check, evaluation and saves are not training time
      # The step's loss is of the parameters before it; what is about to be saved is after.
      check_divergence(run, {**m, "loss": loss_after_step(run, run.device_batch(host_batch))},
                       ckpt)
    if log_now:
      _log_progress(run, writer, timing, m)
  if out_of_time:
    log.info(f"train.max_wall_s={tc.max_wall_s:.0f} reached at step {p.step}: stopping")
  if eval_now:
    _evaluate(run, ckpt, writer, guard)
  if save_now:
    with _held(guard):
      resume.save(ckpt, ckpt.latest, run)
  for seconds in mark_now:  # after the evaluation: best/ is the best as of the mark
    with _held(guard):
      marks.keep(ckpt, run, seconds)
  if eval_now or save_now:
    timing.t_seg = time.time()
  return out_of_time


def _log_due(run: Run) -> bool:
  """Whether step run.progress.step has a progress line (a train row in metrics.jsonl)."""
  p, tc = run.progress, run.tc
  return p.step % tc.log_every == 0 or p.step == tc.steps


def _log_progress(run: Run, writer: MetricsWriter, timing: _Timing, m: dict) -> None:
  """The progress line of step run.progress.step (`m`: its metrics) and its train row: the
  step's own metrics and the window's token rate; a new window starts."""
  p = run.progress
  rate = timing.tokens / max(timing.s, 1e-9)
  p.window_rates.append(rate)
  writer.write(p.step, "train", {**m, "tokens_per_sec": rate})
  log.info(_progress(run, m, timing.s, timing.steps, timing.tokens))
  timing.s, timing.steps, timing.tokens, timing.logged = 0.0, 0, 0.0, p.step


def _eval_due(run: Run) -> bool:
  """Whether step run.progress.step is evaluated by its number (every train.eval_every steps,
  and the last step; train.max_wall_s and train.mark_wall_s add evaluations by time)."""
  p, tc = run.progress, run.tc
  return (p.step % tc.eval_every == 0 or p.step == tc.steps) and run.task.has_eval(run.bundle)


def _held(guard: InterruptGuard | None):
  """Ctrl-C held for a save (raised once it has finished): an interrupt inside orbax's save
  would surface as a failed save and leave its temporary directory behind."""
  return guard.step() if guard is not None else contextlib.nullcontext()


def _evaluate(run: Run, ckpt: Checkpoints, writer: MetricsWriter,
              guard: InterruptGuard | None = None) -> None:
  """Evaluates on the eval split, logs it and saves best/ when the selection metrics improve.
  Until it has finished, `run.progress.eval_pending` is set: a checkpoint saved on Ctrl-C
  carries it, so the resumed run evaluates the step first instead of never."""
  p = run.progress
  p.eval_pending = True
  t0 = time.time()
  ev = run.task.evaluate(run, "eval")
  floats = {k: v for k, v in ev.items() if isinstance(v, float)}
  eval_s = time.time() - t0  # what the evaluation costs the run (results.json sums it: eval_s)
  writer.write(p.step, "eval", {**floats, "eval_s": eval_s})
  log.info(f"eval at step {p.step}: " + ", ".join(f"{k} {v:.3f}" for k, v in floats.items())
           + f" ({eval_s:.1f} s)")
  score = tuple(ev[k] for k in run.task.selection_metrics(run.bundle))
  if distributed.agree(is_better(score, p.best_score)):  # all save best/, or none
    p.best_score, p.best_step, p.best_eval = score, p.step, floats
    if ckpt.best.latest_step() != p.step:  # (else saved by an interrupted earlier attempt)
      with _held(guard):
        resume.save(ckpt, ckpt.best, run)
  p.eval_pending = False


def _save_on_interrupt(run: Run, ckpt: Checkpoints, writer: MetricsWriter, timing: _Timing, last,
                       host_batch) -> None:
  """After Ctrl-C: saves the current step unless it is saved already, its state was donated or
  it diverged since the last check (`last`: its metrics, `host_batch`: its batch, for the same
  check the loop makes before a save; the last good checkpoint is then kept). The training time
  up to now is added to the run first, so the budget and the rates count it. A step whose
  progress line is due but was not written yet (the Ctrl-C came between the step and its line)
  gets it first: the resumed run starts after that step and would never write its train row.
  A step between progress lines gets none: a row is the metrics of the step it names, and the
  resumed run writes the next line where an uninterrupted run does."""
  p, tc = run.progress, run.tc
  if any(x.is_deleted() for x in jax.tree.leaves(run.state) if isinstance(x, jax.Array)):
    log.warning(f"interrupted inside step {p.step + 1}, whose input state was donated: "
                "nothing saved; rerun the same command to resume from the last checkpoint")
  elif last is not None and p.step != ckpt.latest.latest_step():
    jax.block_until_ready(run.state)
    timing.close_segment(run)
    try:
      m = {k: float(v) for k, v in jax.device_get(last).items()}
      check_divergence(run, m, ckpt)
      check_divergence(run, {**m, "loss": loss_after_step(run, run.device_batch(host_batch))},
                       ckpt)
    except TrainingDiverged as e:  # its message names the checkpoint kept and what to change
      log.warning(f"interrupted: {e}")
      return
    if _log_due(run) and timing.logged != p.step:
      _log_progress(run, writer, timing, m)
    if tc.max_wall_s and p.wall_s >= tc.max_wall_s and run.task.has_eval(run.bundle):
      # The resumed run trains no further: it evaluates this step first, as the run stopped by
      # its budget here would have (a step already evaluated is evaluated again, harmlessly).
      p.eval_pending = True
    resume.save(ckpt, ckpt.latest, run)
    log.warning(f"interrupted at step {p.step}: checkpoint saved"
                + (" (its evaluation had not finished: it runs first when resumed)"
                   if p.eval_pending else "") + "; rerun the same command to resume")


def train_and_evaluate(config, workdir, task: Task | str = "translate") -> dict:
  """Trains (resuming from `workdir` if it holds a checkpoint), then evaluates the test split
  (`Task.write_results`: a sequence-to-sequence task decodes and scores it). Returns the results
  dict also written to `workdir/results.json` (the last file written: its presence means the
  run finished)."""
  name = task if isinstance(task, str) else application_of(task)
  task = get_task(task) if isinstance(task, str) else task
  tc = validate_config(config, task)  # before the workdir is touched
  mesh = make_mesh(config, tc, task)
  task.check_data(config.data)  # and a missing data file, so a refused run leaves it as it was
  workdir_lib.prepare(workdir)
  workdir_lib.claim(workdir, name)  # before anything else is written into it
  with workdir_lib.lock(workdir):
    previous_train = resume.recorded_train(workdir)  # the last command's, before it is replaced
    if workdir_lib.has_checkpoints(workdir):  # a resumed run trains on the data it was trained on
      task.check_resumed_data(resume.recorded_section(workdir, "data"),
                              task.data_config(config.data))
    run = build_run(config, workdir, task, tc, mesh=mesh, record=False)
    run.donate = True  # nothing else holds the state between steps
    log.info(f"model {task.describe_model(run.mc)}: {count_params(run.model):,} parameters")
    log.info(f"mesh {dict(mesh.shape)} over {jax.process_count()} process(es); "
             f"this one reads blocks {run.rows.mine} of each batch")
    ckpt = Checkpoints(workdir, keep=tc.keep_checkpoints)
    try:
      resumed = ckpt.restore(ckpt.latest, run)
      switched = run.switch.switched if run.switch.restored_earlier else {}
      if resumed:
        resume.check_progress(run, previous_train, switched)  # before any record is rewritten
        log.info(f"resumed from step {run.progress.step}")
      run.records = resume.Records(dtype_choice.with_dtype(config, run.tc.compute_dtype),
                                   workdir, run.mc)
      dtype_choice.record(workdir, run.dtype_choice)
      if switched:
        # The best checkpoint so far is of the model before the switch: the test split is to be
        # decoded with the model as it is now, so best/ is chosen again among later evaluations.
        p = run.progress
        p.best_score, p.best_step, p.best_eval = (), p.step, {}
        log.info("model: " + ", ".join(f"{k} switched on" for k in switched) + " since the "
                 "last checkpoint; its new parameters start from their initial values, and best/ "
                 "now tracks only evaluations after the switch")
      else:  # (after a switch: at the first save of the switched model, resume.Records)
        run.records.write()
      writer = MetricsWriter(workdir, resumed_step=run.progress.step if resumed else 0)
      train(run, ckpt, writer)
      results = task.write_results(run, ckpt)
    finally:
      ckpt.close()
    compiled = compile_cache.stats()
    if compiled.programs:  # counted when an entry point turned the cache on
      log.info(compiled.summary())
    return results
