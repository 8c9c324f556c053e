"""Targets "tpu" (Mosaic TPU) and "tpu_interpret" (the same launch on JAX's TPU interpreter, which
reads uninitialized scratch as NaN): the "grid" launch style of `kernels/launch.py`.

Grid (b, h, r, c): r the block a step writes, c the block it reads, the innermost "arbitrary"
axis reducing into VMEM scratch (the kernel bodies' side is `kernels/_grid_steps.py`). Pallas
copies a block only when its index changes between steps, so the index maps point every step
that computes nothing (causal steps past the diagonal, key blocks past the key length, padded
query blocks) at a block a visible step reads anyway (`read_block`, `row_block`): such steps
fetch nothing. The key and query lengths reach the index maps by scalar prefetch
(`pltpu.PrefetchScalarGridSpec`, as JAX's splash attention passes its mask metadata). Every
block's last two dims are (rows, w), rows a multiple of 8 and w the whole padded width: legal
Mosaic TPU blocks. Lowered and compiled deviceless for v5e (tests/test_kernels_tpu.py); never
run on a TPU, so "auto" keeps a TPU host on the blocked path.
"""

from __future__ import annotations

import numpy as np
from jax import numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels import _common
from kernels import launch as launch_lib
from kernels._common import LANES, BlockSizes
from kernels.targets.base import TARGETS, Target

# Tiles per kernel. Dot product: multiples of the 128-wide lanes and MXU, larger than the 128 of
# JAX's own TPU flash attention (`BlockSizes.get_default`, which its source calls provisional)
# to amortize the fixed cost of each grid step; the backward's tiles are halved since it keeps
# four [bq, bk] float32 tiles (S, P, dP, dS) live. Every d up to 256 in float32 compiles within
# v5e's 16 MiB of scoped VMEM at T = 16k (libtpu, deviceless); untimed on a TPU.
# Additive: a tanh slab is [block_d, bq, bk] with the keys on the lanes
# (`kernels/_additive_tpu.py`), so block_k = 128 fills them whatever block_d (8: a [8, 64, 128]
# float32 slab is the 64 vregs); a step forms bq·bk·d_attn tanh, 8x the old 32 x 32 tiles' work
# for the same fixed cost per step. The backward's bq is halved for its stash of the step's
# slabs, [d_attn, bq, bk] float32: 4 MiB at d_attn = 256. VMEM estimated and pinned, and every
# d_attn up to 512 compiled for v5e at T = 16k, in tests/test_kernels_tpu.py; untimed on a TPU.
BLOCKS = {
    "flash_attention": BlockSizes(block_q=512, block_k=512, block_q_bwd=256, block_k_bwd=256),
    "additive_attention": BlockSizes(block_q=64, block_k=128, block_q_bwd=32, block_k_bwd=128,
                                     block_d=8),
}
INTERPRET_BLOCKS = {"flash_attention": BlockSizes(block_q=64, block_k=64),
                    "additive_attention": BlockSizes(block_q=64, block_k=64)}

# b, h and the written block are independent (Mosaic may split them over cores); the read block
# is the reduction into scratch, so its steps run in order.
SEMANTICS = ("parallel", "parallel", "parallel", "arbitrary")


# ----------------------------------------------------------------------------------------------
# Which steps compute, from the lengths (scalar-prefetched: the index maps see them). A row is a
# written block r; its visible read blocks form one range [lo, hi) (the kernels' `visible`), and
# the rows with any visible step form a prefix [0, R) of the grid's rows (key blocks past the
# key length, padded query blocks and causal rows past the queries come last). Index maps below
# compute on non-negative int32 program ids and lengths with `lax.div` (truncation), not `//`,
# whose sign fix-up Mosaic lowers only when it knows the TPU generation (not deviceless).


def key_span(block_q, block_k, causal):
  """Writes queries: (r, kl, ql) -> (lo, hi), the key blocks query block r computes (lo = 0)."""
  def span(r, kl, ql):
    return np.int32(0), _common.num_key_blocks(r, block_q, block_k, kl, ql, causal)
  return span


def query_span(block_q, block_k, causal):
  """Writes keys: (r, kl, ql) -> (lo, hi), the query blocks key block r computes."""
  def span(r, kl, ql):
    lo, hi = _common.query_block_range(r, block_q, block_k, kl, ql, causal)
    return lo, jnp.maximum(hi, lo)
  return span


def query_rows(block_q, block_k, causal):
  """Writes queries: (kl, ql) -> R, the query blocks with a visible step: those holding a
  query row, when there is a key (a causal row always sees key 0)."""
  del block_k, causal
  return lambda kl, ql: jnp.where(kl > 0, pl.cdiv(ql, np.int32(block_q)), 0)


def key_rows(block_q, block_k, causal):
  """Writes keys: (kl, ql) -> R, the key blocks with a visible step: those holding a key, when
  there is a query; causal, also only those starting before the end of the last query block
  (`query_block_range` starts key block r at query block r * block_k // block_q)."""
  def rows(kl, ql):
    n_q = pl.cdiv(ql, np.int32(block_q))
    n_k = pl.cdiv(kl, np.int32(block_k))
    if causal:
      return jnp.minimum(n_k, pl.cdiv(n_q * np.int32(block_q), np.int32(block_k)))
    return jnp.where(n_q > 0, n_k, 0)
  return rows


