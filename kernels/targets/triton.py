"""Targets "triton" (CUDA/ROCm, Pallas' Triton lowering) and "interpret" (the same launch on
JAX's generic Pallas interpreter, on any host): the "loop" launch style of `kernels/launch.py`.

Grid (written block, b, h): a step keeps its [block, w] tile of the written sequence on chip and
loops over the read sequence held whole (FlashAttention-2's schedule; no atomics, since dq and
dk/dv are separate kernels). Triton needs power-of-two blocks of at least 16 rows and features.

GPUs: NVIDIA Ampere to Hopper (sm80-sm90), through the tile budget. `BLOCKS` are the tiles for
H100/H200 at d <= 128; on target "triton" (and "mosaic_gpu"'s Triton launches) each launch's
tiles are shrunk (the larger of block_q, block_k halved first, down to 16) until its
shared-memory estimate fits the budget of the GPU class they are chosen for
(`kernels/targets/smem.py`): this host's GPU, or H100/H200 (232,448 bytes per thread block) when
lowering from a host without one; ATTN_TRITON_SMEM=ampere chooses the A100's 166,912 bytes
(sm86: A10, A40, RTX 30xx, L4, L40, 101,376; or a number of bytes). So float32 at d = 256 gets
64 x 32 forward and 32 x 32 backward tiles on Hopper (the defaults would need ~393 KB);
bfloat16 at d = 256 keeps the defaults on Hopper and gets 64 x 64 forward, 64 x 32 backward
tiles on an A100. Inputs whose 16 x 16 tiles do not fit are refused when traced. Tiles passed
explicitly (block_q, block_k, block_sizes) are used as given. float32 dots are IEEE
(`_common.dot`), which Triton runs on CUDA cores, not tensor cores: 16-bit inputs are the fast
path. ROCm GPUs are in no budget class (untested; they get the default).
"""

from __future__ import annotations

import functools

from jax.experimental import pallas as pl

from kernels import launch as launch_lib
from kernels._common import LANES, BlockSizes
from kernels.targets import smem
from kernels.targets.base import TARGETS, Target

# Tiles per kernel, shrunk per input to the shared-memory budget (`smem.fit`, the module
# docstring). Dot product: FlashAttention-2's Triton tiles for d <= 128 on A100/H100.
# Additive: the tanh tile [block_q, block_k, block_d] lives in registers: 32 x 32 x 8 floats is
# 64 per thread at 4 warps. Tune with experiments/bench_kernel.py.
BLOCKS = {
    "flash_attention": BlockSizes(block_q=128, block_k=64, block_q_bwd=64, block_k_bwd=64,
                                  num_stages=2),
    "additive_attention": BlockSizes(block_q=32, block_k=32, block_d=8, num_warps=4,
                                     num_stages=2),
}
# Interpret mode: large tiles mean few grid steps, which is what costs time there (additive:
# block_d unset, all of d_attn at once).
INTERPRET_BLOCKS = {"flash_attention": BlockSizes(block_q=64, block_k=64),
                    "additive_attention": BlockSizes(block_q=64, block_k=64)}


def row_spec(block, width, layout):  # a [block, width] slab of (b, h), grid (row block, b, h)
  return pl.BlockSpec(layout.block(block, width), lambda r, b, h: layout.index(b, h, r))


def full_spec(T, width, layout):  # the whole [T, width] sequence of (b, h)
  return pl.BlockSpec(layout.block(T, width), lambda r, b, h: layout.index(b, h, 0))


# Lengths are [B, 1, LANES] rows read as `ref[0, 0]` (see `_common.length_rows`).
LEN_SPEC = pl.BlockSpec((None, 1, LANES), lambda r, b, h: (b, 0, 0))

# role -> BlockSpec of an operand x (its shape, in `layout`) whose written tile has `block` rows.
_SPECS = {
    launch_lib.ROW: lambda x, block, layout: row_spec(block, x.shape[-1], layout),
    launch_lib.OTHER: lambda x, block, layout: full_spec(layout.dims(x)[2], x.shape[-1], layout),
    launch_lib.HEAD: lambda x, block, layout: pl.BlockSpec((None, 1, x.shape[-1]),
                                                           lambda r, b, h: (h, 0, 0)),
    launch_lib.LENGTHS: lambda x, block, layout: LEN_SPEC,
    launch_lib.BLOCK_ROW: lambda x, block, layout: pl.BlockSpec(
        (None, None, None, 1, x.shape[-1]), lambda r, b, h: (b, h, r, 0, 0)),
}


def compiler_params(blocks: BlockSizes, head_dim: int):
  """Triton launch parameters: num_warps (default by head dim) and num_stages from the tiles.

  Passed explicitly because with no params jax picks its GPU lowering from the
  `jax_pallas_use_mosaic_gpu` flag (Mosaic GPU by default), which these kernels are not written for.
  """
  from jax.experimental.pallas import triton as pl_triton  # deprecated in jax 0.11: import lazily
  num_warps = blocks.num_warps or (4 if head_dim <= 64 else 8)
  return pl_triton.CompilerParams(num_warps=num_warps, num_stages=blocks.num_stages)


def _loop_launch(call: launch_lib.Call, inputs, cfg, *, layout):
  """The loop launch of `call` on operands in `layout` (compiled with Triton params unless cfg's
  target interprets)."""
  block = call.written_block
  B, H = layout.dims(call.out_shapes[0])[:2]
  params = None if cfg.interpret else compiler_params(cfg.blocks, call.head_dim)
  spec = lambda x, r: _SPECS[r](x, block, layout)
  return launch_lib.pallas_call(
      call, inputs, cfg, kernel=call.loop_body(call.read_block),
      grid=(call.lengths(inputs, layout)[0] // block, B, H),
      in_specs=[spec(x, r) for x, r in zip(inputs, call.inputs)],
      out_specs=[spec(s, r) for s, r in zip(call.out_shapes, call.outputs)],
      compiler_params=params)


# Token-major: a block (None, rows, None, w) of the public [B, T, H, w] arrays, as JAX's own
# Triton attention (`pallas/ops/gpu/attention.py`) indexes them: Triton loads a block through
# strided pointers, so no transpose is needed. Head-major for the Mosaic GPU forward's targets,
# whose TMA copies take [b, h, rows] slabs (their Triton backward runs on the same operands).
loop_launch = launch_lib.Launch(
    functools.partial(_loop_launch, layout=launch_lib.TOKEN_MAJOR), launch_lib.TOKEN_MAJOR)
loop_launch_head_major = launch_lib.Launch(
    functools.partial(_loop_launch, layout=launch_lib.HEAD_MAJOR), launch_lib.HEAD_MAJOR)


TARGETS.add(Target(
    name="triton", implementation="pallas", blocks=BLOCKS, launch=loop_launch,
    platforms=("cuda", "rocm"), auto=True, interpreted="interpret", fit=smem.fit,
    summary="Pallas Triton on CUDA/ROCm; both kernels, forward and backward"))
TARGETS.add(Target(
    name="interpret", implementation="pallas", blocks=INTERPRET_BLOCKS, launch=loop_launch,
    interpret=True,
    summary="the Triton launch on JAX's generic Pallas interpreter (any host; tests)"))
