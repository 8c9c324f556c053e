"""Kernel-body helpers of the "loop" launch style (`kernels/launch.py`; Triton, the generic
interpreter): a grid step holds its tile of the written sequence and loops over the blocks of the
other one. Each loop runs as consecutive `fori_loop`s over ranges of blocks that need the mask
and ranges that every row sees whole, which skip the mask and its `where`s (FlashAttention-3's
split; the bounds are `kernels/_common.py`'s, tested against the mask itself in
tests/test_kernels_tiles.py). The "grid" style's helpers are `kernels/_grid_steps.py`.
"""

from __future__ import annotations

import functools

from jax import lax
from jax import numpy as jnp

from kernels import _common


def split_loops(body, init, *ranges):
  """`lax.fori_loop`s of body(index, carry, masked) over consecutive (lo, hi, masked) ranges."""
  carry = init
  for lo, hi, masked in ranges:
    carry = lax.fori_loop(lo, hi, functools.partial(body, masked=masked), carry)
  return carry


def key_ranges(i, block_q, block_k, lengths, causal):
  """The key blocks query block i visits: whole [0, n_whole), then masked [n_whole, n).
  lengths: (key_length, query_length)."""
  n = _common.num_key_blocks(i, block_q, block_k, *lengths, causal)
  n_whole = jnp.minimum(_common.whole_key_blocks(i, block_q, block_k, *lengths, causal), n)
  return (0, n_whole, False), (n_whole, n, True)


def query_ranges(j, block_q, block_k, lengths, causal):
  """The query blocks that see key block j: masked [lo, wlo), whole [wlo, whi), masked [whi, hi),
  with lo <= wlo <= whi <= hi (the whole ones clipped into `query_block_range`, which they can
  leave when it is empty)."""
  lo, hi = _common.query_block_range(j, block_q, block_k, *lengths, causal)
  hi = jnp.maximum(hi, lo)
  wlo, whi = _common.whole_query_blocks(j, block_q, block_k, *lengths, causal)
  wlo = jnp.clip(wlo, lo, hi)
  whi = jnp.clip(whi, wlo, hi)
  return (lo, wlo, True), (wlo, whi, False), (whi, hi, True)
