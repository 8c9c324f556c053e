"""Kernel-body helpers of the "grid" launch style (`kernels/launch.py`; Mosaic TPU, JAX's TPU
interpreter): grid (b, h, r, c) with r the block a step writes and c the block it reads, the
innermost axis c a reduction into float32 scratch (set at c = 0, written out at the last c).

A TPU kernel keeps only tiles in VMEM (v5e: 16 MiB scoped by default): a kernel that loops over a
whole other sequence inside one grid step needs that sequence's [T, d] slab resident, more than
that at long T. So the grid launch walks the other sequence as
the innermost grid axis (JAX's `pallas/ops/tpu/flash_attention.py` does the same); its grid,
BlockSpecs and compiler params are the TPU target's (`kernels/targets/tpu.py`).
"""

from __future__ import annotations

import functools

from jax import lax
from jax import numpy as jnp
from jax.experimental import pallas as pl

from kernels import _common


# Kernel-body helpers for the reduction over c (call them from a kernel body).


def reduce_steps(scratch_refs, *, visible, accumulate, write):
  """Zeroes the scratch accumulators at c = 0, runs `accumulate()` on the steps where `visible`
  (a traced bool; masked steps compute nothing) and `write()` at the last c."""
  c = pl.program_id(3)

  @pl.when(c == 0)
  def _init():
    for ref in scratch_refs:
      ref[...] = jnp.zeros(ref.shape, ref.dtype)

  pl.when(visible)(accumulate)
  pl.when(c == pl.num_programs(3) - 1)(write)


def by_mask(whole, step):
  """A grid step's `accumulate` that runs step(masked=False) where the tile is whole (every row
  sees every key: no mask, no `where`) and step(masked=True) otherwise: one `lax.cond`."""
  return lambda: lax.cond(whole, functools.partial(step, masked=False),
                          functools.partial(step, masked=True))


def online_softmax_steps(o_ref, lse_ref, m_ref, l_ref, acc_ref, *, visible, update):
  """The forward's reduction: the online-softmax state (m, l [bq, LANES], acc [bq, dv]) lives in
  scratch from c = 0; visible steps fold a key tile in with `update((m, l, acc)) -> (m, l, acc)`
  ([bq] vectors); the last c writes out = acc / l and lse (see `_common.finish_softmax`).

  m and l are kept lane-replicated, each row's value in all 128 lanes, as JAX's TPU flash
  attention keeps them ([block_q, MIN_BLOCK_SIZE]): a [bq, 1] buffer takes the same VMEM (a
  column pads to whole (8, 128) tiles) but is stored with one-lane masked stores and read back
  through a relayout; the replicated rows store whole vregs and read back as a column."""
  c = pl.program_id(3)

  def store(m, l, acc):
    m_ref[...] = jnp.broadcast_to(m[:, None], m_ref.shape)
    l_ref[...] = jnp.broadcast_to(l[:, None], l_ref.shape)
    acc_ref[...] = acc

  @pl.when(c == 0)
  def _init():
    store(*_common.online_softmax_init(*acc_ref.shape))

  @pl.when(visible)
  def _step():
    store(*update((m_ref[:, 0], l_ref[:, 0], acc_ref[...])))

  @pl.when(c == pl.num_programs(3) - 1)
  def _finish():
    out, lse = _common.finish_softmax(m_ref[:, 0], l_ref[:, 0], acc_ref[...])
    o_ref[...] = out.astype(o_ref.dtype)
    lse_ref[...] = lse[:, None]
