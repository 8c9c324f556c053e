"""The additive kernel's TPU bodies, for the "grid" launch (`kernels/launch.py`,
`kernels/targets/tpu.py`): one [bq, bk] tile per grid step (see `kernels/_grid_steps.py`), refs
as in `kernels.additive`.

Tile layout. A tanh slab of a d_attn slice is [bd, bq, bk]: keys on the 128 lanes, queries on the
sublanes, the d_attn slice along the leading (untiled) axis. The score's reduction over d_attn
is then a sum of whole vregs (no cross-lane or cross-sublane reduction), each slab is lane-dense
for any block_d (the GPU layout [bq, bk, bd] puts bd on the lanes: block_d = 8 filled 8 of 128),
and the softmax tiles [bq, bk] come out in the layout of the dot-product kernel's. The operands
arrive [rows, d_attn] (rows on sublanes); one 2-D transpose per step gives the [d_attn, rows]
form (kept in scratch) whose slices broadcast into a slab. The backward's reductions run over
the sublanes for dk and dv (Σ_i) and over the lanes for dq (Σ_j); their accumulators are kept
transposed, [d_attn, rows], and transposed back once, when written.

tanh once per slice. The backward needs every slab twice, for the score (before dS exists) and
for the gradients (after), so the dq and dk/dv bodies stash the step's slabs in VMEM scratch
([d_attn, bq, bk] float32) while forming the score and read them back for the gradients: each
tanh element is formed once per kernel. Where the stash would exceed `STASH_BYTES` the slabs
are formed again instead (two passes).
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kernels import _common, _grid_steps
from kernels._common import positions

_F32 = jnp.float32
# VMEM a backward body may hold its tile's tanh slabs in: at the TPU tiles (32 x 128) up to
# d_attn = 256 (4 MiB), a quarter of v5e's 16 MiB scoped VMEM.
STASH_BYTES = 4 * 2**20


def stash_shape(block_q, block_k, d_attn):
  """The backward bodies' stash, [d_attn, bq, bk] float32, or None where it exceeds STASH_BYTES."""
  return ((d_attn, block_q, block_k) if d_attn * block_q * block_k * 4 <= STASH_BYTES else None)


# The slices of d_attn are a `fori_loop`, not unrolled: at d_attn = 512 the unrolled backward
# ran out of scoped VMEM in Mosaic's stack. A slice is a dynamic row range of the transposed
# operands, qᵀ [da, bq], kᵀ [da, bk] and vᵀ [da, 1], which live in scratch (`t_refs`) for it;
# block_d a multiple of 8 keeps each range on whole (8, 128) tiles.


def _transpose_in(q_ref, k_ref, w_ref, t_refs):
  """Stores qᵀ, kᵀ and vᵀ (float32) in t_refs = (qT_ref, kT_ref, wT_ref)."""
  for src, dst in zip((q_ref, k_ref, w_ref), t_refs):
    dst[...] = src[...].astype(_F32).T


def _slices(t_refs, block_d, body, init):
  """fori_loop of body(rows, carry) over the d_attn slices, rows = pl.ds(c * block_d, block_d)."""
  n = t_refs[0].shape[0] // block_d
  return lax.fori_loop(
      0, n, lambda c, carry: body(pl.ds(pl.multiple_of(c * block_d, block_d), block_d), carry),
      init)


def _slab(t_refs, rows):
  """tanh(q_i + k_j) of one d_attn slice: [bd, bq, bk] float32."""
  qT_ref, kT_ref, _ = t_refs
  return jnp.tanh(qT_ref[rows][:, :, None] + kT_ref[rows][:, None, :])


def _score(t_refs, block_d, stash_ref=None):
  """One tile's score, e = Σ_a w_a tanh(q_ia + k_ja) [bq, bk], a slab at a time (each stored in
  stash_ref when given). Returns (s, slab(rows) -> [bd, bq, bk])."""
  wT_ref = t_refs[2]

  def body(rows, s):
    h = _slab(t_refs, rows)
    if stash_ref is not None:
      stash_ref[rows] = h
    return s + jnp.sum(h * wT_ref[rows][:, :, None], axis=0)  # over the leading axis: whole vregs

  s = _slices(t_refs, block_d, body,
              jnp.zeros((t_refs[0].shape[1], t_refs[1].shape[1]), _F32))
  slab = ((lambda rows: stash_ref[rows]) if stash_ref is not None
          else functools.partial(_slab, t_refs))
  return s, slab


