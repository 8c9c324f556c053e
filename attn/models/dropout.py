"""Inverted dropout for every model, its keep masks drawn by XLA's native generator."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def dropout(x, rate, key):
  """Inverted dropout (identity when key is None or rate == 0) with its keep mask drawn by
  XLA's own generator (`lax.rng_bit_generator`, its threefry algorithm), seeded by 128 bits of
  `key`: one native op per mask instead of `jax.random.bernoulli`'s threefry, which XLA:CPU
  runs as ~20 rounds of elementwise uint32 work per element (the Transformer has 2 + 3 per
  layer masks of [B, T, d] a step; the RNN draws masks of [B, E] at every decoder step).
  The bits are uint32 (uint8 would round the keep probability to 1/256). Keep probability
  1 - rate up to 2^-32, the same scaling 1 / (1 - rate); another draw than bernoulli's for the
  same key.

  x: any shape; rate: a Python float in [0, 1); key: a PRNG key or None."""
  if key is None or rate == 0.0:
    return x
  seed = jax.random.bits(key, (4,), jnp.uint32)
  _, bits = jax.lax.rng_bit_generator(seed, x.shape, jnp.uint32,
                                      algorithm=jax.lax.RandomAlgorithm.RNG_THREE_FRY)
  keep = bits >= jnp.uint32(min(round(rate * 2.0 ** 32), 2 ** 32 - 1))
  return jnp.where(keep, x / (1.0 - rate), 0.0).astype(x.dtype)
