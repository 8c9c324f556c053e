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

tanh passes (formations of the Tq·Tk·d_attn tanh elements, causal halves aside). The forward
forms each once. A backward kernel needs each slice twice, for the score (dS needs all of it)
and then for its gradients: forming it twice in both kernels makes 1 + 2 + 2 = 5 passes. A
kernel forms a slice once wherever the tile's slices stay on chip until dS is known:
- TPU (`kernels/_additive_tpu.py`): the dq and dk/dv bodies stash the step's tanh slabs in VMEM
  scratch (up to `_additive_tpu.STASH_BYTES`: d_attn <= 256 at the TPU tiles): 1 + 1 + 1 = 3.
- Triton: no scratch, and registers hold one [bq, bk, block_d] slice (64 floats a thread at
  32 x 32 x 8), not d_attn / block_d of them: a slice is held only when it is all of d_attn
  (block_d >= d_attn: 3 passes); otherwise 5.
The fewest passes, one for the whole backward, need one kernel to form each tile's tanh for dq
and dk/dv together: without atomics its dq contributions must leave as partial sums per key
block, [B, H, Tk / bk, Tq, d_attn] in HBM (at T = 16k, d_attn = 128, bk = 128 that is 1 GiB a
(batch, head)): the two kernels keep the backward at O(T) memory instead. tests count the tanh
elements of each kernel body's tile (tests/test_kernels_additive.py).

Layout, masks, dtypes and fully-masked rows as in `kernels.flash_attention`: `[B, T, H, ·]`,
key j visible to query i when j < key_lengths[b], i < query_lengths[b] and (causal) j <= i; a row
with no visible key returns zeros, lse -inf, zero gradients. tanh, scores, softmax and
accumulation are float32; the output has the dtype of `values`. GPU lowering: Triton, for the
reasons given in `kernels/flash_attention.py`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kernels import _additive_tpu, _common, _loop_steps, _skeleton, launch
from kernels._common import BlockSizes, positions
from kernels.launch import BLOCK_ROW, HEAD, LENGTHS, OTHER, ROW
from kernels.targets import AUTO

_F32 = jnp.float32


def _tanh_tile(q_chunk, k_chunk):
  """tanh(q_i + k_j) for a d_attn slice: [bq, bd] x [bk, bd] -> [bq, bk, bd] float32."""
  return jnp.tanh(q_chunk.astype(_F32)[:, None, :] + k_chunk.astype(_F32)[None, :, :])


def _chunks(n_chunks, block_d):
  return [pl.ds(c * block_d, block_d) for c in range(n_chunks)]


