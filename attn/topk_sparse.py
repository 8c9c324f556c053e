"""Top-k attention over the k kept keys alone: the `topk` scope's own path.

The scope's dense form (attn.scopes.topk_scope) narrows the [..., Tq, Tk] mask and then runs the
softmax and the weighted sum over every key, so it costs global attention plus the top-k. For
scores of the dot-product form (e = c q.k: a score registered with `dot_scale`, i.e. `dot` and
`scaled_dot`) under the softmax, this path works on the kept keys once they are chosen:

  forward   e = c q K^T (dense, once, to choose), vals, idx = lax.top_k(e masked, k);
            p = softmax(vals / tau) over the slots holding a valid key;
            context = sum_j p_j V[idx_j]                                  (O(Tq k dv))
  backward  from q, K, V, idx and p alone, no [Tq, Tk] tensor:
            dV[idx_j] += p_j dO;  dp_j = dO . V[idx_j];  ds = p (dp - sum_j p_j dp_j);
            dq = (c / tau) sum_j ds_j K[idx_j];  dK[idx_j] += (c / tau) ds_j q;
            dtau = -sum_j ds_j vals_j / tau^2                              (O(Tq k d))

Cost: the score matmul and the top-k (O(Tq Tk log k) compares) as in the dense form, then
O(Tq k d) instead of global attention's softmax and two more [Tq, Tk] matmuls forward and four
backward; kept for the backward pass: k indices and weights a query (plus the inputs), instead
of the [Tq, Tk] exponentials.

Ties: the dense form keeps every key tied with the k-th (a row may keep more than k); k slots
cannot. When any row of a call has more than k valid keys at or above its k-th, the whole call
runs the dense form instead, forward and backward (`lax.cond`), so the outputs are the dense
form's in every case. That form runs over blocks of queries (about 64k scores a block and batch
row), recomputing each block's scores in the backward pass: XLA allocates a conditional
branch's temporaries apart from the rest of the step, and a whole [Tq, Tk] branch would raise
every step's peak memory above global attention's for a case that rarely runs. Whether a row
ties is read off one slot more than kept (its (k+1)-th valid score equals its k-th), without a
pass over [Tq, Tk]. Under a vmap that batches that test the cond runs both branches (correct,
not faster): attn.multihead calls this with the heads as a batch axis, not a vmap.

Where the k gathered keys and values of a query outweigh its Tk scores (`gathering_pays`), the
scope keeps its dense form. The top-k itself (XLA:CPU's TopK kernel, one thread, ~31 ms for
[4096, 1024] rows at k = 33 on a 2-core EPYC) stays the floor of any path that selects exactly.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from attn import masks as masks_lib
from attn.normalizers import softmax
from attn.precision import accum_dtype


def _gather(x, idx):
  """x: [N, Tk, d], idx: [N, Tq, k] -> [N, Tq, k, d]."""
  return jax.vmap(lambda x, i: x[i])(x, idx)


def _scatter_add(Tk, idx, u):
  """The transpose of _gather: idx: [N, Tq, k], u: [N, Tq, k, d] -> [N, Tk, d]."""
  return jax.vmap(lambda i, u: jnp.zeros((Tk,) + u.shape[-1:], u.dtype).at[i].add(u))(idx, u)


def _kept_softmax(vals, tau):
  """p: [N, Tq, k] the softmax normalizer over the slots holding a valid key (vals > -inf), 0 at
  the others (a row with none: all zeros), and that validity."""
  valid = vals > -jnp.inf
  return softmax(vals / tau, valid), valid


def _dense_context(score_fn, q, kp, v, tau, bits):
  """The dense form's context: the softmax over the kept keys (`bits`, packed), every key tied
  with the k-th included. q: [N, Tq, d], bits: [N, Tq, W]."""
  e = score_fn(None, q, kp)  # [N, Tq, Tk]
  w = softmax(e.astype(tau.dtype) / tau, masks_lib.unpack_bits(bits, e.shape[-1]))
  return jnp.einsum("...qk,...kd->...qd", w, v.astype(w.dtype))


# The dense fallback runs over blocks of queries of about this many scores per batch row, so its
# [Tq, Tk] temporaries (which XLA allocates for a conditional's branch apart from the rest) stay
# small whatever T: the fallback is rare, and it must not set the step's peak memory.
_BLOCK_SCORES = 1 << 16


def _query_blocks(x, bq):
  """[N, Tq, ...] -> [nb, N, bq, ...], the rows padded to nb * bq (padded bit rows keep no key,
  so their context and gradients are zero)."""
  pad = -x.shape[1] % bq
  x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
  return jnp.moveaxis(x.reshape((x.shape[0], -1, bq) + x.shape[2:]), 1, 0)


def _merge_blocks(x, Tq):
  """_query_blocks' inverse: [nb, N, bq, ...] -> [N, Tq, ...]."""
  x = jnp.moveaxis(x, 0, 1)
  return x.reshape((x.shape[0], -1) + x.shape[3:])[:, :Tq]


