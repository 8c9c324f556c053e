"""Fused additive (Bahdanau) attention in Pallas, with its CPU path and naive reference.

    e_ij = vᵀ tanh(q_proj_i + k_proj_j),   q_proj = W q + b,  k_proj = U k   (Bahdanau et al. 2015,
    eq. 6; Luong et al. 2015 "concat")
    out_i = Σ_j softmax_j(e_ij over valid j) values_j

Every public implementation (Keras, TF Addons, PyTorch tutorials) forms tanh(q_proj_i + k_proj_j)
for all pairs: a [B, Tq, Tk, H, d_attn] tensor. Here one kernel tiles queries and keys, forms the
[block_q, block_k, block_d] tanh tile on chip a d_attn slice at a time, reduces it against v into
the [block_q, block_k] score tile, and feeds that to the online softmax (FlashAttention-2,
Algorithm 1) that accumulates the weighted values: O(T) memory, nothing of size Tq·Tk·d_attn is
ever written. The backward pass recomputes each tile from the saved log-sum-exp:
    dS = P ∘ (dP − δ),  g_ija = dS_ij (1 − tanh²) ,
    dq_proj_i = v ∘ Σ_j g_ij,  dk_proj_j = v ∘ Σ_i g_ij,  dv = Σ_ij dS_ij tanh_ij,  dvalues = Pᵀ dO
in a dq kernel (grid over query blocks) and a dk/dvalues/dv kernel (grid over key blocks); the
dv partial sums come out per key block and are added in XLA (no atomics).

Layout, masks, dtypes and fully-masked rows as in `kernels.flash_attention`: `[B, T, H, ·]`,
key j visible to query i when j < key_lengths[b], i < query_lengths[b] and (causal) j <= i; a row
with no visible key returns zeros, lse -inf, zero gradients. tanh, scores, softmax and
accumulation are float32; the output has the dtype of `values`. GPU lowering: Triton, for the
reasons given in `kernels/flash_attention.py`.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kernels import _common
from kernels._common import LEN_SPEC, BlockSizes, full_spec, row_spec, to_heads

_F32 = jnp.float32
# GPU: the tanh tile [block_q, block_k, block_d] lives in registers: 32 x 32 x 8 floats is 64 per
# thread at 4 warps. Tune with experiments/bench_kernel.py.
GPU_BLOCKS = BlockSizes(block_q=32, block_k=32, block_d=8, num_warps=4, num_stages=2)
INTERPRET_BLOCKS = BlockSizes(block_q=64, block_k=64)  # block_d: all of d_attn at once
# Blocked CPU path: the [block_q, block_k, d_attn] tanh tile is formed by XLA (~8 MiB at 256).
BLOCKED_BLOCKS = BlockSizes(block_q=128, block_k=64)


def _tanh_tile(q_chunk, k_chunk):
  """tanh(q_i + k_j) for a d_attn slice: [bq, bd] x [bk, bd] -> [bq, bk, bd] float32."""
  return jnp.tanh(q_chunk.astype(_F32)[:, None, :] + k_chunk.astype(_F32)[None, :, :])


def _chunks(n_chunks, block_d):
  return [pl.ds(c * block_d, block_d) for c in range(n_chunks)]


def _score_tile(q_chunks, k_ref, w_chunks, key_rows, block_d):
  """e = Σ_a w_a tanh(q_ia + k_ja) for one [bq, bk] tile, summed over d_attn slices."""
  s = None
  for c, (qc, wc) in enumerate(zip(q_chunks, w_chunks)):
    kc = k_ref[key_rows, pl.ds(c * block_d, block_d)]
    part = jnp.sum(_tanh_tile(qc, kc) * wc[None, None, :], axis=2)
    s = part if s is None else s + part
  return s


# ----------------------------------------------------------------------------------------------
# Kernel bodies (refs as in flash_attention: 2-D per (batch, head); w_ref is v's [d_attn] row).


def _fwd_kernel(q_ref, k_ref, w_ref, val_ref, kl_ref, ql_ref, *refs, causal, block_k, block_d):
  o_ref, lse_ref = refs[-2:]
  block_q, d_attn = q_ref.shape
  i = pl.program_id(0)
  key_length, query_length = kl_ref[0], ql_ref[0]
  slices = _chunks(d_attn // block_d, block_d)
  q_chunks = [q_ref[:, sl].astype(_F32) for sl in slices]  # stay on chip for the whole loop
  w_chunks = [w_ref[sl].astype(_F32) for sl in slices]
  q_pos = i * block_q + jnp.arange(block_q)

  def body(j, carry):
    m_prev, l_prev, acc_prev = carry
    rows = pl.ds(j * block_k, block_k)
    s = _score_tile(q_chunks, k_ref, w_chunks, rows, block_d)  # [bq, bk]
    valid = _common.valid_mask(q_pos, j * block_k + jnp.arange(block_k), key_length, query_length,
                               causal)
    s = jnp.where(valid, s, _common.MASK_VALUE)
    m_new = jnp.maximum(m_prev, jnp.max(s, axis=1))
    alpha = jnp.exp(m_prev - m_new)
    p = jnp.where(valid, jnp.exp(s - m_new[:, None]), 0.0)
    l_new = alpha * l_prev + jnp.sum(p, axis=1)
    val = val_ref[rows, :]
    acc_new = alpha[:, None] * acc_prev + _common.dot(p.astype(val.dtype), val)
    return m_new, l_new, acc_new

  init = (jnp.full((block_q,), _common.MASK_VALUE, _F32), jnp.zeros((block_q,), _F32),
          jnp.zeros((block_q, val_ref.shape[-1]), _F32))
  n = _common.num_key_blocks(i, block_q, block_k, key_length, query_length, causal)
  m, l, acc = lax.fori_loop(0, n, body, init)
  out, lse = _common.finish_softmax(m, l, acc)
  o_ref[...] = out.astype(o_ref.dtype)
  lse_ref[...] = lse


def _dq_kernel(q_ref, k_ref, w_ref, val_ref, do_ref, lse_ref, delta_ref, kl_ref, ql_ref, *refs,
               causal, block_k, block_d):
  dq_ref = refs[-1]
  block_q, d_attn = q_ref.shape
  i = pl.program_id(0)
  key_length, query_length = kl_ref[0], ql_ref[0]
  slices = _chunks(d_attn // block_d, block_d)
  q_chunks = [q_ref[:, sl].astype(_F32) for sl in slices]
  w_chunks = [w_ref[sl].astype(_F32) for sl in slices]
  do, lse, delta = do_ref[...], lse_ref[...], delta_ref[...]
  q_pos = i * block_q + jnp.arange(block_q)

  def body(j, dq_chunks):
    rows = pl.ds(j * block_k, block_k)
    valid = _common.valid_mask(q_pos, j * block_k + jnp.arange(block_k), key_length, query_length,
                               causal)
    s = _score_tile(q_chunks, k_ref, w_chunks, rows, block_d)
    p = jnp.where(valid, jnp.exp(s - lse[:, None]), 0.0)
    ds = p * (_common.dot_nt(do, val_ref[rows, :]) - delta[:, None])  # [bq, bk]
    new = []
    for sl, qc, acc in zip(slices, q_chunks, dq_chunks):
      h = _tanh_tile(qc, k_ref[rows, sl])
      new.append(acc + jnp.sum(ds[:, :, None] * (1.0 - h * h), axis=1))  # Σ_j dS (1 - tanh²)
    return tuple(new)

  n = _common.num_key_blocks(i, block_q, block_k, key_length, query_length, causal)
  init = tuple(jnp.zeros((block_q, block_d), _F32) for _ in slices)
  dq_chunks = lax.fori_loop(0, n, body, init)
  for sl, wc, acc in zip(slices, w_chunks, dq_chunks):
    dq_ref[:, sl] = (acc * wc[None, :]).astype(dq_ref.dtype)


def _dkv_kernel(q_ref, k_ref, w_ref, val_ref, do_ref, lse_ref, delta_ref, kl_ref, ql_ref, *refs,
                causal, block_q, block_d):
  dk_ref, dval_ref, dw_ref = refs[-3:]
  block_k, d_attn = k_ref.shape
  j = pl.program_id(0)
  key_length, query_length = kl_ref[0], ql_ref[0]
  slices = _chunks(d_attn // block_d, block_d)
  k_chunks = [k_ref[:, sl].astype(_F32) for sl in slices]
  w_chunks = [w_ref[sl].astype(_F32) for sl in slices]
  val = val_ref[...]
  k_pos = j * block_k + jnp.arange(block_k)
  lo = lax.div(j * block_k, block_q) if causal else 0
  hi = jnp.where(j * block_k < key_length, lax.div(query_length + block_q - 1, block_q), lo)

  def body(i, carry):
    dk_chunks, dw_chunks, dval = carry
    rows = pl.ds(i * block_q, block_q)
    q_chunks = [q_ref[rows, sl].astype(_F32) for sl in slices]
    s = None
    for qc, kc, wc in zip(q_chunks, k_chunks, w_chunks):
      part = jnp.sum(_tanh_tile(qc, kc) * wc[None, None, :], axis=2)
      s = part if s is None else s + part
    valid = _common.valid_mask(i * block_q + jnp.arange(block_q), k_pos, key_length, query_length,
                               causal)
    do = do_ref[rows, :]
    p = jnp.where(valid, jnp.exp(s - lse_ref[rows][:, None]), 0.0)  # [bq, bk]
    dval = dval + _common.dot_tn(p.astype(do.dtype), do)
    ds = p * (_common.dot_nt(do, val) - delta_ref[rows][:, None])
    new_dk, new_dw = [], []
    for qc, kc, dk_c, dw_c in zip(q_chunks, k_chunks, dk_chunks, dw_chunks):
      h = _tanh_tile(qc, kc)
      new_dk.append(dk_c + jnp.sum(ds[:, :, None] * (1.0 - h * h), axis=0))  # Σ_i dS (1 - tanh²)
      new_dw.append(dw_c + jnp.sum(jnp.sum(ds[:, :, None] * h, axis=0), axis=0))  # Σ_ij dS tanh
    return tuple(new_dk), tuple(new_dw), dval

  init = (tuple(jnp.zeros((block_k, block_d), _F32) for _ in slices),
          tuple(jnp.zeros((block_d,), _F32) for _ in slices), jnp.zeros(val.shape, _F32))
  dk_chunks, dw_chunks, dval = lax.fori_loop(lo, hi, body, init)
  for sl, wc, dk_c, dw_c in zip(slices, w_chunks, dk_chunks, dw_chunks):
    dk_ref[:, sl] = (dk_c * wc[None, :]).astype(dk_ref.dtype)
    dw_ref[sl] = dw_c
  dval_ref[...] = dval.astype(dval_ref.dtype)


# ----------------------------------------------------------------------------------------------
# pallas_call wrappers (inputs padded: T to block multiples, d_attn and dv to powers of two).


@dataclasses.dataclass(frozen=True)
class _Config:
  causal: bool
  blocks: BlockSizes  # block_d resolved
  interpret: bool
  poison: bool = False


def _w_spec(d_attn):  # v's row for head h, from [H, d_attn]
  return pl.BlockSpec((None, d_attn), lambda r, b, h: (h, 0))


def _forward(qp, kp, w, val, kl, ql, cfg: _Config):
  B, Tq, H, da = qp.shape
  Tk, dv = kp.shape[1], val.shape[-1]
  bq, bk, bd = cfg.blocks.block_q, cfg.blocks.block_k, cfg.blocks.block_d
  flops = B * H * Tq * Tk * (2 * da + 2 * dv) // (2 if cfg.causal else 1)
  return _common.call_kernel(
      functools.partial(_fwd_kernel, causal=cfg.causal, block_k=bk, block_d=bd),
      (qp, kp, w, val, kl, ql),
      [row_spec(bq, da), full_spec(Tk, da), _w_spec(da), full_spec(Tk, dv), LEN_SPEC,
       LEN_SPEC],
      [jax.ShapeDtypeStruct((B, Tq, H, dv), val.dtype), jax.ShapeDtypeStruct((B, H, Tq), _F32)],
      [row_spec(bq, dv), pl.BlockSpec((None, None, bq), lambda r, b, h: (b, h, r))],
      grid=(Tq // bq, B, H), cfg=cfg, name="additive_attention_fwd", head_dim=dv,
      cost_estimate=pl.CostEstimate(flops=flops, transcendentals=B * H * Tq * Tk * (da + 1),
                                    bytes_accessed=sum(x.size * x.dtype.itemsize
                                                       for x in (qp, kp, val)) * 2))


def _backward(qp, kp, w, val, do, lse, delta, kl, ql, cfg: _Config):
  B, Tq, H, da = qp.shape
  Tk, dv = kp.shape[1], val.shape[-1]
  bq, bk, bd = cfg.blocks.bwd_q, cfg.blocks.bwd_k, cfg.blocks.block_d
  stats_full = pl.BlockSpec((None, None, Tq), lambda r, b, h: (b, h, 0))
  stats_rows = pl.BlockSpec((None, None, bq), lambda r, b, h: (b, h, r))
  inputs = (qp, kp, w, val, do, lse, delta, kl, ql)
  (dq,) = _common.call_kernel(
      functools.partial(_dq_kernel, causal=cfg.causal, block_k=bk, block_d=bd), inputs,
      [row_spec(bq, da), full_spec(Tk, da), _w_spec(da), full_spec(Tk, dv), row_spec(bq, dv),
       stats_rows, stats_rows, LEN_SPEC, LEN_SPEC],
      [jax.ShapeDtypeStruct(qp.shape, qp.dtype)], [row_spec(bq, da)],
      grid=(Tq // bq, B, H), cfg=cfg, name="additive_attention_dq", head_dim=dv)
  dk, dval, dw_parts = _common.call_kernel(
      functools.partial(_dkv_kernel, causal=cfg.causal, block_q=bq, block_d=bd), inputs,
      [full_spec(Tq, da), row_spec(bk, da), _w_spec(da), row_spec(bk, dv), full_spec(Tq, dv),
       stats_full, stats_full, LEN_SPEC, LEN_SPEC],
      [jax.ShapeDtypeStruct(kp.shape, kp.dtype), jax.ShapeDtypeStruct(val.shape, val.dtype),
       jax.ShapeDtypeStruct((B, H, Tk // bk, da), _F32)],
      [row_spec(bk, da), row_spec(bk, dv),
       pl.BlockSpec((None, None, None, da), lambda r, b, h: (b, h, r, 0))],
      grid=(Tk // bk, B, H), cfg=cfg, name="additive_attention_dkv", head_dim=dv)
  dw = jnp.sum(dw_parts, axis=(0, 2))  # [H, d_attn]: v is shared by the batch and key blocks
  return dq, dk, dw.astype(w.dtype), dval


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _additive_core(qp, kp, w, val, kl, ql, cfg):
  return tuple(_forward(qp, kp, w, val, kl, ql, cfg))


def _additive_core_fwd(qp, kp, w, val, kl, ql, cfg):
  out, lse = _additive_core(qp, kp, w, val, kl, ql, cfg)
  return (out, lse), (qp, kp, w, val, kl, ql, out, lse)


def _additive_core_bwd(cfg, res, cts):
  qp, kp, w, val, kl, ql, out, lse = res
  g_out, g_lse = cts
  delta = jnp.einsum("bqhd,bqhd->bhq", g_out.astype(_F32), out.astype(_F32)) - g_lse
  dq, dk, dw, dval = _backward(qp, kp, w, val, g_out.astype(val.dtype), lse, delta, kl, ql, cfg)
  return dq, dk, dw, dval, None, None


_additive_core.defvjp(_additive_core_fwd, _additive_core_bwd)


def _pallas_padded(qp, kp, w, val, kl, ql, *, causal, blocks, interpret, poison=False):
  """Pads to kernel-friendly shapes and runs the kernels; returns padded (out, lse [B, H, Tq_p])."""
  Tq, Tk, da, dv = qp.shape[1], kp.shape[1], qp.shape[-1], val.shape[-1]
  if dv > _common.MAX_HEAD_DIM:
    raise ValueError(f"the Pallas kernel supports value dims up to {_common.MAX_HEAD_DIM}, got "
                     f"{dv}; use implementation='blocked'")
  blocks = blocks.clamp(Tq, Tk)
  da_p = _common.next_pow2(da)
  block_d = min(blocks.block_d or da_p, da_p)
  blocks = dataclasses.replace(blocks, block_d=block_d)
  Tq_p = _common.round_up(Tq, max(blocks.block_q, blocks.bwd_q))
  Tk_p = _common.round_up(Tk, max(blocks.block_k, blocks.bwd_k))
  dv_p = max(_common.MIN_BLOCK, _common.next_pow2(dv))
  pad = lambda x, T, width: _common.pad_axis(_common.pad_axis(x, 1, T), 3, width)
  cfg = _Config(causal=causal, blocks=blocks, interpret=interpret, poison=poison)
  # Zero padding of d_attn is exact: tanh(0 + 0) * 0 adds nothing, and its gradients are sliced off.
  return _additive_core(pad(qp, Tq_p, da_p), pad(kp, Tk_p, da_p), _common.pad_axis(w, 1, da_p),
                        pad(val, Tk_p, dv_p), kl, ql, cfg)


# ----------------------------------------------------------------------------------------------
# Implementations: (qp, kp, w, val, kl, ql, *, causal, blocks, interpret) -> (out, lse).


def _impl_pallas(qp, kp, w, val, kl, ql, *, causal, blocks, interpret):
  Tq, dv = qp.shape[1], val.shape[-1]
  out, lse = _pallas_padded(qp, kp, w, val, kl, ql, causal=causal, blocks=blocks,
                            interpret=interpret)
  return out[:, :Tq, :, :dv], jnp.swapaxes(lse[:, :, :Tq], 1, 2)


def additive_score(w, q_blk, k_blk):
  """e_ij = Σ_a w_a tanh(q_ia + k_ja): [tq, da] x [tk, da] -> [tq, tk] float32 (forms the
  [tq, tk, da] tanh tensor: per tile in the blocked path, whole in the naive one)."""
  return jnp.einsum("qka,a->qk", _tanh_tile(q_blk, k_blk), w.astype(_F32))


def _impl_blocked(qp, kp, w, val, kl, ql, *, causal, blocks, interpret):
  del interpret
  out, lse = _common.blocked_attention(
      additive_score, to_heads(qp), to_heads(kp), to_heads(val), w, kl, ql, causal=causal,
      block_q=blocks.block_q, block_k=blocks.block_k)
  return _common.from_heads(out, lse, val.dtype)


def _impl_xla(qp, kp, w, val, kl, ql, *, causal, blocks, interpret):
  del blocks, interpret
  out, lse = _common.naive_attention(additive_score, to_heads(qp), to_heads(kp), to_heads(val),
                                     w, kl, ql, causal=causal)
  return _common.from_heads(out, lse, val.dtype)


_IMPLEMENTATIONS = {"pallas": _impl_pallas, "blocked": _impl_blocked, "xla": _impl_xla}


def _check_inputs(q_proj, k_proj, v_vec, values):
  for name, x, rank in (("q_proj", q_proj, 4), ("k_proj", k_proj, 4), ("values", values, 4),
                        ("v_vec", v_vec, 2)):
    if x.ndim != rank:
      layout = "[H, d_attn]" if rank == 2 else "[B, T, H, d]"
      raise ValueError(f"{name} must be {layout}, got shape {x.shape}")
    _common.check_dtype(name, x)
  if q_proj.dtype != k_proj.dtype:
    raise ValueError(f"q_proj and k_proj must share a dtype, got {q_proj.dtype}, {k_proj.dtype}")
  B, _, H, da = q_proj.shape
  if not (k_proj.shape[0] == values.shape[0] == B and k_proj.shape[2] == values.shape[2] == H
          and v_vec.shape[0] == H):
    raise ValueError(f"batch or heads disagree: q_proj {q_proj.shape}, k_proj {k_proj.shape}, "
                     f"v_vec {v_vec.shape} ([H, d_attn]), values {values.shape}")
  if k_proj.shape[-1] != da or v_vec.shape[-1] != da:
    raise ValueError(f"d_attn disagrees: q_proj {q_proj.shape}, k_proj {k_proj.shape}, "
                     f"v_vec {v_vec.shape}")
  if k_proj.shape[1] != values.shape[1]:
    raise ValueError(f"k_proj and values disagree on Tk: {k_proj.shape}, {values.shape}")
  if 0 in (da, values.shape[-1], q_proj.shape[1], k_proj.shape[1]):
    raise ValueError(f"empty dimension: q_proj {q_proj.shape}, k_proj {k_proj.shape}, "
                     f"values {values.shape}")


@functools.partial(jax.jit, static_argnames=("causal", "implementation", "block_q", "block_k",
                                             "block_d", "block_sizes", "interpret"))
def additive_attention_with_lse(q_proj, k_proj, v_vec, values, *, key_lengths=None,
                                query_lengths=None, causal: bool = False,
                                implementation: str = "auto", block_q: int | None = None,
                                block_k: int | None = None, block_d: int | None = None,
                                block_sizes: BlockSizes | None = None,
                                interpret: bool | None = None):
  """Additive attention out_i = Σ_j softmax_j(vᵀ tanh(q_proj_i + k_proj_j)) values_j, and its lse.

  q_proj: [B, Tq, H, da] (W q + b), k_proj: [B, Tk, H, da] (U k), v_vec: [H, da],
  values: [B, Tk, H, dv]. Float32, bfloat16 or float16; q_proj and k_proj share a dtype.
  key_lengths, query_lengths: [B] int or None; causal: key j <= query i (top-left aligned).
  implementation: "pallas" (Triton on GPU; interpret mode on CPU), "blocked" (pure JAX, exact,
    O(T·d + block_q·block_k·da) memory), "xla" (naive: forms [B, H, Tq, Tk, da]), "auto" (pallas
    on GPU, blocked elsewhere). block_q, block_k, block_d (the d_attn slice of the on-chip tanh
    tile), or block_sizes for all tiles.
  Returns (out [B, Tq, H, dv] in values' dtype, lse [B, Tq, H] float32). A query row with no
  visible key gets out = 0, lse = -inf and zero gradients. Differentiable in q_proj, k_proj,
  v_vec and values (custom_vjp).
  """
  _check_inputs(q_proj, k_proj, v_vec, values)
  B, Tq = q_proj.shape[:2]
  Tk = k_proj.shape[1]
  kl = _common.check_lengths("key_lengths", key_lengths, B, Tk)
  ql = _common.check_lengths("query_lengths", query_lengths, B, Tq)
  impl = _common.resolve_implementation(implementation)
  interpret = _common.resolve_interpret(interpret)
  blocks = _common.resolve_blocks(block_q, block_k, block_sizes, _common.default_blocks(
      impl, interpret, blocked=BLOCKED_BLOCKS, interpreted=INTERPRET_BLOCKS, gpu=GPU_BLOCKS))
  if block_d is not None:
    blocks = dataclasses.replace(blocks, block_d=block_d)
  return _IMPLEMENTATIONS[impl](q_proj, k_proj, v_vec, values, kl, ql, causal=bool(causal),
                                blocks=blocks, interpret=interpret)


def additive_attention(q_proj, k_proj, v_vec, values, *, key_lengths=None, query_lengths=None,
                       causal: bool = False, implementation: str = "auto",
                       block_q: int | None = None, block_k: int | None = None,
                       block_d: int | None = None, block_sizes: BlockSizes | None = None,
                       interpret: bool | None = None):
  """Additive attention: out [B, Tq, H, dv]. See `additive_attention_with_lse` for arguments.

  A query row with no visible key returns zeros (value and gradient), never NaN.
  """
  return additive_attention_with_lse(
      q_proj, k_proj, v_vec, values, key_lengths=key_lengths, query_lengths=query_lengths,
      causal=causal, implementation=implementation, block_q=block_q, block_k=block_k,
      block_d=block_d, block_sizes=block_sizes, interpret=interpret)[0]


def additive_attention_reference(q_proj, k_proj, v_vec, values, *, key_lengths=None,
                                 query_lengths=None, causal: bool = False):
  """The naive form, same semantics as `additive_attention` (forms [B, H, Tq, Tk, da])."""
  return additive_attention(q_proj, k_proj, v_vec, values, key_lengths=key_lengths,
                            query_lengths=query_lengths, causal=causal, implementation="xla")
