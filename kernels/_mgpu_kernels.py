"""The kernel bodies of the Mosaic GPU forward (`kernels/flash_attention_mgpu.py` launches them).

Two schedules of the same per-tile math (`_key_tile`):
- `pipelined_kernel`: one warpgroup per program (64 query rows) that issues its own TMA copies,
  STAGES key/value slots ahead, between its matrix products.
- `warp_specialized_kernel`: FlashAttention-3's schedule (Shah et al. 2024, section 3.1): per
  program two compute warpgroups of 64 query rows each (128 rows) share every key/value tile,
  and a third, memory warpgroup only issues the TMA copies, refilling a slot once both compute
  warpgroups have released it ("consumed" barriers of two arrivals). The compute warpgroups
  take turns on the tensor cores (a schedule barrier of two arrivals, the paper's "pingpong"):
  one's softmax overlaps the other's matrix products.

Refs: q/k/v/out [B, H, T, d] and lse [B, H, T] in global memory, lengths [B] int32 in global
memory (read as scalars); the scratch tiles in shared memory; barriers. Grid axes by name
("heads", "q_blocks", "batch"; "wg" the warpgroup of a warp-specialized program), read with
`lax.axis_index` (the interpreter's `program_id` is always 0).

Softmax in base 2 (FlashAttention-3's kernels, JAX's attention_mgpu): scores are scaled by
scale·log2(e) once, so every exponential is one `exp2` (approximate with approx_math); m is kept
in that unit and the lse is converted back to the natural log, m·ln 2 + log l, which is what the
Triton backward reads. In interpret mode the matrix products are `lax.dot_general` on the same
shared-memory tiles and the register layouts plain arrays (see the launch module's docstring).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from kernels import _common

_F32 = jnp.float32
LOG2E = math.log2(math.e)
LN2 = math.log(2.0)
WARPGROUP_ROWS = 64  # WGMMA's M per warpgroup: the query rows of one compute warpgroup
COMPUTE_REGISTERS, MEMORY_REGISTERS = 232, 40  # per thread: 2·128·232 + 128·40 <= 65536


class Ops(NamedTuple):
  """How a tile's matrix products and register layouts are built (GPU or interpreter).

  s_tile(q_smem [bq, d], k_smem [bk, d], issued) -> S [bq, bk] float32, calling issued()
    while the product may still be in flight.
  pv_into(acc [bq, dv] f32, p [bq, bk] 16-bit, v_smem [bk, dv]) -> acc + P V.
  cast(x, layout) and iota(shape, dim) -> int32 positions along dim.
  """
  s_tile: object
  pv_into: object
  cast: object
  iota: object


def ops(interpret: bool) -> Ops:
  """WGMMA with PV accumulated in place on a GPU; dot_general in the interpreter, whose WGMMA
  takes neither a transposed operand nor one from registers and which has no `pl.run_state`."""
  if interpret:
    def s_tile_interpreted(q_smem, k_smem, issued):
      issued()  # the product below is synchronous: the barrier hook runs first, as on a GPU
      return _common.dot_nt(q_smem[...], k_smem[...])

    return Ops(s_tile=s_tile_interpreted,
               pv_into=lambda acc, p, v: acc + _common.dot(p, v[...]),
               cast=lambda x, layout: x,
               iota=lambda shape, dim: lax.broadcasted_iota(jnp.int32, shape, dim))

  def s_tile(q_smem, k_smem, issued):
    def body(acc_ref):
      plgpu.wgmma(acc_ref, q_smem, plgpu.transpose_ref(k_smem, (1, 0)))
      issued()
      return acc_ref[...]  # waits for the product
    return pl.run_scoped(body, plgpu.ACC((q_smem.shape[0], k_smem.shape[0]), _F32))

  def pv_into(acc, p, v_smem):
    # The rescaled accumulator becomes the WGMMA accumulator itself: no second [bq, dv] float32
    # array in registers (at dv = 256 two would take 256 registers a thread and spill).
    def body(acc_ref):
      plgpu.wgmma(acc_ref, p, v_smem)
    return pl.run_state(body)(plgpu.ACC.init(acc))

  return Ops(s_tile, pv_into, plgpu.layout_cast,
             lambda shape, dim: plgpu.broadcasted_iota(jnp.int32, shape, dim,
                                                       layout=plgpu.Layout.WGMMA))


def _nothing():
  """The default barrier hook of `key_tile`: a schedule with no other warpgroup to signal."""


def init_carry(o: Ops, bq: int, dv: int):
  """(m, l, acc) before the first key tile, in the WGMMA layouts: m = MASK_VALUE, l = acc = 0."""
  row = plgpu.Layout.WGMMA.reduce(1)
  return (o.cast(jnp.full((bq,), _common.MASK_VALUE, _F32), row),
          o.cast(jnp.full((bq,), 0.0, _F32), row),
          o.cast(jnp.full((bq, dv), 0.0, _F32), plgpu.Layout.WGMMA))


def key_tile(carry, q_smem, k_smem, v_smem, *, o: Ops, scale2, q0, k0, lengths, causal, masked,
             s_issued=_nothing, s_done=_nothing, before_pv=_nothing):
  """Folds one key tile into (m, l, acc): FlashAttention-2's Algorithm 1, lines 8-10, in base 2.

  q_smem [bq, d], k_smem [bk, d], v_smem [bk, dv]; carry m, l [bq], acc [bq, dv] float32, m in
  log2 units. scale2 = scale·log2(e); q0, k0: the tile's first query and key positions;
  lengths: (key_length, query_length). masked=False for tiles every row sees whole. The hooks
  are the schedule's barriers: s_issued() while S is computed, s_done() once S is in registers
  (k_smem is free), before_pv() before v_smem is read.
  """
  m_prev, l_prev, acc = carry
  s = o.s_tile(q_smem, k_smem, s_issued) * scale2  # [bq, bk] f32, log2 units
  s_done()
  if masked:  # the convention of _common.valid_mask (finite MASK_VALUE, p = 0 exactly)
    q_pos, k_pos = q0 + o.iota(s.shape, 0), k0 + o.iota(s.shape, 1)
    valid = (k_pos < lengths[0]) & (q_pos < lengths[1])
    if causal:
      valid &= k_pos <= q_pos
    s = jnp.where(valid, s, _common.MASK_VALUE)
  m_new = jnp.maximum(m_prev, s.max(axis=1))
  alpha = jnp.exp2(m_prev - m_new)
  p = jnp.exp2(s - lax.broadcast_in_dim(m_new, s.shape, [0]))
  if masked:
    p = jnp.where(valid, p, 0.0)
  l_new = alpha * l_prev + p.sum(axis=1)
  before_pv()
  acc = o.pv_into(acc * lax.broadcast_in_dim(alpha, acc.shape, [0]), p.astype(v_smem.dtype),
                  v_smem)
  return m_new, l_new, acc


def store_rows(carry, o_smem, lse_smem, o_ref, lse_ref, b, h, q0):
  """Algorithm 1, lines 12-13 (as _common.finish_softmax: empty rows -> out 0, lse -inf), then
  the [bq, dv] output tile and its lse (natural log) to global memory by TMA."""
  m, l, acc = carry
  nonempty = l > 0
  l_safe = jnp.where(nonempty, l, 1.0)
  o_smem[...] = (acc / lax.broadcast_in_dim(l_safe, acc.shape, [0])).astype(o_smem.dtype)
  lse_smem[...] = jnp.where(nonempty, m * LN2 + jnp.log(l_safe), -jnp.inf)
  plgpu.commit_smem()
  bq = o_smem.shape[0]
  plgpu.copy_smem_to_gmem(o_smem, o_ref.at[b, h, pl.ds(q0, bq)])
  plgpu.copy_smem_to_gmem(lse_smem, lse_ref.at[b, h, pl.ds(q0, bq)])
  plgpu.wait_smem_to_gmem(0)


def _fetch(k_ref, v_ref, k_smem, v_smem, k_bar, v_bar, b, h, j, slot):
  """TMA: key/value tile j into a slot, arriving on that slot's barriers."""
  rows = pl.ds(j * k_smem.shape[1], k_smem.shape[1])
  plgpu.copy_gmem_to_smem(k_ref.at[b, h, rows], k_smem.at[slot], k_bar.at[slot])
  plgpu.copy_gmem_to_smem(v_ref.at[b, h, rows], v_smem.at[slot], v_bar.at[slot])


