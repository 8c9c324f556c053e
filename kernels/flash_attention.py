"""Fused scaled dot-product attention (flash attention) in Pallas, with its CPU path and reference.

    out_i = Σ_j softmax_j(scale · q_i·k_j over valid j) v_j

computed in one pass over key blocks with the online softmax (FlashAttention-2, Dao 2023,
Algorithm 1), never forming the [Tq, Tk] matrix; the backward pass (Algorithm 2) recomputes each
probability tile from the saved log-sum-exp in two Pallas kernels, one for dq (grid over query
blocks) and one for dk/dv (grid over key blocks), so neither needs atomics.

Layout `[B, T, H, d]` as in `jax.nn.dot_product_attention`. Masks follow `attn/masks.py`: key j is
visible to query i when j < key_lengths[b], i < query_lengths[b] and, if causal, j <= i (top-left
aligned, also when Tq != Tk). A query row with no visible key (key length 0, a padded query row,
or a causal row with no key) returns an all-zero output row and log-sum-exp -inf, and passes zero,
finite gradients — never NaN, never the uniform average. Scores, softmax and accumulation are
float32 whatever the input dtype; the output has the input dtype.

GPU lowering: Triton (`jax.experimental.pallas.triton`), chosen knowingly over Mosaic GPU.
- The kernel body below is plain Pallas (BlockSpecs, `fori_loop`, `dot_general`), so the same code
  runs in CPU interpret mode, which is what our CI tests; a Mosaic GPU kernel is a different
  program (warpgroups, TMA copies, barriers, explicit pipelining) that CPU interpret mode would
  not cover the same way, and no GPU was available to validate one when this was written.
- Triton runs on every NVIDIA generation we use (Ampere to Hopper); Mosaic GPU targets Hopper+.
- The cost: JAX deprecated the Pallas Triton lowering in 0.11 (still present in 0.11.2, our GPU
  pin), and Triton-from-Pallas leaves Hopper's wgmma/TMA speed on the table. The road to the
  Hopper target is a Mosaic GPU forward behind the same `implementation="pallas"` name, validated
  on a GPU against this kernel; `experiments/bench_kernel.py` already times JAX's own Mosaic GPU
  attention next to ours to size that gap.
On TPU the same body would lower through Mosaic TPU, but "auto" keeps TPU on the blocked path
until that has been run on a TPU.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kernels import _common
from kernels._common import LEN_SPEC, BlockSizes, full_spec, row_spec, to_heads

_F32 = jnp.float32
# Defaults per implementation. GPU: FlashAttention-2's Triton tiles for d <= 128 on A100/H100.
GPU_BLOCKS = BlockSizes(block_q=128, block_k=64, block_q_bwd=64, block_k_bwd=64, num_stages=2)
# Interpret mode: large tiles mean few grid steps, which is what costs time there.
INTERPRET_BLOCKS = BlockSizes(block_q=64, block_k=64)
# Blocked CPU path: query chunk x key step (see docs/benchmarks.md for the time/memory trade).
BLOCKED_BLOCKS = BlockSizes(block_q=512, block_k=512)


# ----------------------------------------------------------------------------------------------
# Kernel bodies. Refs: q/k/v blocks are 2-D [rows, d] (batch and head squeezed out); lengths are
# [1] blocks of the [B] length arrays. Output refs come last (aliased poison inputs, if any,
# sit between the inputs and the outputs and are never read).


def _fwd_kernel(q_ref, k_ref, v_ref, kl_ref, ql_ref, *refs, scale, causal, block_k):
  o_ref, lse_ref = refs[-2:]
  block_q = q_ref.shape[0]
  i = pl.program_id(0)
  key_length, query_length = kl_ref[0], ql_ref[0]
  q = q_ref[...]  # [bq, d], stays on chip for the whole loop
  q_pos = i * block_q + jnp.arange(block_q)

  def body(j, carry):
    m_prev, l_prev, acc_prev = carry
    k = k_ref[pl.ds(j * block_k, block_k), :]  # [bk, d]
    v = v_ref[pl.ds(j * block_k, block_k), :]  # [bk, dv]
    s = _common.dot_nt(q, k) * scale  # [bq, bk] f32
    valid = _common.valid_mask(q_pos, j * block_k + jnp.arange(block_k), key_length, query_length,
                               causal)
    s = jnp.where(valid, s, _common.MASK_VALUE)
    # Algorithm 1, lines 9-10: new running max, rescale the old sum and accumulator by alpha.
    m_new = jnp.maximum(m_prev, jnp.max(s, axis=1))
    alpha = jnp.exp(m_prev - m_new)
    p = jnp.where(valid, jnp.exp(s - m_new[:, None]), 0.0)
    l_new = alpha * l_prev + jnp.sum(p, axis=1)
    acc_new = alpha[:, None] * acc_prev + _common.dot(p.astype(v.dtype), v)
    return m_new, l_new, acc_new

  init = (jnp.full((block_q,), _common.MASK_VALUE, _F32), jnp.zeros((block_q,), _F32),
          jnp.zeros((block_q, v_ref.shape[-1]), _F32))
  n = _common.num_key_blocks(i, block_q, block_k, key_length, query_length, causal)
  m, l, acc = lax.fori_loop(0, n, body, init)
  out, lse = _common.finish_softmax(m, l, acc)  # Algorithm 1, lines 12-13
  o_ref[...] = out.astype(o_ref.dtype)
  lse_ref[...] = lse


def _dq_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, kl_ref, ql_ref, *refs, scale,
               causal, block_k):
  dq_ref = refs[-1]
  block_q = q_ref.shape[0]
  i = pl.program_id(0)
  key_length, query_length = kl_ref[0], ql_ref[0]
  q, do = q_ref[...], do_ref[...]  # [bq, d], [bq, dv]
  lse, delta = lse_ref[...], delta_ref[...]  # [bq]
  q_pos = i * block_q + jnp.arange(block_q)

  def body(j, dq):
    k = k_ref[pl.ds(j * block_k, block_k), :]
    v = v_ref[pl.ds(j * block_k, block_k), :]
    valid = _common.valid_mask(q_pos, j * block_k + jnp.arange(block_k), key_length, query_length,
                               causal)
    # Algorithm 2: P recomputed from lse; dS = P o (dP - delta); dQ += dS K (times scale, below).
    p = jnp.where(valid, jnp.exp(_common.dot_nt(q, k) * scale - lse[:, None]), 0.0)
    ds = p * (_common.dot_nt(do, v) - delta[:, None])
    return dq + _common.dot(ds.astype(k.dtype), k)

  n = _common.num_key_blocks(i, block_q, block_k, key_length, query_length, causal)
  dq = lax.fori_loop(0, n, body, jnp.zeros(q.shape, _F32))
  dq_ref[...] = (dq * scale).astype(dq_ref.dtype)


def _dkdv_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, kl_ref, ql_ref, *refs, scale,
                 causal, block_q):
  dk_ref, dv_ref = refs[-2:]
  block_k = k_ref.shape[0]
  j = pl.program_id(0)
  key_length, query_length = kl_ref[0], ql_ref[0]
  k, v = k_ref[...], v_ref[...]  # [bk, d], [bk, dv]
  k_pos = j * block_k + jnp.arange(block_k)
  # Query blocks that can see this key block: causal rows start at the block's first key; none
  # when the whole key block lies past the key length.
  lo = lax.div(j * block_k, block_q) if causal else 0
  hi = jnp.where(j * block_k < key_length, lax.div(query_length + block_q - 1, block_q), lo)

  def body(i, carry):
    dk, dv = carry
    rows = pl.ds(i * block_q, block_q)
    q, do = q_ref[rows, :], do_ref[rows, :]
    lse, delta = lse_ref[rows], delta_ref[rows]
    valid = _common.valid_mask(i * block_q + jnp.arange(block_q), k_pos, key_length, query_length,
                               causal)
    p = jnp.where(valid, jnp.exp(_common.dot_nt(q, k) * scale - lse[:, None]), 0.0)  # [bq, bk]
    dv = dv + _common.dot_tn(p.astype(do.dtype), do)  # dV += P^T dO
    ds = p * (_common.dot_nt(do, v) - delta[:, None])
    dk = dk + _common.dot_tn(ds.astype(q.dtype), q)  # dK += dS^T Q (times scale, below)
    return dk, dv

  dk, dv = lax.fori_loop(lo, hi, body, (jnp.zeros(k.shape, _F32), jnp.zeros(v.shape, _F32)))
  dk_ref[...] = (dk * scale).astype(dk_ref.dtype)
  dv_ref[...] = dv.astype(dv_ref.dtype)


# ----------------------------------------------------------------------------------------------
# pallas_call wrappers (inputs already padded: T to block multiples, d to powers of two >= 16).


@dataclasses.dataclass(frozen=True)
class _Config:
  scale: float
  causal: bool
  blocks: BlockSizes
  interpret: bool
  poison: bool = False  # tests: pre-fill outputs with NaN so unwritten elements show


def _forward(q, k, v, kl, ql, cfg: _Config):
  B, Tq, H, d = q.shape
  Tk, dv = k.shape[1], v.shape[-1]
  bq, bk = cfg.blocks.block_q, cfg.blocks.block_k
  flops = 4 * B * H * Tq * Tk * d // (2 if cfg.causal else 1)
  nbytes = sum(x.size * x.dtype.itemsize for x in (q, k, v)) * 2
  return _common.call_kernel(
      functools.partial(_fwd_kernel, scale=cfg.scale, causal=cfg.causal, block_k=bk),
      (q, k, v, kl, ql),
      [row_spec(bq, d), full_spec(Tk, d), full_spec(Tk, dv), LEN_SPEC, LEN_SPEC],
      [jax.ShapeDtypeStruct((B, Tq, H, dv), v.dtype), jax.ShapeDtypeStruct((B, H, Tq), _F32)],
      [row_spec(bq, dv), pl.BlockSpec((None, None, bq), lambda r, b, h: (b, h, r))],
      grid=(Tq // bq, B, H), cfg=cfg, name="flash_attention_fwd", head_dim=d,
      cost_estimate=pl.CostEstimate(flops=flops, transcendentals=B * H * Tq * Tk,
                                    bytes_accessed=nbytes))


def _backward(q, k, v, do, lse, delta, kl, ql, cfg: _Config):
  B, Tq, H, d = q.shape
  Tk, dv = k.shape[1], v.shape[-1]
  bq, bk = cfg.blocks.bwd_q, cfg.blocks.bwd_k
  stats_full = pl.BlockSpec((None, None, Tq), lambda r, b, h: (b, h, 0))
  stats_rows = pl.BlockSpec((None, None, bq), lambda r, b, h: (b, h, r))
  inputs = (q, k, v, do, lse, delta, kl, ql)
  (dq,) = _common.call_kernel(
      functools.partial(_dq_kernel, scale=cfg.scale, causal=cfg.causal, block_k=bk), inputs,
      [row_spec(bq, d), full_spec(Tk, d), full_spec(Tk, dv), row_spec(bq, dv), stats_rows,
       stats_rows, LEN_SPEC, LEN_SPEC],
      [jax.ShapeDtypeStruct(q.shape, q.dtype)], [row_spec(bq, d)],
      grid=(Tq // bq, B, H), cfg=cfg, name="flash_attention_dq", head_dim=d)
  dk, dv_ = _common.call_kernel(
      functools.partial(_dkdv_kernel, scale=cfg.scale, causal=cfg.causal, block_q=bq), inputs,
      [full_spec(Tq, d), row_spec(bk, d), row_spec(bk, dv), full_spec(Tq, dv), stats_full,
       stats_full, LEN_SPEC, LEN_SPEC],
      [jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
      [row_spec(bk, d), row_spec(bk, dv)],
      grid=(Tk // bk, B, H), cfg=cfg, name="flash_attention_dkdv", head_dim=d)
  return dq, dk, dv_


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _flash_core(q, k, v, kl, ql, cfg):
  return tuple(_forward(q, k, v, kl, ql, cfg))


def _flash_core_fwd(q, k, v, kl, ql, cfg):
  out, lse = _flash_core(q, k, v, kl, ql, cfg)
  return (out, lse), (q, k, v, kl, ql, out, lse)


def _flash_core_bwd(cfg, res, cts):
  q, k, v, kl, ql, out, lse = res
  g_out, g_lse = cts
  # delta_i = dO_i . O_i - dL/dlse_i: a cotangent on lse adds P_ij to dS_ij, i.e. shifts delta.
  delta = jnp.einsum("bqhd,bqhd->bhq", g_out.astype(_F32), out.astype(_F32)) - g_lse
  dq, dk, dv = _backward(q, k, v, g_out.astype(v.dtype), lse, delta, kl, ql, cfg)
  return dq, dk, dv, None, None


_flash_core.defvjp(_flash_core_fwd, _flash_core_bwd)


def _pallas_padded(q, k, v, kl, ql, *, causal, scale, blocks, interpret, poison=False):
  """Pads to kernel-friendly shapes and runs the kernels; returns padded (out, lse [B, H, Tq_p])."""
  Tq, Tk, d, dv = q.shape[1], k.shape[1], q.shape[-1], v.shape[-1]
  if d > _common.MAX_HEAD_DIM or dv > _common.MAX_HEAD_DIM:
    raise ValueError(f"the Pallas kernel supports head dims up to {_common.MAX_HEAD_DIM}, got "
                     f"d={d}, dv={dv}; use implementation='blocked'")
  blocks = blocks.clamp(Tq, Tk)
  Tq_p = _common.round_up(Tq, max(blocks.block_q, blocks.bwd_q))
  Tk_p = _common.round_up(Tk, max(blocks.block_k, blocks.bwd_k))
  d_p = max(_common.MIN_BLOCK, _common.next_pow2(d))
  dv_p = max(_common.MIN_BLOCK, _common.next_pow2(dv))
  pad = lambda x, T, w: _common.pad_axis(_common.pad_axis(x, 1, T), 3, w)
  cfg = _Config(scale=scale, causal=causal, blocks=blocks, interpret=interpret, poison=poison)
  return _flash_core(pad(q, Tq_p, d_p), pad(k, Tk_p, d_p), pad(v, Tk_p, dv_p), kl, ql, cfg)


# ----------------------------------------------------------------------------------------------
# Implementations: each (q, k, v, kl, ql, *, causal, scale, blocks, interpret) -> (out, lse) with
# out [B, Tq, H, dv] in the input dtype and lse [B, Tq, H] float32.


def _impl_pallas(q, k, v, kl, ql, *, causal, scale, blocks, interpret):
  Tq, dv = q.shape[1], v.shape[-1]
  out, lse = _pallas_padded(q, k, v, kl, ql, causal=causal, scale=scale, blocks=blocks,
                            interpret=interpret)
  return out[:, :Tq, :, :dv], jnp.swapaxes(lse[:, :, :Tq], 1, 2)


def _dot_score(scale, theta, q_blk, k_blk):
  """scale · q_blk k_blkᵀ: [tq, d] x [tk, d] -> [tq, tk] float32."""
  del theta
  return _common.dot_nt(q_blk, k_blk) * scale


def _impl_blocked(q, k, v, kl, ql, *, causal, scale, blocks, interpret):
  del interpret
  out, lse = _common.blocked_attention(
      functools.partial(_dot_score, scale), to_heads(q), to_heads(k), to_heads(v), None, kl, ql,
      causal=causal, block_q=blocks.block_q, block_k=blocks.block_k)
  return _common.from_heads(out, lse, v.dtype)


def _impl_xla(q, k, v, kl, ql, *, causal, scale, blocks, interpret):
  del blocks, interpret
  out, lse = _common.naive_attention(
      functools.partial(_dot_score, scale), to_heads(q), to_heads(k), to_heads(v), None, kl, ql,
      causal=causal)
  return _common.from_heads(out, lse, v.dtype)


_IMPLEMENTATIONS = {"pallas": _impl_pallas, "blocked": _impl_blocked, "xla": _impl_xla}


def _check_inputs(q, k, v):
  for name, x in (("q", q), ("k", k), ("v", v)):
    if x.ndim != 4:
      raise ValueError(f"{name} must be [B, T, H, d], got shape {x.shape}")
    _common.check_dtype(name, x)
  if not q.dtype == k.dtype == v.dtype:
    raise ValueError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
  if not (q.shape[0] == k.shape[0] == v.shape[0] and q.shape[2] == k.shape[2] == v.shape[2]):
    raise ValueError(f"q, k and v disagree on batch or heads [B, T, H, d]: q {q.shape}, "
                     f"k {k.shape}, v {v.shape}")
  if k.shape[1] != v.shape[1]:
    raise ValueError(f"k and v disagree on Tk: k {k.shape}, v {v.shape}")
  if q.shape[-1] != k.shape[-1]:
    raise ValueError(f"q and k must have the same head dim, got {q.shape[-1]} and {k.shape[-1]}")
  if q.shape[-1] == 0 or v.shape[-1] == 0 or q.shape[1] == 0 or k.shape[1] == 0:
    raise ValueError(f"empty head dim or sequence: q {q.shape}, k {k.shape}, v {v.shape}")


@functools.partial(jax.jit, static_argnames=("causal", "scale", "implementation", "block_q",
                                             "block_k", "block_sizes", "interpret"))
def attention_with_lse(q, k, v, *, key_lengths=None, query_lengths=None, causal: bool = False,
                       scale: float | None = None, implementation: str = "auto",
                       block_q: int | None = None, block_k: int | None = None,
                       block_sizes: BlockSizes | None = None, interpret: bool | None = None):
  """Scaled dot-product attention and its log-sum-exp, without forming [Tq, Tk].

  q: [B, Tq, H, d], k: [B, Tk, H, d], v: [B, Tk, H, dv]; float32, bfloat16 or float16, one dtype.
  key_lengths, query_lengths: [B] int or None (all valid); clipped to [0, T].
  causal: query i sees keys j <= i (top-left aligned). scale: Python float, default 1/sqrt(d).
  implementation: "pallas" (Triton on GPU; interpret mode on CPU), "blocked" (pure JAX, exact,
    O(T·block) memory), "xla" (dense reference), "auto" (pallas on GPU, blocked elsewhere).
  block_q, block_k: tile sizes (powers of two >= 16), or block_sizes=BlockSizes(...) for the
    backward tiles and Triton launch parameters too. interpret: force Pallas interpret mode.
  Returns (out [B, Tq, H, dv] in the input dtype, lse [B, Tq, H] float32). A query row with no
  visible key gets out = 0 and lse = -inf, and zero gradients. Differentiable (custom_vjp).
  """
  _check_inputs(q, k, v)
  B, Tq, _, d = q.shape
  Tk = k.shape[1]
  kl = _common.check_lengths("key_lengths", key_lengths, B, Tk)
  ql = _common.check_lengths("query_lengths", query_lengths, B, Tq)
  scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
  impl = _common.resolve_implementation(implementation)
  interpret = _common.resolve_interpret(interpret)
  blocks = _common.resolve_blocks(block_q, block_k, block_sizes, _common.default_blocks(
      impl, interpret, blocked=BLOCKED_BLOCKS, interpreted=INTERPRET_BLOCKS, gpu=GPU_BLOCKS))
  return _IMPLEMENTATIONS[impl](q, k, v, kl, ql, causal=bool(causal), scale=scale, blocks=blocks,
                                interpret=interpret)


def attention(q, k, v, *, key_lengths=None, query_lengths=None, causal: bool = False,
              scale: float | None = None, implementation: str = "auto", block_q: int | None = None,
              block_k: int | None = None, block_sizes: BlockSizes | None = None,
              interpret: bool | None = None):
  """Scaled dot-product attention: out [B, Tq, H, dv]. See `attention_with_lse` for arguments.

  A query row with no visible key returns zeros (value and gradient), never NaN.
  """
  return attention_with_lse(q, k, v, key_lengths=key_lengths, query_lengths=query_lengths,
                            causal=causal, scale=scale, implementation=implementation,
                            block_q=block_q, block_k=block_k, block_sizes=block_sizes,
                            interpret=interpret)[0]


def attention_reference(q, k, v, *, key_lengths=None, query_lengths=None, causal: bool = False,
                        scale: float | None = None):
  """The dense reference, same semantics as `attention` (materializes [B, H, Tq, Tk] scores)."""
  return attention(q, k, v, key_lengths=key_lengths, query_lengths=query_lengths, causal=causal,
                   scale=scale, implementation="xla")