def _block_rows(Tq, Tk):
  return max(1, min(Tq, _BLOCK_SCORES // Tk))


def _dense_context_blocked(score_fn, q, kp, v, tau, bits):
  """_dense_context a block of queries at a time."""
  bq = _block_rows(q.shape[1], kp.shape[1])
  one = lambda qb_bb: _dense_context(score_fn, qb_bb[0], kp, v, tau, qb_bb[1])
  ctx = jax.lax.map(one, (_query_blocks(q, bq), _query_blocks(bits, bq)))
  return _merge_blocks(ctx, q.shape[1])


def _dense_grads_blocked(score_fn, q, kp, v, tau, bits, g):
  """The dense form's gradients (q, kp, v, tau) a block of queries at a time, dK, dV and dtau
  summed over the blocks."""
  bq = _block_rows(q.shape[1], kp.shape[1])
  acc = tau.dtype

  def block(carry, xs):
    qb, bb, gb = xs
    _, vjp = jax.vjp(lambda qb, kp, v, tau: _dense_context(score_fn, qb, kp, v, tau, bb),
                     qb, kp, v, tau)
    dqb, dk, dv, dtau = vjp(gb.astype(acc))
    return jax.tree.map(lambda c, x: c + x.astype(acc), carry, (dk, dv, dtau)), dqb.astype(acc)

  zeros = (jnp.zeros(kp.shape, acc), jnp.zeros(v.shape, acc), jnp.zeros((), acc))
  (dk, dv, dtau), dq = jax.lax.scan(
      block, zeros, (_query_blocks(q, bq), _query_blocks(bits, bq), _query_blocks(g, bq)))
  return _merge_blocks(dq, q.shape[1]), dk, dv, dtau


def _sparse_context(v, tau, idx, vals):
  p, _ = _kept_softmax(vals, tau)
  return jnp.einsum("...qj,...qjd->...qd", p, _gather(v, idx).astype(p.dtype)), p


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _context(score_fn, scale, q, kp, v, tau, idx, vals, bits, dense):
  if_dense = lambda: _dense_context_blocked(score_fn, q, kp, v, tau, bits)
  return jax.lax.cond(dense, if_dense, lambda: _sparse_context(v, tau, idx, vals)[0])


def _context_fwd(score_fn, scale, q, kp, v, tau, idx, vals, bits, dense):
  ctx = _context(score_fn, scale, q, kp, v, tau, idx, vals, bits, dense)
  return ctx, (q, kp, v, tau, idx, vals, bits, dense)


def _sparse_grads(scale, q, kp, v, tau, idx, vals, g):
  p, valid = _kept_softmax(vals, tau)
  g = g.astype(p.dtype)
  vg = _gather(v, idx).astype(p.dtype)  # [N, Tq, k, dv]
  dv = _scatter_add(v.shape[-2], idx, p[..., None] * g[..., None, :])
  dp = jnp.einsum("...qd,...qjd->...qj", g, vg)
  ds = p * (dp - jnp.sum(p * dp, axis=-1, keepdims=True))  # d loss / d (vals / tau)
  de = ds * (scale / tau)  # d loss / d (q . k) at the kept keys
  dq = jnp.einsum("...qj,...qjd->...qd", de, _gather(kp, idx).astype(p.dtype))
  dk = _scatter_add(kp.shape[-2], idx, de[..., None] * q.astype(p.dtype)[..., None, :])
  dtau = -jnp.sum(ds * jnp.where(valid, vals, 0.0)) / tau ** 2
  return dq, dk, dv, dtau


def _context_bwd(score_fn, scale, res, g):
  q, kp, v, tau, idx, vals, bits, dense = res

  grads = jax.lax.cond(dense, lambda: _dense_grads_blocked(score_fn, q, kp, v, tau, bits, g),
                       lambda: _sparse_grads(scale, q, kp, v, tau, idx, vals, g))
  dq, dk, dv, dtau = (x.astype(y.dtype) for x, y in zip(grads, (q, kp, v, tau)))
  return dq, dk, dv, dtau, None, None, None, None


_context.defvjp(_context_fwd, _context_bwd)


def gathering_pays(top_k: int, d: int, dv: int, Tk: int) -> bool:
  """Whether the kept keys' path costs less than the dense form: the k gathered keys and values
  of a query (k (d + dv) floats, kept for the backward pass and moved twice more there) against
  the Tk scores and weights a query the dense form holds. Measured in variant_costs' encoder
  (d = dv = 16, k = 32): at Tk = 256 (k (d + dv) = 4 Tk) the gathers made the step slower and
  its peak 2.3x global's; at Tk >= 1024 (<= Tk) the peak fell below global's. At d = 64,
  Tk = 1024 (4 Tk) the path was no faster and 1.5x the temporaries; at Tk = 2048 (2 Tk), 0.6x
  the time. Hence the bound 2 Tk."""
  return top_k * (d + dv) <= 2 * Tk


def kept_keys_attention(score_fn, scale: float, q, kp, v, e, mask, *, top_k: int, temperature):
  """Top-k softmax attention computed over the k kept keys (module docstring).

  score_fn: a dot-product score, e = scale * q . kp (`score_fn(None, q, kp)`).
  q: [..., Tq, d], kp: [..., Tk, d], v: [..., Tk, dv]; e: [..., Tq, Tk] = score_fn(None, q, kp),
  the scores already formed (only read to choose the keys: no gradient flows through them here);
  mask: bool [..., Tq, Tk]; temperature: divides the scores before the softmax.
  Returns (context [..., Tq, dv] in v's dtype, keep [..., Tq, Tk] bool: the keys the dense form
  keeps, for callers that form the dense weights).
  """
  lead = jnp.broadcast_shapes(q.shape[:-2], kp.shape[:-2], v.shape[:-2], mask.shape[:-2])
  Tq, Tk = e.shape[-2:]
  flat = lambda x: jnp.broadcast_to(x, lead + x.shape[-2:]).reshape((-1,) + x.shape[-2:])
  q, kp, v, e, mask = map(flat, (q, kp, v, e, mask))
  acc = accum_dtype(e)
  em = jax.lax.stop_gradient(jnp.where(mask, e, -jnp.inf)).astype(acc)  # [N, Tq, Tk]
  # The barrier keeps the top-k the TopK kernel rather than a full sort (attn.scopes.topk_scope).
  k = min(top_k, Tk)
  # One slot more than kept: a row keeps more than k keys (ties at its k-th) exactly when its
  # (k+1)-th valid score equals its k-th, so no pass over [Tq, Tk] is needed to tell.
  vals, idx = jax.lax.optimization_barrier(jax.lax.top_k(em, min(k + 1, Tk)))  # [N, Tq, k+1]
  if vals.shape[-1] > k:
    nxt = vals[..., k]
    dense = jnp.any((nxt > -jnp.inf) & (nxt == vals[..., k - 1]))
    vals, idx = vals[..., :k], idx[..., :k]
  else:  # every key fits in the slots
    dense = jnp.bool_(False)
  keep = mask & (e >= vals[..., -1:])
  tau = jnp.asarray(temperature, acc)
  ctx = _context(score_fn, float(scale), q, kp, v, tau, idx, vals,
                 masks_lib.pack_bits(keep), dense)
  return (ctx.astype(v.dtype).reshape(lead + (Tq, ctx.shape[-1])),
          keep.reshape(lead + (Tq, Tk)))