def _fill(fetch, stages: int, tiles: int, n):
  """The first `stages` fetches (of the tiles in range: [0, min(stages, tiles)) below n)."""
  for j in range(min(stages, tiles)):
    pl.when(j < n)(functools.partial(fetch, j, j))


# ----------------------------------------------------------------------------------------------
# One warpgroup per program, issuing its own copies.


def pipelined_kernel(q_ref, k_ref, v_ref, kl_ref, ql_ref, o_ref, lse_ref, q_smem, o_smem,
                     k_smem, v_smem, lse_smem, q_bar, k_bar, v_bar, *, scale, causal,
                     interpret):
  """q_smem [64, d]; o_smem [64, dv] (q_smem itself when dv = d: q is dead by then); k_smem
  [S, bk, d], v_smem [S, bk, dv]; lse_smem [64]; q_bar one barrier, k_bar/v_bar S each."""
  bq, (stages, bk) = q_smem.shape[0], k_smem.shape[:2]
  h, i, b = lax.axis_index("heads"), lax.axis_index("q_blocks"), lax.axis_index("batch")
  lengths = kl_ref[b], ql_ref[b]
  o = ops(interpret)
  q0 = i * bq
  n = _common.num_key_blocks(i, bq, bk, *lengths, causal)
  fetch = functools.partial(_fetch, k_ref, v_ref, k_smem, v_smem, k_bar, v_bar, b, h)
  plgpu.copy_gmem_to_smem(q_ref.at[b, h, pl.ds(q0, bq)], q_smem, q_bar)
  _fill(fetch, stages, k_ref.shape[2] // bk, n)
  plgpu.barrier_wait(q_bar)

  def body(j, carry, masked):
    slot = lax.rem(j, jnp.int32(stages))
    plgpu.barrier_wait(k_bar.at[slot])
    carry = key_tile(carry, q_smem, k_smem.at[slot], v_smem.at[slot], o=o,
                     scale2=scale * LOG2E, q0=q0, k0=j * bk, lengths=lengths, causal=causal,
                     masked=masked, before_pv=lambda: plgpu.barrier_wait(v_bar.at[slot]))
    # Both products reading this slot are done (their results are in registers): refill it.
    pl.when(j + stages < n)(functools.partial(fetch, j + stages, slot))
    return carry

  # Key tiles every row of this query tile sees whole skip the mask (FlashAttention-3's split).
  n_whole = jnp.minimum(_common.whole_key_blocks(i, bq, bk, *lengths, causal), n)
  carry = lax.fori_loop(0, n_whole, functools.partial(body, masked=False),
                        init_carry(o, bq, v_smem.shape[-1]))
  carry = lax.fori_loop(n_whole, n, functools.partial(body, masked=True), carry)
  store_rows(carry, o_smem, lse_smem, o_ref, lse_ref, b, h, q0)


# ----------------------------------------------------------------------------------------------
# Warp specialization: two compute warpgroups and one memory warpgroup per program.


def warp_specialized_kernel(q_ref, k_ref, v_ref, kl_ref, ql_ref, o_ref, lse_ref, q_smem, o_smem,
                            k_smem, v_smem, lse_smem, q_bar, k_bar, v_bar, k_free, v_free, turn,
                            *, scale, causal, interpret):
  """q_smem [2, 64, d] and o_smem [2, 64, dv] (q_smem when dv = d), one tile per compute
  warpgroup; k_smem [S, bk, d], v_smem [S, bk, dv] shared; lse_smem [2, 64]. Barriers: q_bar 2,
  k_bar/v_bar S (TMA), k_free/v_free S of two arrivals (both compute warpgroups released the
  slot), turn one of two arrivals (the pingpong)."""
  wgs, bq = q_smem.shape[:2]
  stages, bk = k_smem.shape[:2]
  h, i, b = lax.axis_index("heads"), lax.axis_index("q_blocks"), lax.axis_index("batch")
  wg = lax.axis_index("wg")
  lengths = kl_ref[b], ql_ref[b]
  # Key tiles of each compute warpgroup; the memory warpgroup fetches the union, and a compute
  # warpgroup that needs fewer still passes through the rest (its barriers) to keep the
  # barrier phases of both in step.
  n_of = [_common.num_key_blocks(wgs * i + w, bq, bk, *lengths, causal) for w in range(wgs)]
  n_all = functools.reduce(jnp.maximum, n_of)

  @pl.when(wg < wgs)
  def _compute():
    plgpu.set_max_registers(COMPUTE_REGISTERS, action="increase")
    _compute_warpgroup(q_ref, o_ref, lse_ref, q_smem.at[wg], o_smem.at[wg], k_smem, v_smem,
                       lse_smem.at[wg], q_bar.at[wg], k_bar, v_bar, k_free, v_free, turn,
                       wg=wg, tile=wgs * i + wg, b=b, h=h, lengths=lengths, n_all=n_all,
                       scale=scale, causal=causal, interpret=interpret)

  @pl.when(wg == wgs)
  def _memory():
    plgpu.set_max_registers(MEMORY_REGISTERS, action="decrease")
    fetch = functools.partial(_fetch, k_ref, v_ref, k_smem, v_smem, k_bar, v_bar, b, h)
    _fill(fetch, stages, k_ref.shape[2] // bk, n_all)

    def refill(j, _):  # tile j + S into tile j's slot once both compute warpgroups freed it
      slot = lax.rem(j, jnp.int32(stages))
      rows = pl.ds((j + stages) * bk, bk)
      plgpu.barrier_wait(k_free.at[slot])
      plgpu.copy_gmem_to_smem(k_ref.at[b, h, rows], k_smem.at[slot], k_bar.at[slot])
      plgpu.barrier_wait(v_free.at[slot])
      plgpu.copy_gmem_to_smem(v_ref.at[b, h, rows], v_smem.at[slot], v_bar.at[slot])
    lax.fori_loop(0, n_all - stages, refill, None)


def _compute_warpgroup(q_ref, o_ref, lse_ref, q_smem, o_smem, k_smem, v_smem, lse_smem, q_bar,
                       k_bar, v_bar, k_free, v_free, turn, *, wg, tile, b, h, lengths, n_all,
                       scale, causal, interpret):
  """One compute warpgroup: its 64 query rows (query tile `tile`) against the shared tiles."""
  bq, (stages, bk) = q_smem.shape[0], k_smem.shape[:2]
  o = ops(interpret)
  q0 = tile * bq
  plgpu.copy_gmem_to_smem(q_ref.at[b, h, pl.ds(q0, bq)], q_smem, q_bar)
  plgpu.barrier_wait(q_bar)

  def take_turn():  # both compute warpgroups arrive; each waits for the other
    plgpu.barrier_arrive(turn)
    plgpu.barrier_wait(turn)

  def release(free, j):
    # Only for the tiles the memory warpgroup refills (j + S < n_all), which it waits for: a
    # barrier phase nobody waits for is harmless on a GPU, but the interpreter insists that a
    # thread waiting on a barrier sees every phase.
    slot = lax.rem(j, jnp.int32(stages))
    pl.when(j + stages < n_all)(lambda: plgpu.barrier_arrive(free.at[slot]))

  def body(j, carry, masked):
    slot = lax.rem(j, jnp.int32(stages))
    plgpu.barrier_wait(k_bar.at[slot])

    def softmax_done():  # hand the tensor cores over, then wait for V and for our turn
      plgpu.barrier_arrive(turn)
      plgpu.barrier_wait(v_bar.at[slot])
      plgpu.barrier_wait(turn)
    carry = key_tile(carry, q_smem, k_smem.at[slot], v_smem.at[slot], o=o,
                     scale2=scale * LOG2E, q0=q0, k0=j * bk, lengths=lengths, causal=causal,
                     masked=masked, s_issued=take_turn, s_done=lambda: release(k_free, j),
                     before_pv=softmax_done)
    release(v_free, j)
    return carry

  def pass_through(j, _):
    # The same barriers as `body` without the math: the TMA barriers' phases (each thread
    # tracks its own), the two releases the memory warpgroup counts and two turns.
    slot = lax.rem(j, jnp.int32(stages))
    plgpu.barrier_wait(k_bar.at[slot])
    release(k_free, j)
    plgpu.barrier_wait(v_bar.at[slot])
    release(v_free, j)
    take_turn()
    take_turn()

  n = _common.num_key_blocks(tile, bq, bk, *lengths, causal)
  n_whole = jnp.minimum(_common.whole_key_blocks(tile, bq, bk, *lengths, causal), n)
  pl.when(wg == 1)(take_turn)  # the second warpgroup starts half a step behind
  carry = lax.fori_loop(0, n_whole, functools.partial(body, masked=False),
                        init_carry(o, bq, v_smem.shape[-1]))
  carry = lax.fori_loop(n_whole, n, functools.partial(body, masked=True), carry)
  lax.fori_loop(n, n_all, pass_through, None)
  pl.when(wg == 0)(take_turn)  # and the first ends half a step after
  store_rows(carry, o_smem, lse_smem, o_ref, lse_ref, b, h, q0)
