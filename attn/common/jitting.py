"""The one cache of jitted functions, so each shape compiles once per process, not once per
call; the XLA:CPU options for steps of small tensors; and blocks of random draws read one
block behind their dispatch."""

from __future__ import annotations

import functools

import jax
import numpy as np


@functools.lru_cache(maxsize=None)
def jitted(fn, *bound, **static):
  """`jax.jit(partial(fn, *bound, **static))`, cached on `fn`, the bound arguments (a task, a
  graphdef: anything hashable) and the static keyword arguments."""
  return jax.jit(functools.partial(fn, *bound, **static))


# XLA:CPU hands every matmul and every reduction to the YNNPACK library by default, and a library
# reduction takes its operand materialized. A wide sum of something XLA would otherwise fuse into
# it (a reader's bags of words over every sentence of a pool, [B, sentences, W, d], forward and
# backward) then writes and reads that operand in full; with these options the matmuls stay
# library calls and the reductions are XLA's own loops, fused with what they sum.
XLA_REDUCTIONS = {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"}


def cpu_options(options: dict) -> dict | None:
  """`options` when the default backend is the CPU and this jaxlib knows each of them (XLA
  refuses an option it does not know, and the name of an experimental one may change), else
  None (XLA's defaults)."""
  if jax.default_backend() != "cpu":
    return None
  known = _known(tuple(sorted(options.items())))
  return dict(options) if known else None


@functools.lru_cache(maxsize=None)
def _known(items: tuple) -> bool:
  try:
    jax.jit(lambda x: x + 1, compiler_options=dict(items)).lower(1.0).compile()
  except Exception:  # pylint: disable=broad-except  # XLA raises its own runtime error
    return False
  return True


# A program of integer bits (rows and keys drawn with jax.random) computes the same bits at any
# optimization level; at XLA's lowest it compiles in half the time (0.58 -> 0.26 s for a block of
# 250 steps' rows), and it runs once every few hundred steps.
QUICK_COMPILE = {"xla_backend_optimization_level": 0}


def blocks_ahead(draw, first: int, size: int):
  """Yields (start, np.asarray(draw(start))) for start = first, first + size, ...: blocks of
  draws a loop's host batches are made from. Each block is dispatched one block before it is
  read: a draw dispatched when its rows are needed queues behind the steps already dispatched,
  so the host would wait for them, and the device then for the host's next batches."""
  start, pending = first, draw(first)
  while True:
    ahead = draw(start + size)
    yield start, jax.tree.map(np.asarray, pending)
    start, pending = start + size, ahead
