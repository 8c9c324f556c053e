"""One optimizer step of the training loop, and the dropout key each step draws."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from attn.training.task import Task


def train_step(task: Task, graphdef, state, batch, key, **loss_options):
  """One optimizer step. state = nnx.state((model, optimizer)); returns (state, metrics):
  loss (the mean token loss of the parameters before the step), nll (its unsmoothed mean),
  tokens, grad_norm, param_norm (of the parameters after it). loss_options: the task's static
  loss settings (`Task.loss_options`)."""
  model, optimizer = nnx.merge(graphdef, state)

  def loss_fn(model):
    total, ntok, nll = task.loss(model, batch, key, **loss_options)
    return total / ntok, (ntok, nll)

  (loss, (ntok, nll)), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
  optimizer.update(model, grads)
  params = nnx.state(model, nnx.Param)
  metrics = {"loss": loss, "nll": nll / ntok, "tokens": ntok, "grad_norm": optax.tree.norm(grads),
             "param_norm": optax.tree.norm(params)}
  return nnx.state((model, optimizer)), metrics


def train_steps(task: Task, graphdef, state, batches, seed, start, **loss_options):
  """len(batches) optimizer steps as one scan: `batches` holds the steps' batches stacked on a
  leading axis; step start + j draws `step_key(seed, start + j)`, the key a call of its own
  gives it. Returns (state, the last step's metrics)."""

  def one(state, inputs):
    batch, j = inputs
    return train_step(task, graphdef, state, batch, step_key(seed, start + j), **loss_options)

  n = jax.tree.leaves(batches)[0].shape[0]
  state, metrics = jax.lax.scan(one, state, (batches, jnp.arange(n, dtype=jnp.int32)))
  return state, jax.tree.map(lambda m: m[-1], metrics)


@functools.partial(jax.jit, static_argnames="sharding")
def step_key(seed, step, sharding=None):
  """fold_in(PRNGKey(seed), step), compiled, on `sharding` (None: the default device): made op by
  op, PRNGKey reads its seed's value on the host, which waits for the step before it to finish,
  so a step of a few milliseconds would run after the host's work instead of beside it."""
  key = jax.random.fold_in(jax.random.PRNGKey(seed), step)
  return key if sharding is None else jax.lax.with_sharding_constraint(key, sharding)