def _valid(i, j, block_q, block_k, lengths, causal, masked):
  if not masked:
    return None
  return _common.valid_mask(positions(i, block_q), positions(j, block_k), *lengths, causal)


def fwd_kernel(q_ref, k_ref, w_ref, val_ref, kl_ref, ql_ref, *refs, causal, block_d):
  """Scratch: m, l, acc (`_grid_steps.online_softmax_steps`), then qᵀ, kᵀ, vᵀ."""
  block_q, block_k = q_ref.shape[0], k_ref.shape[0]
  i, j = pl.program_id(2), pl.program_id(3)
  lengths = kl_ref[0, 0], ql_ref[0, 0]
  t_refs = refs[-3:]

  def update(carry, masked):
    _transpose_in(q_ref, k_ref, w_ref, t_refs)
    s, _ = _score(t_refs, block_d)
    valid = _valid(i, j, block_q, block_k, lengths, causal, masked)
    return _common.online_softmax_update(carry, s, valid, val_ref[...])

  whole = j < _common.whole_key_blocks(i, block_q, block_k, *lengths, causal)
  _grid_steps.online_softmax_steps(
      *refs[-8:-3], visible=j < _common.num_key_blocks(i, block_q, block_k, *lengths, causal),
      update=lambda carry: lax.cond(whole, functools.partial(update, masked=False),
                                    functools.partial(update, masked=True), carry))


def _grad(refs, t_refs, valid, block_d, stash_ref):
  """(P, dS [bq, bk], slab) of one tile (Algorithm 2), its slabs formed once where stashed.
  refs: the kernel's (q, k, w, values, dO, lse, delta) refs."""
  q_ref, k_ref, w_ref, val_ref, do_ref, lse_ref, delta_ref = refs
  _transpose_in(q_ref, k_ref, w_ref, t_refs)
  s, slab = _score(t_refs, block_d, stash_ref)
  p, ds = _common.softmax_grad_tile(s, valid, lse_ref[:, 0], do_ref[...], val_ref[...],
                                    delta_ref[:, 0])
  return p, ds, slab


def _scratch_refs(refs, n_acc, stash):
  """(accumulators, t_refs, stash_ref or None) from the refs after a backward body's outputs."""
  stash_ref = refs[-1] if stash else None
  refs = refs[:-1] if stash else refs
  return refs[-3 - n_acc:-3], refs[-3:], stash_ref


def dq_kernel(q_ref, k_ref, w_ref, val_ref, do_ref, lse_ref, delta_ref, kl_ref, ql_ref, *refs,
              causal, block_d, stash):
  """dq_ia = w_a Σ_j dS_ij (1 - tanh²_ija); scratch: dqᵀ [da, bq], qᵀ, kᵀ, vᵀ (and the stash)."""
  (acc_ref,), t_refs, stash_ref = _scratch_refs(refs, 1, stash)
  dq_ref = refs[-5 - stash]
  block_q, block_k = q_ref.shape[0], k_ref.shape[0]
  i, j = pl.program_id(2), pl.program_id(3)
  lengths = kl_ref[0, 0], ql_ref[0, 0]
  ins = (q_ref, k_ref, w_ref, val_ref, do_ref, lse_ref, delta_ref)

  def accumulate(masked):
    valid = _valid(i, j, block_q, block_k, lengths, causal, masked)
    _, ds, slab = _grad(ins, t_refs, valid, block_d, stash_ref)

    def body(rows, carry):
      h = slab(rows)
      acc_ref[rows] += jnp.sum(ds[None] * (1.0 - h * h), axis=2)  # Σ_j: [bd, bq]
      return carry

    _slices(t_refs, block_d, body, 0)

  def write():
    wT = w_ref[...].astype(_F32).T
    dq_ref[...] = (acc_ref[...] * wT).T.astype(dq_ref.dtype)

  whole = j < _common.whole_key_blocks(i, block_q, block_k, *lengths, causal)
  _grid_steps.reduce_steps(
      [acc_ref], visible=j < _common.num_key_blocks(i, block_q, block_k, *lengths, causal),
      accumulate=_grid_steps.by_mask(whole, accumulate), write=write)


