"""The forward of the fused dot-product attention kernel for Hopper, in Mosaic GPU (TMA + WGMMA).

    out_i = Σ_j softmax_j(scale · q_i·k_j over valid j) v_j,   lse_i = log Σ_j exp(scale · q_i·k_j)

Same inputs, outputs and residuals as the Triton forward in `kernels/flash_attention.py` (chosen
with target="mosaic_gpu", `kernels/targets/mosaic_gpu.py`), so the custom_vjp's Triton backward consumes them unchanged:
padded head-major q [B, H, Tq_p, d_p], k [B, H, Tk_p, d_p], v [B, H, Tk_p, dv_p] ->
(out [B, H, Tq_p, dv_p] in the input dtype, lse [B, H, Tq_p] float32). Masks as in
`kernels/_common.py` (key lengths, query lengths, causal top-left aligned); a row with no visible
key gets out = 0 and lse = -inf.

One program per (head, 64-row query tile, batch row) is one warpgroup (WGMMA's M is 64 rows per
warpgroup). It copies its q tile into shared memory with TMA, then streams [block_k, d] key and
value tiles through `STAGES` shared-memory slots: the TMA copy of tile j + STAGES is issued as
soon as tile j's last WGMMA has consumed its slot, so the copies overlap the math
(FlashAttention-3, Shah et al. 2024, without its warp specialization). Per tile: S = Q Kᵀ by
WGMMA from shared memory into float32 registers, the online softmax of FlashAttention-2
(Algorithm 1, lines 8-10, the finite MASK_VALUE convention of `_common.online_softmax_update`),
P cast to the input dtype and O += P V by WGMMA with P from registers. Key tiles past the key
length (and past the causal diagonal) are never fetched; tiles that every row of the query tile
sees whole skip the mask. The output tile and its lse leave through shared memory by TMA.

Limits: WGMMA takes 16-bit operands here (bfloat16, float16); float32 inputs (tf32 WGMMA would
round q and k to 10 mantissa bits, far outside the float32 tolerance) and head dims above
MAX_HEAD_DIM run the Triton forward instead. Head dims are zero-padded to multiples of 64 (one
128-byte swizzled row of 16-bit values) and sequences to multiples of the tiles, inside this
module; the padding is sliced off.

Interpret mode (`interpret=True`, CPU) runs the same program in JAX's Mosaic GPU interpreter
(`InterpretGPUParams`: simulated shared memory, TMA copies and barriers), except that the two
matrix products become `lax.dot_general` on the shared-memory tiles: the 0.10 interpreter's WGMMA
takes neither a transposed operand nor one from registers. So interpret mode checks the copies,
barriers, pipelining, masks, softmax and stores; only a GPU checks the WGMMA instructions.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from kernels import _common

_F32 = jnp.float32
WARPGROUP_ROWS = 64  # WGMMA's M per warpgroup: the query tile of one program
FEATURE_MULTIPLE = 64  # one 128-byte swizzled shared-memory row of 16-bit values
MAX_HEAD_DIM = 256
SUPPORTED_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
STAGES = 2  # key/value shared-memory slots in flight
SMEM_LIMIT = 232448  # H100/H200: 227 KiB of shared memory per thread block


def supports(dtype, d: int, dv: int) -> bool:
  """Whether this forward takes these operands (otherwise the Triton forward runs)."""
  return jnp.dtype(dtype) in SUPPORTED_DTYPES and max(d, dv) <= MAX_HEAD_DIM


def _round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


def smem_bytes(d: int, dv: int, block_k: int, dtype, stages: int = STAGES) -> int:
  """Shared memory of the tiles (not counting the barriers): q [64, d], `stages` slots of
  k [block_k, d] and v [block_k, dv], the output tile [64, dv], and the lse row [64] float32."""
  d, dv = _round_up(d, FEATURE_MULTIPLE), _round_up(dv, FEATURE_MULTIPLE)
  tiles = WARPGROUP_ROWS * d + stages * block_k * (d + dv) + WARPGROUP_ROWS * dv
  return tiles * jnp.dtype(dtype).itemsize + WARPGROUP_ROWS * 4


# ----------------------------------------------------------------------------------------------
# Kernel body. Refs: q/k/v/out [B, H, T, d] and lse [B, H, T] in global memory, lengths [B] int32
# in global memory (read as scalars); the scratch tiles in shared memory; the TMA barriers.


def _matmuls(interpret: bool):
  """(s_tile, pv_tile): S = Q Kᵀ and P V, float32. WGMMA on a GPU; dot_general on the same
  shared-memory tiles in the interpreter, whose WGMMA lacks transposed and register operands."""
  if interpret:
    def s_tile(q_smem, k_smem):
      return _common.dot_nt(q_smem[...], k_smem[...])

    def pv_tile(p, v_smem):
      return _common.dot(p, v_smem[...])
    return s_tile, pv_tile

  def s_tile(q_smem, k_smem):
    def body(acc_ref):
      plgpu.wgmma(acc_ref, q_smem, plgpu.transpose_ref(k_smem, (1, 0)))
      return acc_ref[...]
    return pl.run_scoped(body, plgpu.ACC((q_smem.shape[0], k_smem.shape[0]), _F32))

  def pv_tile(p, v_smem):
    # A fresh accumulator, added to the rescaled one by the caller (the interpreter has no
    # run_state, so both paths keep the same shape of program).
    def body(acc_ref):
      plgpu.wgmma(acc_ref, p, v_smem)
      return acc_ref[...]
    return pl.run_scoped(body, plgpu.ACC((p.shape[0], v_smem.shape[-1]), _F32))
  return s_tile, pv_tile


def _layouts(interpret: bool):
  """(cast, iota): WGMMA register layouts on a GPU; plain arrays in the interpreter."""
  if interpret:
    return (lambda x, layout: x), (lambda shape, dim: lax.broadcasted_iota(jnp.int32, shape, dim))
  return plgpu.layout_cast, _wgmma_iota


def _wgmma_iota(shape, dim):
  return plgpu.broadcasted_iota(jnp.int32, shape, dim, layout=plgpu.Layout.WGMMA)


def _fwd_kernel(q_ref, k_ref, v_ref, kl_ref, ql_ref, o_ref, lse_ref, q_smem, k_smem, v_smem,
                o_smem, lse_smem, q_bar, k_bar, v_bar, *, scale, causal, block_k, interpret):
  bq, dv = q_smem.shape[0], v_smem.shape[-1]
  h, i, b = lax.axis_index("heads"), lax.axis_index("q_blocks"), lax.axis_index("batch")
  key_length, query_length = kl_ref[b], ql_ref[b]
  s_tile, pv_tile = _matmuls(interpret)
  cast, iota = _layouts(interpret)
  row_layout = plgpu.Layout.WGMMA.reduce(1)
  q0 = i * bq
  n = _common.num_key_blocks(i, bq, block_k, key_length, query_length, causal)

  def fetch(j, slot):  # TMA: key/value tile j into a slot, arriving on that slot's barriers
    rows = pl.ds(j * block_k, block_k)
    plgpu.copy_gmem_to_smem(k_ref.at[b, h, rows], k_smem.at[slot], k_bar.at[slot])
    plgpu.copy_gmem_to_smem(v_ref.at[b, h, rows], v_smem.at[slot], v_bar.at[slot])

  plgpu.copy_gmem_to_smem(q_ref.at[b, h, pl.ds(q0, bq)], q_smem, q_bar)
  for j in range(min(STAGES, k_ref.shape[2] // block_k)):  # fill the pipeline (tiles in range)
    pl.when(j < n)(functools.partial(fetch, j, j))
  plgpu.barrier_wait(q_bar)

  def body(j, carry, masked):
    m_prev, l_prev, acc = carry
    slot = lax.rem(j, jnp.int32(STAGES))
    plgpu.barrier_wait(k_bar.at[slot])
    s = s_tile(q_smem, k_smem.at[slot]) * scale  # [bq, bk] f32
    if masked:
      q_pos, k_pos = q0 + iota(s.shape, 0), j * block_k + iota(s.shape, 1)
      valid = (k_pos < key_length) & (q_pos < query_length)
      if causal:
        valid &= k_pos <= q_pos
      s = jnp.where(valid, s, _common.MASK_VALUE)
    # The online softmax, Algorithm 1 lines 8-10, as in _common.online_softmax_update.
    m_new = jnp.maximum(m_prev, s.max(axis=1))
    alpha = jnp.exp(m_prev - m_new)
    p = jnp.exp(s - lax.broadcast_in_dim(m_new, s.shape, [0]))
    if masked:
      p = jnp.where(valid, p, 0.0)
    l_new = alpha * l_prev + p.sum(axis=1)
    plgpu.barrier_wait(v_bar.at[slot])
    pv = pv_tile(p.astype(v_smem.dtype), v_smem.at[slot])  # [bq, dv] f32
    acc = acc * lax.broadcast_in_dim(alpha, acc.shape, [0]) + pv
    # Both WGMMAs reading this slot are done (their results are in registers): refill it.
    pl.when(j + STAGES < n)(functools.partial(fetch, j + STAGES, slot))
    return m_new, l_new, acc

  init = (cast(jnp.full((bq,), _common.MASK_VALUE, _F32), row_layout),
          cast(jnp.full((bq,), 0.0, _F32), row_layout),
          cast(jnp.full((bq, dv), 0.0, _F32), plgpu.Layout.WGMMA))
  # Key tiles every row of this query tile sees whole skip the mask (FlashAttention-3's split).
  n_whole = jnp.minimum(
      _common.whole_key_blocks(i, bq, block_k, key_length, query_length, causal), n)
  carry = lax.fori_loop(0, n_whole, functools.partial(body, masked=False), init)
  m, l, acc = lax.fori_loop(n_whole, n, functools.partial(body, masked=True), carry)
  # Algorithm 1, lines 12-13, as in _common.finish_softmax: empty rows -> (0, -inf).
  nonempty = l > 0
  l_safe = jnp.where(nonempty, l, 1.0)
  o_smem[...] = (acc / lax.broadcast_in_dim(l_safe, acc.shape, [0])).astype(o_smem.dtype)
  lse_smem[...] = jnp.where(nonempty, m + jnp.log(l_safe), -jnp.inf)
  plgpu.commit_smem()
  plgpu.copy_smem_to_gmem(o_smem, o_ref.at[b, h, pl.ds(q0, bq)])
  plgpu.copy_smem_to_gmem(lse_smem, lse_ref.at[b, h, pl.ds(q0, bq)])
  plgpu.wait_smem_to_gmem(0)


# ----------------------------------------------------------------------------------------------
# The launch.


def _interpret_params():
  # The Mosaic GPU interpreter is not exported under jax.experimental in jax 0.10.
  from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams
  return InterpretGPUParams()


def mosaic_forward(q, k, v, kl, ql, *, scale: float, causal: bool, block_k: int,
                   interpret: bool = False):
  """The Mosaic GPU kernel on head-major operands of any length (padded here, sliced back).

  q: [B, H, Tq, d], k: [B, H, Tk, d], v: [B, H, Tk, dv], bfloat16 or float16, one dtype;
  kl, ql: [B] int32 in [0, Tk], [0, Tq]. block_k: key tile, a multiple of 64.
  Returns (out [B, H, Tq, dv] in the input dtype, lse [B, H, Tq] float32).
  """
  B, H, Tq, d = q.shape
  Tk, dv = k.shape[2], v.shape[-1]
  if not supports(q.dtype, d, dv) or block_k % FEATURE_MULTIPLE:
    raise ValueError(f"the Mosaic GPU forward takes bfloat16/float16, head dims <= {MAX_HEAD_DIM} "
                     f"and block_k a multiple of 64; got {q.dtype}, d={d}, dv={dv}, {block_k=}")
  Tq_p, Tk_p = _round_up(Tq, WARPGROUP_ROWS), _round_up(Tk, block_k)
  d_p, dv_p = _round_up(d, FEATURE_MULTIPLE), _round_up(dv, FEATURE_MULTIPLE)
  pad = lambda x, T, width: _common.pad_axis(_common.pad_axis(x, 2, T), 3, width)
  q, k, v = pad(q, Tq_p, d_p), pad(k, Tk_p, d_p), pad(v, Tk_p, dv_p)
  swizzled = lambda: (plgpu.TilingTransform((8, FEATURE_MULTIPLE)), plgpu.SwizzleTransform(128))
  scratch = [plgpu.SMEM((WARPGROUP_ROWS, d_p), q.dtype, transforms=swizzled()),
             plgpu.SMEM((STAGES, block_k, d_p), q.dtype, transforms=swizzled()),
             plgpu.SMEM((STAGES, block_k, dv_p), q.dtype, transforms=swizzled()),
             plgpu.SMEM((WARPGROUP_ROWS, dv_p), q.dtype, transforms=swizzled()),
             plgpu.SMEM((WARPGROUP_ROWS,), _F32),
             plgpu.Barrier(), plgpu.Barrier(num_barriers=STAGES),
             plgpu.Barrier(num_barriers=STAGES)]

  def flash_attention_fwd_mgpu(*refs):  # the launch takes its name from the body
    _fwd_kernel(*refs, scale=scale, causal=causal, block_k=block_k, interpret=interpret)

  out, lse = plgpu.kernel(
      flash_attention_fwd_mgpu, out_type=[jax.ShapeDtypeStruct((B, H, Tq_p, dv_p), q.dtype),
                        jax.ShapeDtypeStruct((B, H, Tq_p), _F32)],
      scratch_types=scratch, grid=(H, Tq_p // WARPGROUP_ROWS, B),
      grid_names=("heads", "q_blocks", "batch"), compiler_params=plgpu.CompilerParams(),
      interpret=_interpret_params() if interpret else False,
  )(q, k, v, kl, ql)
  return out[:, :, :Tq, :dv], lse[:, :, :Tq]


def forward(q, k, v, theta, kl, ql, cfg, *, fallback):
  """The "mosaic_gpu" targets' forward of the dot-product kernel (`kernels/targets/mosaic_gpu.py`):
  the Mosaic GPU forward where it applies, `fallback` (the kernel's own forward on the target's
  Triton launch, same arguments) for float32 or wide heads. The target is compiled for CUDA only,
  or interpreted (cfg.interpret: the Mosaic GPU interpreter).

  Operands as `_skeleton.FusedKernel.forward`'s (padded, head-major). Returns (out [B, H, Tq_p,
  dv_p], lse [B, H, Tq_p] float32). cfg.poison does not apply: every tile is written whole.
  """
  if not supports(q.dtype, q.shape[-1], v.shape[-1]):
    return fallback(q, k, v, theta, kl, ql, cfg)
  block_k = max(FEATURE_MULTIPLE, cfg.blocks.block_k)
  while block_k > FEATURE_MULTIPLE and (
      smem_bytes(q.shape[-1], v.shape[-1], block_k, q.dtype) > SMEM_LIMIT):
    block_k //= 2  # e.g. d = 256 with block_k = 128 would not fit
  return mosaic_forward(q, k, v, kl, ql, scale=dict(cfg.score_kw)["scale"], causal=cfg.causal,
                        block_k=block_k, interpret=bool(cfg.interpret))
