"""The divergence guard of the training loop: a run whose loss, gradient or parameters stop being
finite, or whose loss climbs far above that of a uniform guess, stops with one line before
anything after it is saved (attn.training.loop checks it before every progress line, evaluation
and save)."""

from __future__ import annotations

import numpy as np

from attn.errors import AttnError


class TrainingDiverged(AttnError):
  """The training loss became non-finite or exploded: nothing after it is saved."""


def check_divergence(run, m: dict, ckpt) -> None:
  """Raises TrainingDiverged when the loss, the gradient norm or the (updated) parameters are not
  finite, or the loss is above divergence_factor x the loss of a uniform guess
  (`Task.uniform_loss`, e.g. log V): the parameters are then worthless and must not be saved.
  `m`: the step's metrics (train_step); the loss is of the parameters before the step,
  param_norm of those after it."""
  loss = m["loss"]
  limit = run.tc.divergence_factor * run.task.uniform_loss(run.mc)
  finite = all(np.isfinite(m[k]) for k in ("loss", "grad_norm", "param_norm"))
  if finite and not (run.tc.divergence_factor and loss > limit):
    return
  saved = ckpt.latest.latest_step()
  raise TrainingDiverged(
      f"training diverged at step {run.progress.step}: loss {loss:.4g}, gradient norm "
      f"{m['grad_norm']:.4g}, parameter norm {m['param_norm']:.4g}"
      + ("" if not finite else f"; the loss is above {limit:.3g} (train.divergence_factor="
         f"{run.tc.divergence_factor:g} x the loss of a uniform guess)")
      + f" with train.learning_rate={run.tc.learning_rate:g}. Nothing from this point was saved"
      + (f"; the last checkpoint is step {saved}" if saved is not None else "")
      + ". Lower the learning rate (or raise train.warmup_steps) and start a new workdir.")


def loss_after_step(run, batch) -> float:
  """Mean token loss of the current parameters on `batch` (what `run.device_batch` returns: the
  global batch; one forward pass, no dropout)."""
  _, ntok, nll = run.state_loss_fn(run.state, batch)
  return float(nll) / max(float(ntok), 1.0)