def dkv_kernel(q_ref, k_ref, w_ref, val_ref, do_ref, lse_ref, delta_ref, kl_ref, ql_ref, *refs,
               causal, block_d, stash):
  """dk_ja = w_a Σ_i dS_ij (1 - tanh²_ija), dv_a = Σ_ij dS_ij tanh_ija, dvalues = Pᵀ dO;
  scratch: dkᵀ [da, bk], dvalues [bk, dv], dv's sums over i [da, bk], qᵀ, kᵀ, vᵀ (and the
  stash)."""
  (dk_acc, dval_acc, dw_acc), t_refs, stash_ref = _scratch_refs(refs, 3, stash)
  dk_ref, dval_ref, dw_ref = refs[-9 - stash:-6 - stash]
  block_q, block_k = q_ref.shape[0], k_ref.shape[0]
  j, i = pl.program_id(2), pl.program_id(3)  # key block written, query block read
  lengths = kl_ref[0, 0], ql_ref[0, 0]
  ins = (q_ref, k_ref, w_ref, val_ref, do_ref, lse_ref, delta_ref)

  def accumulate(masked):
    valid = _valid(i, j, block_q, block_k, lengths, causal, masked)
    p, ds, slab = _grad(ins, t_refs, valid, block_d, stash_ref)

    def body(rows, carry):
      h = slab(rows)
      dk_acc[rows] += jnp.sum(ds[None] * (1.0 - h * h), axis=1)  # Σ_i: [bd, bk]
      dw_acc[rows] += jnp.sum(ds[None] * h, axis=1)  # Σ_i; the lanes (Σ_j) summed when written
      return carry

    _slices(t_refs, block_d, body, 0)
    do = do_ref[...]
    dval_acc[...] += _common.dot_tn(p.astype(do.dtype), do)  # dvalues += Pᵀ dO

  def write():
    wT = w_ref[...].astype(_F32).T
    dk_ref[...] = (dk_acc[...] * wT).T.astype(dk_ref.dtype)
    dw_ref[...] = jnp.sum(dw_acc[...], axis=1, keepdims=True).T  # [1, da]
    dval_ref[...] = dval_acc[...].astype(dval_ref.dtype)

  lo, hi = _common.query_block_range(j, block_q, block_k, *lengths, causal)
  wlo, whi = _common.whole_query_blocks(j, block_q, block_k, *lengths, causal)
  _grid_steps.reduce_steps([dk_acc, dval_acc, dw_acc], visible=(lo <= i) & (i < hi),
                           accumulate=_grid_steps.by_mask((wlo <= i) & (i < whi), accumulate),
                           write=write)


# grid_scratch of each kernel (float32), from its tiles: accumulators, then qᵀ, kᵀ, vᵀ, then the
# backward's stash where it fits.


def _transposed(block_q, block_k, d_attn):
  return ((d_attn, block_q), (d_attn, block_k), (d_attn, 1))


def fwd_scratch(block_q, block_k, d_attn, dv):  # m, l lane-replicated; acc
  return ((block_q, _common.LANES), (block_q, _common.LANES), (block_q, dv),
          *_transposed(block_q, block_k, d_attn))


def _stash(block_q, block_k, d_attn):
  stash = stash_shape(block_q, block_k, d_attn)
  return () if stash is None else (stash,)


def dq_scratch(block_q, block_k, d_attn):  # dqᵀ
  return (((d_attn, block_q),) + _transposed(block_q, block_k, d_attn)
          + _stash(block_q, block_k, d_attn))


def dkv_scratch(block_q, block_k, d_attn, dv):  # dkᵀ, dvalues, dv's partial sums over i
  return (((d_attn, block_k), (block_k, dv), (d_attn, block_k))
          + _transposed(block_q, block_k, d_attn) + _stash(block_q, block_k, d_attn))
