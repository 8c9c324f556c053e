"""Targets "tpu" (Mosaic TPU) and "tpu_interpret" (the same launch on JAX's TPU interpreter, which
reads uninitialized scratch as NaN): the "grid" launch style of `kernels/launch.py`.

Grid (b, h, r, c): r the block a step writes, c the block it reads, the innermost "arbitrary"
axis reducing into VMEM scratch (the kernel bodies' side is `kernels/_grid_steps.py`). Pallas
copies a block only when its index changes between steps, so an index map that clamps c to the
last (or first) block that causal masking leaves visible fetches nothing for skipped steps. Every
block's last two dims are (rows, w), rows a multiple of 8 and w the whole padded width: legal
Mosaic TPU blocks. Lowered and compiled deviceless for v5e (tests/test_kernels_tpu.py); never
run on a TPU, so "auto" keeps a TPU host on the blocked path.
"""

from __future__ import annotations

import numpy as np
from jax import lax
from jax import numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels import launch as launch_lib
from kernels._common import LANES, BlockSizes
from kernels.targets.base import TARGETS, Target

# Tiles per kernel. Dot product: multiples of the 128-wide lanes and MXU, larger than the 128 of
# JAX's own TPU flash attention (`BlockSizes.get_default`, which its source calls provisional)
# to amortize the fixed cost of each grid step; the backward's tiles are halved since it keeps
# four [bq, bk] float32 tiles (S, P, dP, dS) live. Every d up to 256 in float32 compiles within
# v5e's 16 MiB of scoped VMEM at T = 16k (libtpu, deviceless); untimed on a TPU.
# Additive: a tanh tile's last axis is the 128-lane axis, so block_d = 8 would pad every slice
# 16-fold and unroll d_attn / 8 of them; at d_attn = 256 the backward then exceeds scoped VMEM.
BLOCKS = {
    "flash_attention": BlockSizes(block_q=512, block_k=512, block_q_bwd=256, block_k_bwd=256),
    "additive_attention": BlockSizes(block_q=32, block_k=32, block_d=128),
}
INTERPRET_BLOCKS = {"flash_attention": BlockSizes(block_q=64, block_k=64),
                    "additive_attention": BlockSizes(block_q=64, block_k=64)}

# b, h and the written block are independent (Mosaic may split them over cores); the read block
# is the reduction into scratch, so its steps run in order.
SEMANTICS = ("parallel", "parallel", "parallel", "arbitrary")
LEN_SPEC = pl.BlockSpec((None, 1, LANES), lambda b, h, r, c: (b, 0, 0))


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


def grid_launch(call: launch_lib.Call, inputs, cfg):
  """The grid launch of `call` (Mosaic TPU params unless cfg's target interprets)."""
  bq, bk, bw, br = call.block_q, call.block_k, call.written_block, call.read_block
  T_w, T_r = call.lengths(inputs)
  B, H = call.out_shapes[0].shape[:2]
  read = (key_rows(bq, bk, call.causal) if call.writes == "q"
          else query_rows(bq, bk, T_r // bq, call.causal))
  specs = {
      launch_lib.ROW: lambda x: spec(bw, x.shape[-1]),
      launch_lib.OTHER: lambda x: spec(br, x.shape[-1], read),
      launch_lib.HEAD: lambda x: pl.BlockSpec((None, 1, x.shape[-1]),
                                              lambda b, h, r, c: (h, 0, 0)),
      launch_lib.LENGTHS: lambda x: LEN_SPEC,
      launch_lib.BLOCK_ROW: lambda x: pl.BlockSpec((None, None, None, 1, x.shape[-1]),
                                                   lambda b, h, r, c: (b, h, r, 0, 0)),
  }
  params = None if cfg.interpret else pltpu.CompilerParams(dimension_semantics=SEMANTICS)
  return launch_lib.pallas_call(
      call, inputs, cfg, kernel=call.grid_body, grid=(B, H, T_w // bw, T_r // br),
      in_specs=[specs[r](x) for x, r in zip(inputs, call.inputs)],
      out_specs=[specs[r](s) for s, r in zip(call.out_shapes, call.outputs)],
      scratch_shapes=[pltpu.VMEM(s, jnp.float32) for s in call.grid_scratch],
      compiler_params=params)


TARGETS.add(Target(
    name="tpu", implementation="pallas", blocks=BLOCKS, launch=grid_launch, platforms=("tpu",),
    auto=True, interpreted="tpu_interpret",
    summary="Mosaic TPU; both kernels, forward and backward; lowered and compiled, never run"))
TARGETS.add(Target(
    name="tpu_interpret", implementation="pallas", blocks=INTERPRET_BLOCKS, launch=grid_launch,
    interpret=pltpu.InterpretParams(),
    summary="the TPU launch on JAX's TPU interpreter (any host; tests)"))