def read_block(span, rows):
  """(r, c, kl, ql) -> the read block of grid step (r, c): c on a visible step; on a skipped one
  the block of the next visible step of the same (b, h), or of the last one when none follows.

  Pallas copies a block when its index differs from the previous step's, one step ahead, so:
  - a skipped step never fetches a block no visible step needs: the blocks read, in grid order,
    change only where the visible steps' blocks change (the fewest copies there can be);
  - the copy for a row's first visible step is issued as early as possible, during the previous
    row's last visible step (its skipped tail already points at that block), so it overlaps
    compute. The alternative, clamping skipped steps to the row's last visible block, issues the
    same copy one step later, during an empty step, where nothing hides it. For the forward and
    dq kernels (lo = 0) the next row's first block is block 0, as in JAX's TPU flash attention.
  The last visible row's tail (and the rows after it) keep the last visible block rather than
  fetch the next (b, h)'s first one: which (b, h) a core runs next depends on how Mosaic splits
  the parallel axes.
  """
  def index(r, c, kl, ql):
    lo, hi = span(r, kl, ql)
    n_rows = rows(kl, ql)
    next_lo, _ = span(r + 1, kl, ql)
    _, last_hi = span(n_rows - 1, kl, ql)
    last = jnp.where(n_rows > 0, jnp.maximum(last_hi - 1, 0), 0)
    ahead = jnp.where(r + 1 < n_rows, next_lo, last)
    ahead = jnp.where((c < lo) & (lo < hi), lo, ahead)  # before the row's range: its first block
    return jnp.where((lo <= c) & (c < hi), c, ahead)
  return index


def row_block(rows):
  """(r, kl, ql) -> the block of a written-sequence input (q, dO, lse, delta of the forward and
  dq kernels; k, v of dk/dv) at row r: r, but a row with no visible step keeps the last visible
  row's block (the grid bodies read these inputs only on visible steps; outputs are still
  written at every row)."""
  return lambda r, kl, ql: jnp.minimum(r, jnp.maximum(rows(kl, ql) - 1, 0))


def spans(call: launch_lib.Call):
  """(span, rows) of `call` (see above)."""
  bq, bk = call.block_q, call.block_k
  if call.writes == "q":
    return key_span(bq, bk, call.causal), query_rows(bq, bk, call.causal)
  return query_span(bq, bk, call.causal), key_rows(bq, bk, call.causal)


# ----------------------------------------------------------------------------------------------
# BlockSpecs. Index maps take (b, h, r, c, kl_ref, ql_ref): the grid and the prefetched [B]
# lengths in SMEM.

LEN_SPEC = pl.BlockSpec((None, 1, LANES), lambda b, h, r, c, kl, ql: (b, 0, 0))


def spec(block, width, rows):
  """A [block, width] slab of a [B, H, T, width] array; rows(r, c, kl, ql) -> its row block."""
  return pl.BlockSpec((None, None, block, width),
                      lambda b, h, r, c, kl, ql: (b, h, rows(r, c, kl[b], ql[b]), 0))


def _specs(call: launch_lib.Call):
  """role -> (x, is_output) -> BlockSpec of operand x."""
  bw, br = call.written_block, call.read_block
  span, rows = spans(call)
  read, row = read_block(span, rows), row_block(rows)
  written = lambda r, c, kl, ql: r
  return {
      launch_lib.ROW: lambda x, out: spec(
          bw, x.shape[-1], written if out else lambda r, c, kl, ql: row(r, kl, ql)),
      launch_lib.OTHER: lambda x, out: spec(br, x.shape[-1], read),
      launch_lib.HEAD: lambda x, out: pl.BlockSpec(
          (None, 1, x.shape[-1]), lambda b, h, r, c, kl, ql: (h, 0, 0)),
      launch_lib.LENGTHS: lambda x, out: LEN_SPEC,
      launch_lib.BLOCK_ROW: lambda x, out: pl.BlockSpec(
          (None, None, None, 1, x.shape[-1]), lambda b, h, r, c, kl, ql: (b, h, r, 0, 0)),
  }


def prefetched_lengths(call: launch_lib.Call, inputs):
  """(key_lengths, query_lengths) [B] int32, read back from the call's two LENGTHS operands
  (`_common.length_rows`, passed in that order by every kernel) for scalar prefetch."""
  rows = [x for x, r in zip(inputs, call.inputs) if r == launch_lib.LENGTHS]
  assert len(rows) == 2, call.inputs
  return tuple(x[:, 0, 0] for x in rows)


def grid_launch(call: launch_lib.Call, inputs, cfg):
  """The grid launch of `call` (Mosaic TPU params unless cfg's target interprets). The lengths
  are scalar-prefetched for the index maps; the bodies keep reading their VMEM copies."""
  T_w, T_r = call.lengths(inputs)
  B, H = call.out_shapes[0].shape[:2]
  specs = _specs(call)
  params = None if cfg.interpret else pltpu.CompilerParams(dimension_semantics=SEMANTICS)
  return launch_lib.pallas_call(
      call, inputs, cfg, kernel=lambda kl, ql, *refs: call.grid_body(*refs),
      grid=(B, H, T_w // call.written_block, T_r // call.read_block),
      in_specs=[specs[r](x, False) for x, r in zip(inputs, call.inputs)],
      out_specs=[specs[r](s, True) for s, r in zip(call.out_shapes, call.outputs)],
      scratch_shapes=[pltpu.VMEM(s, jnp.float32) for s in call.grid_scratch],
      compiler_params=params, prefetch=prefetched_lengths(call, inputs))


TARGETS.add(Target(
    name="tpu", implementation="pallas", blocks=BLOCKS, launch=grid_launch, platforms=("tpu",),
    auto=True, interpreted="tpu_interpret",
    summary="Mosaic TPU; both kernels, forward and backward; lowered and compiled, never run"))
TARGETS.add(Target(
    name="tpu_interpret", implementation="pallas", blocks=INTERPRET_BLOCKS, launch=grid_launch,
    interpret=pltpu.InterpretParams(),
    summary="the TPU launch on JAX's TPU interpreter (any host; tests)"))
