"""Mosaic TPU launch pieces: the grid with a reduction axis, its BlockSpecs and compiler params.

A TPU kernel keeps only tiles in VMEM (v5e: 16 MiB scoped by default): a kernel that loops over a
whole other sequence inside one grid step needs that sequence's [T, d] slab resident (at T = 16k,
bf16, d = 128 the dk/dv backward asked for 24 MiB). The TPU launches therefore walk the other
sequence as the innermost grid axis (JAX's `pallas/ops/tpu/flash_attention.py` does the same):
grid (b, h, r, c) with r the block this step writes and c the block it reads, accumulators in VMEM
scratch (set at c = 0, written out at the last c), and the semantics below. Pallas copies a block
only when its index changes between steps, so a BlockSpec whose index map clamps c to the last
(or first) block that causal masking leaves visible fetches nothing for skipped steps.
"""

from __future__ import annotations

import numpy as np
from jax import lax
from jax import numpy as jnp
from jax.experimental import pallas as pl

from kernels import _common
from kernels._common import LANES

# b, h and the written block are independent (Mosaic may split them over cores); the read block
# is the reduction into scratch, so its steps run in order.
SEMANTICS = ("parallel", "parallel", "parallel", "arbitrary")
LEN_SPEC = pl.BlockSpec((None, 1, LANES), lambda b, h, r, c: (b, 0, 0))  # see _common.LEN_SPEC


def compiler_params(plan):
  """Mosaic TPU params for a `_common.Launch` (None when it leaves the grid's semantics unsaid).
  `pltpu.CompilerParams(dimension_semantics=...)`: the same class and field in jax 0.10.2 and
  0.11.2."""
  if plan.dimension_semantics is None:
    return None
  from jax.experimental.pallas import tpu as pltpu
  return pltpu.CompilerParams(dimension_semantics=plan.dimension_semantics)


def scratch(*shapes):
  """float32 VMEM scratch buffers of the given shapes (accumulators that live across c)."""
  from jax.experimental.pallas import tpu as pltpu
  return tuple(pltpu.VMEM(s, jnp.float32) for s in shapes)


def written(r, c):  # the block a step writes: its row block is the grid's r
  del c
  return r


def spec(block, width, rows=written):
  """A [block, width] slab of a [B, H, T, width] array at grid step (b, h, r, c); rows(r, c) is the
  row-block index (default r)."""
  return pl.BlockSpec((None, None, block, width), lambda b, h, r, c: (b, h, rows(r, c), 0))


# Index maps below compute on non-negative int32 program ids with `lax.div` (truncation), not
# `//`, whose sign fix-up Mosaic lowers only when it knows the TPU generation (not deviceless).


def key_rows(block_q, block_k, causal):
  """Row block of k / v read at (r = query block, c = key block): c, but under causal masking
  never past the last key block that query block r sees (later steps compute nothing)."""
  if not causal:
    return lambda r, c: c
  return lambda r, c: jnp.minimum(c, lax.div((r + 1) * np.int32(block_q) - 1, np.int32(block_k)))


def query_rows(block_q, block_k, num_q_blocks, causal):
  """Row block of q / dO / lse / delta read at (r = key block, c = query block): c, but under
  causal masking never before the first query block that sees key block r."""
  if not causal:
    return lambda r, c: c
  first = lambda r: lax.div(r * np.int32(block_k), np.int32(block_q))
  return lambda r, c: jnp.minimum(jnp.maximum(c, first(r)), np.int32(num_q_blocks - 1))


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


def online_softmax_steps(o_ref, lse_ref, m_ref, l_ref, acc_ref, *, visible, update):
  """The forward's reduction: the online-softmax state (m, l [bq, 1], acc [bq, dv]) lives in
  scratch from c = 0; visible steps fold a key tile in with `update((m, l, acc)) -> (m, l, acc)`
  ([bq] vectors); the last c writes out = acc / l and lse (see `_common.finish_softmax`)."""
  c = pl.program_id(3)

  def store(m, l, acc):
    m_ref[...], l_ref[...], acc_ref[...] = m[:, None], l[:, None], acc

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
