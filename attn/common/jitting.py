"""The one cache of jitted functions, so each shape compiles once per process, not once per call."""

from __future__ import annotations

import functools

import jax


@functools.lru_cache(maxsize=None)
def jitted(fn, *bound, **static):
  """`jax.jit(partial(fn, *bound, **static))`, cached on `fn`, the bound arguments (a task, a
  graphdef: anything hashable) and the static keyword arguments."""
  return jax.jit(functools.partial(fn, *bound, **static))
