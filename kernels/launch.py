"""What a kernel asks a target to launch: one pallas_call, described without a grid or BlockSpecs.

A kernel knows its bodies, its operands and what each operand is to the grid; a target
(`kernels/targets/`) knows how to walk them on its platform. So a kernel describes each
pallas_call as a `Call`: its operands by *role*, its output shapes, and one body per launch style,
and the target's launch builder turns that into the grid, the BlockSpecs, on-chip scratch and its
compiler params (`Target.launch(call, inputs, cfg)`).

Operands reach the kernels padded by the skeleton (`kernels/_skeleton.py`) in the layout of the
launch (`Launch.layout`, a `Layout`): token-major [B, T, H, w], the public layout itself, where
a block can squeeze out the head axis (Triton: no transpose in HBM around the pallas_call), or
head-major [B, H, T, w], where Mosaic TPU needs the last two block dims to be (rows, w). Row
statistics (lse, delta) follow the same layout with w = 1.

Every grid writes blocks of one sequence (`Call.writes`: the queries for the forward and dq
kernels, the keys for dk/dv) and reads the other. Roles, written below head-major:
- ROW: [B, H, T, w] along the written sequence: the block a grid step writes.
- OTHER: [B, H, T, w] along the read sequence: all of it in a loop launch, one block per step
  in a grid launch.
- HEAD: [H, 1, w], one row per head (the additive score's v), in every layout.
- LENGTHS: [B, 1, LANES] int32 lengths (`_common.length_rows`).
- BLOCK_ROW: [B, H, n_blocks, 1, w] output, one row per written block (partial sums added in
  XLA), in every layout.

Launch styles (which body a target runs):
- "loop": grid (written block, b, h); the body loops over the read sequence held whole on chip
  (Triton; the generic interpreter). `Call.loop_body(read_block)` returns the body.
- "grid": grid (b, h, written block, read block); the body takes one [written, read] tile per
  step of the innermost axis and accumulates in float32 scratch of `Call.grid_scratch` shapes
  (Mosaic TPU; JAX's TPU interpreter). `Call.grid_body` is the body.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
from jax.experimental import pallas as pl

ROW, OTHER, HEAD, LENGTHS, BLOCK_ROW = "row", "other", "head", "lengths", "block_row"


@dataclasses.dataclass(frozen=True)
class Layout:
  """Where the sequence and head axes of a kernel operand [B, ·, ·, w] lie.

  heads_first: head-major [B, H, T, w]; else token-major [B, T, H, w], the public layout.
  """
  name: str
  heads_first: bool

  @property
  def seq_axis(self) -> int:
    return 2 if self.heads_first else 1

  def dims(self, x) -> tuple[int, int, int, int]:
    """(B, H, T, w) of an operand x in this layout."""
    B, a, b, w = x.shape
    return (B, a, b, w) if self.heads_first else (B, b, a, w)

  def arrange(self, x):
    """[B, T, H, ...] -> this layout, and back (a swap of axes 1 and 2 is its own inverse)."""
    return jnp.swapaxes(x, 1, 2) if self.heads_first else x

  def block(self, rows, width) -> tuple:
    """Block shape of a [rows, width] slab of one (b, h), batch and head squeezed."""
    return (None, None, rows, width) if self.heads_first else (None, rows, None, width)

  def index(self, b, h, r) -> tuple:
    """Block index of row block r of (b, h)."""
    return (b, h, r, 0) if self.heads_first else (b, r, h, 0)


TOKEN_MAJOR = Layout("token_major", heads_first=False)
HEAD_MAJOR = Layout("head_major", heads_first=True)


@dataclasses.dataclass(frozen=True)
class Launch:
  """A launch builder, `build(call, inputs, cfg) -> outputs`, and the layout of the operands it
  takes; called like the builder (a `Target.launch`)."""
  build: Callable
  layout: Layout

  def __call__(self, call, inputs, cfg):
    return self.build(call, inputs, cfg)


def layout_of(launch_builder) -> Layout:
  """The operand layout of a target's launch: a `Launch`'s own; head-major for a bare builder
  function (the grid launch of Mosaic TPU, which needs (rows, w) as the last two block dims)."""
  return getattr(launch_builder, "layout", HEAD_MAJOR)


@dataclasses.dataclass(frozen=True)
class Call:
  """One pallas_call of a kernel, target-neutral (see the module docstring).

  writes: "q" or "k", the sequence whose blocks the grid writes. block_q, block_k: its tiles.
  inputs, outputs: a role per operand (outputs in the order of out_shapes).
  head_dim: the width a launch heuristic sizes by (Triton's num_warps).
  """
  name: str
  writes: str
  block_q: int
  block_k: int
  causal: bool
  inputs: tuple[str, ...]
  outputs: tuple[str, ...]
  out_shapes: tuple
  loop_body: Callable[[int], Callable]
  grid_body: Callable
  head_dim: int
  grid_scratch: tuple[tuple[int, ...], ...] = ()
  cost_estimate: Any = None

  @property
  def written_block(self) -> int:
    return self.block_q if self.writes == "q" else self.block_k

  @property
  def read_block(self) -> int:
    return self.block_k if self.writes == "q" else self.block_q

  def lengths(self, inputs, layout: Layout = HEAD_MAJOR) -> tuple[int, int]:
    """(T of the written sequence, T of the read one), from the first ROW and OTHER inputs."""
    rows = next(x for x, r in zip(inputs, self.inputs) if r == ROW)
    other = next(x for x, r in zip(inputs, self.inputs) if r == OTHER)
    return layout.dims(rows)[2], layout.dims(other)[2]


def pallas_call(call: Call, inputs, cfg, *, kernel, grid, in_specs, out_specs,
                scratch_shapes=(), compiler_params=None, prefetch=()):
  """pallas_call of a built launch; with cfg.poison, outputs start as NaN buffers aliased to
  extra inputs (an element the kernel fails to write shows as NaN). Returns the outputs.
  prefetch: scalar operands passed ahead of `inputs` to the index maps and the kernel (Mosaic
  TPU's scalar prefetch, `pltpu.PrefetchScalarGridSpec`); () for a plain grid."""
  extra, aliases = [], {}
  if cfg.poison:
    extra = [jnp.full(s.shape, jnp.nan, s.dtype) for s in call.out_shapes]
    aliases = {len(prefetch) + len(inputs) + n: n for n in range(len(call.out_shapes))}
  specs = dict(grid=grid, in_specs=list(in_specs) + (list(out_specs) if cfg.poison else []),
               out_specs=list(out_specs), scratch_shapes=tuple(scratch_shapes))
  if prefetch:
    from jax.experimental.pallas import tpu as pltpu  # only the TPU launch prefetches
    specs = dict(grid_spec=pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=len(prefetch),
                                                        **specs))
  return tuple(pl.pallas_call(
      kernel, out_shape=list(call.out_shapes), input_output_aliases=aliases,
      interpret=cfg.interpret, name=call.name, compiler_params=compiler_params,
      cost_estimate=call.cost_estimate, **specs,
  )(*prefetch, *inputs, *extra))