def _tile_chunks(x_ref, w_ref, block_d):
  """A [rows, d_attn] tile and v's [d_attn] row cut into d_attn / block_d column slices, float32
  (they stay on chip for the whole loop): (slices, x chunks, w chunks)."""
  slices = _chunks(x_ref.shape[1] // block_d, block_d)
  return (slices, [x_ref[:, sl].astype(_F32) for sl in slices],
          [w_ref[0, sl].astype(_F32) for sl in slices])


def _score_tile(q_chunks, k_chunks, w_chunks, tanhs=None):
  """e = Σ_a w_a tanh(q_ia + k_ja) for one [bq, bk] tile, summed over d_attn slices (from the
  slices' tanh tiles when given)."""
  tanhs = tanhs or [_tanh_tile(qc, kc) for qc, kc in zip(q_chunks, k_chunks)]
  s = None
  for h, wc in zip(tanhs, w_chunks):
    part = jnp.sum(h * wc[None, None, :], axis=2)
    s = part if s is None else s + part
  return s


def _tile_valid(i, block_q, j, block_k, lengths, causal, masked):
  """The [bq, bk] mask of tile (i, j), or None for a whole tile (`_common.valid_mask`)."""
  if not masked:
    return None
  return _common.valid_mask(positions(i, block_q), positions(j, block_k), *lengths, causal)


# ----------------------------------------------------------------------------------------------
# Tiles of the GPU bodies (a loop over the other sequence; the TPU bodies, one step of the grid's
# reduction axis, are `kernels/_additive_tpu.py`): *args = (q_chunks, k_chunks, w_chunks, val,
# do, lse, delta, valid), valid None on a whole tile.


def _grad_tile(q_chunks, k_chunks, w_chunks, val, do, lse, delta, valid):
  """One tile's backward: (P, dS, tanh tiles), P and dS [bq, bk] (Algorithm 2), a tanh tile
  [bq, bk, block_d] per d_attn slice: held from the score when d_attn is one slice, else formed
  again (registers hold one slice; see the module docstring)."""
  held = [_tanh_tile(q_chunks[0], k_chunks[0])] if len(q_chunks) == 1 else None
  s = _score_tile(q_chunks, k_chunks, w_chunks, held)
  p, ds = _common.softmax_grad_tile(s, valid, lse, do, val, delta)
  return p, ds, held or [_tanh_tile(qc, kc) for qc, kc in zip(q_chunks, k_chunks)]


def _dq_tile(*args):
  """Σ_j dS (1 - tanh²) per d_attn slice, [bq, block_d] each (times v, when written)."""
  _, ds, tanhs = _grad_tile(*args)
  return [jnp.sum(ds[:, :, None] * (1.0 - h * h), axis=1) for h in tanhs]


def _dkv_tile(*args):
  """(Σ_i dS (1 - tanh²) [bk, block_d] and Σ_ij dS tanh [block_d] per d_attn slice, Pᵀ dO)."""
  p, ds, tanhs = _grad_tile(*args)
  do = args[4]
  return ([jnp.sum(ds[:, :, None] * (1.0 - h * h), axis=0) for h in tanhs],
          [jnp.sum(jnp.sum(ds[:, :, None] * h, axis=0), axis=0) for h in tanhs],
          _common.dot_tn(p.astype(do.dtype), do))


# ----------------------------------------------------------------------------------------------
# GPU kernel bodies (refs as in flash_attention: 2-D per (batch, head); w_ref is v's [d_attn] row).
# Each loop over the other sequence runs over its whole and masked ranges (`kernels/_loop_steps.py`).


def _fwd_kernel(q_ref, k_ref, w_ref, val_ref, kl_ref, ql_ref, *refs, causal, block_k, block_d):
  o_ref, lse_ref = refs[-2:]
  block_q = q_ref.shape[0]
  i = pl.program_id(0)
  lengths = kl_ref[0, 0], ql_ref[0, 0]
  slices, q_chunks, w_chunks = _tile_chunks(q_ref, w_ref, block_d)

  def body(j, carry, masked):
    rows = pl.ds(j * block_k, block_k)
    s = _score_tile(q_chunks, [k_ref[rows, sl] for sl in slices], w_chunks)  # [bq, bk]
    valid = _tile_valid(i, block_q, j, block_k, lengths, causal, masked)
    return _common.online_softmax_update(carry, s, valid, val_ref[rows, :])

  carry = _loop_steps.split_loops(
      body, _common.online_softmax_init(block_q, val_ref.shape[-1]),
      *_loop_steps.key_ranges(i, block_q, block_k, lengths, causal))
  out, lse = _common.finish_softmax(*carry)
  o_ref[...] = out.astype(o_ref.dtype)
  lse_ref[...] = lse[:, None]


def _dq_kernel(q_ref, k_ref, w_ref, val_ref, do_ref, lse_ref, delta_ref, kl_ref, ql_ref, *refs,
               causal, block_k, block_d):
  dq_ref = refs[-1]
  block_q = q_ref.shape[0]
  i = pl.program_id(0)
  lengths = kl_ref[0, 0], ql_ref[0, 0]
  slices, q_chunks, w_chunks = _tile_chunks(q_ref, w_ref, block_d)
  do, lse, delta = do_ref[...], lse_ref[:, 0], delta_ref[:, 0]

  def body(j, dq_chunks, masked):
    rows = pl.ds(j * block_k, block_k)
    valid = _tile_valid(i, block_q, j, block_k, lengths, causal, masked)
    parts = _dq_tile(q_chunks, [k_ref[rows, sl] for sl in slices], w_chunks, val_ref[rows, :],
                     do, lse, delta, valid)
    return tuple(acc + part for acc, part in zip(dq_chunks, parts))

  init = tuple(jnp.zeros((block_q, block_d), _F32) for _ in slices)
  dq_chunks = _loop_steps.split_loops(
      body, init, *_loop_steps.key_ranges(i, block_q, block_k, lengths, causal))
  for sl, wc, acc in zip(slices, w_chunks, dq_chunks):
    dq_ref[:, sl] = (acc * wc[None, :]).astype(dq_ref.dtype)


def _dkv_kernel(q_ref, k_ref, w_ref, val_ref, do_ref, lse_ref, delta_ref, kl_ref, ql_ref, *refs,
                causal, block_q, block_d):
  dk_ref, dval_ref, dw_ref = refs[-3:]
  block_k = k_ref.shape[0]
  j = pl.program_id(0)
  lengths = kl_ref[0, 0], ql_ref[0, 0]
  slices, k_chunks, w_chunks = _tile_chunks(k_ref, w_ref, block_d)
  val = val_ref[...]

  def body(i, carry, masked):
    dk_chunks, dw_chunks, dval = carry
    rows = pl.ds(i * block_q, block_q)
    valid = _tile_valid(i, block_q, j, block_k, lengths, causal, masked)
    dk_parts, dw_parts, dval_part = _dkv_tile(
        [q_ref[rows, sl].astype(_F32) for sl in slices], k_chunks, w_chunks, val,
        do_ref[rows, :], lse_ref[rows, 0], delta_ref[rows, 0], valid)
    return (tuple(a + b for a, b in zip(dk_chunks, dk_parts)),
            tuple(a + b for a, b in zip(dw_chunks, dw_parts)), dval + dval_part)

  init = (tuple(jnp.zeros((block_k, block_d), _F32) for _ in slices),
          tuple(jnp.zeros((block_d,), _F32) for _ in slices), jnp.zeros(val.shape, _F32))
  dk_chunks, dw_chunks, dval = _loop_steps.split_loops(
      body, init, *_loop_steps.query_ranges(j, block_q, block_k, lengths, causal))
  for sl, wc, dk_c, dw_c in zip(slices, w_chunks, dk_chunks, dw_chunks):
    dk_ref[:, sl] = (dk_c * wc[None, :]).astype(dk_ref.dtype)
    dw_ref[0, sl] = dw_c
  dval_ref[...] = dval.astype(dval_ref.dtype)


# ----------------------------------------------------------------------------------------------
# The pallas_calls, described for the target's launch (`kernels/launch.py`). Operands arrive
# padded by `_skeleton.pallas_padded` (T to block multiples, d_attn and dv to powers of two,
# block_d resolved) in the skeleton's order: q = q_proj, k = k_proj, v = values,
# theta = v_vec [H, d_attn] (passed as [H, 1, d_attn], a TPU-legal HEAD block).


def _forward(qp, kp, val, w, kl, ql, cfg: _skeleton.Config):
  B, H, Tq, da = cfg.layout.dims(qp)
  Tk, dv = cfg.layout.dims(kp)[2], val.shape[-1]
  bq, bk = cfg.blocks.block_q, cfg.blocks.block_k
  kw = dict(causal=cfg.causal, block_d=cfg.blocks.block_d)
  flops = B * H * Tq * Tk * (2 * da + 2 * dv) // (2 if cfg.causal else 1)
  nbytes = sum(x.size * x.dtype.itemsize for x in (qp, kp, val)) * 2
  call = launch.Call(
      "additive_attention_fwd", writes="q", block_q=bq, block_k=bk, causal=cfg.causal,
      inputs=(ROW, OTHER, HEAD, OTHER, LENGTHS, LENGTHS), outputs=(ROW, ROW),
      out_shapes=_common.forward_outputs(qp, val),
      loop_body=lambda br: functools.partial(_fwd_kernel, block_k=br, **kw),
      grid_body=functools.partial(_additive_tpu.fwd_kernel, **kw), head_dim=dv,
      grid_scratch=_additive_tpu.fwd_scratch(bq, bk, da, dv),
      cost_estimate=pl.CostEstimate(flops=flops, transcendentals=B * H * Tq * Tk * (da + 1),
                                    bytes_accessed=nbytes))
  out, lse = cfg.target.launch(
      call, (qp, kp, w[:, None, :], val, _common.length_rows(kl), _common.length_rows(ql)), cfg)
  return out, lse[..., 0]


def _backward(qp, kp, val, w, do, lse, delta, kl, ql, cfg: _skeleton.Config):
  B, H, _, da = cfg.layout.dims(qp)
  Tk, dv = cfg.layout.dims(kp)[2], val.shape[-1]
  bq, bk = cfg.blocks.bwd_q, cfg.blocks.bwd_k
  kw = dict(causal=cfg.causal, block_d=cfg.blocks.block_d)
  tpu_kw = dict(kw, stash=_additive_tpu.stash_shape(bq, bk, da) is not None)
  inputs = (qp, kp, w[:, None, :], val, do, lse[..., None], delta[..., None],
            _common.length_rows(kl), _common.length_rows(ql))
  (dq,) = cfg.target.launch(launch.Call(
      "additive_attention_dq", writes="q", block_q=bq, block_k=bk, causal=cfg.causal,
      inputs=(ROW, OTHER, HEAD, OTHER, ROW, ROW, ROW, LENGTHS, LENGTHS), outputs=(ROW,),
      out_shapes=(jax.ShapeDtypeStruct(qp.shape, qp.dtype),),
      loop_body=lambda br: functools.partial(_dq_kernel, block_k=br, **kw),
      grid_body=functools.partial(_additive_tpu.dq_kernel, **tpu_kw), head_dim=dv,
      grid_scratch=_additive_tpu.dq_scratch(bq, bk, da)), inputs, cfg)
  dk, dval, dw_parts = cfg.target.launch(launch.Call(
      "additive_attention_dkv", writes="k", block_q=bq, block_k=bk, causal=cfg.causal,
      inputs=(OTHER, ROW, HEAD, ROW, OTHER, OTHER, OTHER, LENGTHS, LENGTHS),
      outputs=(ROW, ROW, BLOCK_ROW),
      out_shapes=(jax.ShapeDtypeStruct(kp.shape, kp.dtype),
                  jax.ShapeDtypeStruct(val.shape, val.dtype),
                  jax.ShapeDtypeStruct((B, H, Tk // bk, 1, da), _F32)),  # dv: a row per key block
      loop_body=lambda br: functools.partial(_dkv_kernel, block_q=br, **kw),
      grid_body=functools.partial(_additive_tpu.dkv_kernel, **tpu_kw), head_dim=dv,
      grid_scratch=_additive_tpu.dkv_scratch(bq, bk, da, dv)), inputs, cfg)
  dw = jnp.sum(dw_parts, axis=(0, 2, 3))  # [H, d_attn]: v is shared by the batch and key blocks
  return dq, dk, dval, dw.astype(w.dtype)


def additive_score(w, q_blk, k_blk):
  """e_ij = Σ_a w_a tanh(q_ia + k_ja): [tq, da] x [tk, da] -> [tq, tk] float32 (forms the
  [tq, tk, da] tanh tensor: per tile in the blocked path, whole in the naive one)."""
  return jnp.einsum("qka,a->qk", _tanh_tile(q_blk, k_blk), w.astype(_F32))


def _check_inputs(q_proj, k_proj, values, v_vec):
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


# d_attn is padded to a power of two without a floor (no dot contracts it) and has no size limit:
# the kernels form the tanh tile a block_d slice at a time.
KERNEL = _skeleton.FusedKernel(
    name="additive_attention", forward=_forward, backward=_backward, score=additive_score,
    check_inputs=_check_inputs, min_qk_width=1, limits_qk_width=False)


# ----------------------------------------------------------------------------------------------
# Public wrappers.


@functools.partial(jax.jit, static_argnames=("causal", "implementation", "block_q", "block_k",
                                             "block_d", "block_sizes", "interpret",
                                             "target"))
def additive_attention_with_lse(q_proj, k_proj, v_vec, values, *, key_lengths=None,
                                query_lengths=None, causal: bool = False,
                                implementation: str = "auto", block_q: int | None = None,
                                block_k: int | None = None, block_d: int | None = None,
                                block_sizes: BlockSizes | None = None,
                                interpret: bool | None = None, target: str = AUTO):
  """Additive attention out_i = Σ_j softmax_j(vᵀ tanh(q_proj_i + k_proj_j)) values_j, and its lse.

  q_proj: [B, Tq, H, da] (W q + b), k_proj: [B, Tk, H, da] (U k), v_vec: [H, da],
  values: [B, Tk, H, dv]. Float32, bfloat16 or float16; q_proj and k_proj share a dtype.
  key_lengths, query_lengths: [B] int or None; causal: key j <= query i (top-left aligned).
  implementation: "pallas" (Triton on GPU; interpret mode on CPU), "blocked" (pure JAX, exact,
    O(T·d + block_q·block_k·da) memory), "xla" (naive: forms [B, H, Tq, Tk, da]), "auto" (pallas
    on GPU, blocked elsewhere; a named target's own implementation). block_q, block_k, block_d
    (the d_attn slice of the on-chip tanh tile), or block_sizes for all tiles.
  target, interpret: as in `kernels.attention_with_lse` (no "mosaic_gpu" targets: this kernel
    has no Mosaic GPU forward).
  Returns (out [B, Tq, H, dv] in values' dtype, lse [B, Tq, H] float32). A query row with no
  visible key gets out = 0, lse = -inf and zero gradients. Differentiable in q_proj, k_proj,
  v_vec and values (custom_vjp).
  """
  kl, ql = _skeleton.check(KERNEL, q_proj, k_proj, values, v_vec, key_lengths, query_lengths)
  return _skeleton.dispatch(KERNEL, q_proj, k_proj, values, v_vec, kl, ql, causal=causal,
                            implementation=implementation, block_q=block_q, block_k=block_k,
                            block_d=block_d, block_sizes=block_sizes, interpret=interpret,
                            target=target)


def additive_attention(q_proj, k_proj, v_vec, values, *, key_lengths=None, query_lengths=None,
                       causal: bool = False, implementation: str = "auto",
                       block_q: int | None = None, block_k: int | None = None,
                       block_d: int | None = None, block_sizes: BlockSizes | None = None,
                       interpret: bool | None = None, target: str = AUTO):
  """Additive attention: out [B, Tq, H, dv]. See `additive_attention_with_lse` for arguments.

  A query row with no visible key returns zeros (value and gradient), never NaN.
  """
  return additive_attention_with_lse(
      q_proj, k_proj, v_vec, values, key_lengths=key_lengths, query_lengths=query_lengths,
      causal=causal, implementation=implementation, block_q=block_q, block_k=block_k,
      block_d=block_d, block_sizes=block_sizes, interpret=interpret, target=target)[0]


def pallas_additive_attention_padded(q_proj, k_proj, v_vec, values, *, key_lengths=None,
                                     query_lengths=None, causal: bool = False,
                                     block_sizes: BlockSizes | None = None,
                                     interpret: bool | None = None, poison: bool = False,
                                     target: str = AUTO):
  """The Pallas kernels on padded shapes, for tests and benchmarks (not jitted; differentiable).

  Arguments as in `additive_attention_with_lse` (target "auto" compiled: the host's platform's
  target); block_sizes default to the target's tiles. poison=True starts every output buffer of
  the forward and backward kernels as NaN, so an element a kernel fails to write shows as NaN.
  Returns the padded (out [B, Tq_p, H, dv_p] in values' dtype, lse [B, H, Tq_p] float32): Tq_p a
  multiple of the query tiles, dv_p a power of two >= 16.
  """
  kl, ql = _skeleton.check(KERNEL, q_proj, k_proj, values, v_vec, key_lengths, query_lengths)
  return _skeleton.pallas_padded(KERNEL, q_proj, k_proj, values, v_vec, kl, ql, causal=causal,
                                 blocks=block_sizes, target=target, interpret=interpret,
                                 poison=poison)


# ----------------------------------------------------------------------------------------------
# Reference.


def additive_attention_reference(q_proj, k_proj, v_vec, values, *, key_lengths=None,
                                 query_lengths=None, causal: bool = False):
  """The naive form, same semantics as `additive_attention` (forms [B, H, Tq, Tk, da])."""
  return additive_attention(q_proj, k_proj, v_vec, values, key_lengths=key_lengths,
                            query_lengths=query_lengths, causal=causal, implementation="xla")
