"""Counterfactual attention: what the weights are replaced with to see whether the output
depends on them (Jain & Wallace 2019, sec. 4).

Each entry of `INTERVENTIONS` is a factory `make(key) -> intervene(weights, mask, draw) ->
weights'`: weights [..., 1, Ts] float, mask [..., 1, Ts] bool (True = valid), `draw` an int that
varies the randomness between calls. The models' `counterfactual` applies it: `Seq2Seq` to its
one attention per step (draw = t), the `Transformer` to every layer's and head's cross-attention
row at step t ([B, H, 1, Ts], a draw per layer).

    intervene = interventions.get("permute", jax.random.PRNGKey(0))
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from attn.errors import ConfigError
from attn.registry import Registry

INTERVENTIONS: Registry[Callable] = Registry("intervention", error=ConfigError)

# What the diagnosis applies unless told otherwise (`identity` is a control for tests).
DEFAULT = ("permute", "uniform", "zero_top")


def get(name: str, key=None):
  """The intervene function `name` (seeded with `key` where it draws randomness); an unknown
  name is a ConfigError listing the known ones."""
  return INTERVENTIONS.get(name)(jax.random.PRNGKey(0) if key is None else key)


@INTERVENTIONS.register("identity")
def identity(key):
  """The real weights (a control: the counterfactual output must equal the real one)."""
  del key
  return lambda weights, mask, t: weights


@INTERVENTIONS.register("permute")
def permute(key):
  """The weights randomly permuted over the valid source positions (Jain & Wallace 2019 sec. 4):
  the same multiset of weights, masked positions kept at 0. One permutation per row and step,
  drawn from fold_in(key, t)."""

  def intervene(weights, mask, t):
    u = jax.random.uniform(jax.random.fold_in(key, t), weights.shape)
    order = jnp.argsort(jnp.where(mask, u, jnp.inf), axis=-1)  # valid positions, shuffled, first
    rank = jnp.cumsum(mask, axis=-1) - 1                         # a valid position's rank
    src = jnp.take_along_axis(order, jnp.maximum(rank, 0), axis=-1)  # where its weight comes from
    return jnp.where(mask, jnp.take_along_axis(weights, src, axis=-1), 0.0).astype(weights.dtype)

  return intervene


@INTERVENTIONS.register("uniform")
def uniform(key):
  """Uniform weights 1/n over the n valid source positions (0 where masked)."""
  del key

  def intervene(weights, mask, t):
    n = jnp.sum(mask, axis=-1, keepdims=True)
    return jnp.where(mask, 1.0 / jnp.maximum(n, 1), 0.0).astype(weights.dtype)

  return intervene


@INTERVENTIONS.register("zero_top")
def zero_top(key):
  """The top-weighted valid position set to 0 and the rest renormalized to sum 1. If the rest
  carries no mass, uniform over the other valid positions; with one valid position, all 0 (the
  context is then zero)."""
  del key

  def intervene(weights, mask, t):
    top = jax.nn.one_hot(jnp.argmax(jnp.where(mask, weights, -jnp.inf), axis=-1),
                         weights.shape[-1], dtype=bool)  # [B, 1, Ts]
    keep = mask & ~top
    rest = jnp.where(keep, weights, 0.0)
    total = jnp.sum(rest, axis=-1, keepdims=True)
    n = jnp.sum(keep, axis=-1, keepdims=True)
    fallback = jnp.where(keep, 1.0 / jnp.maximum(n, 1), 0.0)
    return jnp.where(total > 0, rest / jnp.where(total > 0, total, 1.0), fallback).astype(
        weights.dtype)

  return intervene

