"""Alignment scores e_ij between queries and keys.

A score is registered as two stages: an optional `prepare(params, k) -> k'` (key-side work, done
once per source; identity when absent) and `fn(params, q, k') -> e`. `attn.score` runs both. With
q: [..., Tq, dq], k: [..., Tk, dk],
e: [..., Tq, Tk] in the accumulation dtype (float32, or float64 for float64 inputs). Parameter-free
scores take params=None. Initializers have the signature
`init(key, dq, dk, *, d_attn=None, max_len=None) -> params`.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from attn.precision import accum_dtype
from attn.registry import register

_F32 = jnp.float32
_lecun = jax.nn.initializers.lecun_normal()


class ScoreCost(NamedTuple):
  """Matmul FLOPs of a score (a multiply-add counts 2): once per key (its `prepare`), once per
  query (query-side projections) and once per query-key pair (the score itself)."""
  per_key: int
  per_query: int
  per_pair: int


def _heads_last(x):  # [N, H, T, d] <-> [N, T, H, d], the kernels' layout
  return jnp.swapaxes(x, 1, 2)


def _dot_product_fused(scale_of):
  """Fused form of a dot-product score: kernels.attention with the score's scale folded into q."""

  def fused(params, q, kp, v, *, temperature, causal, key_lengths, target="auto"):
    del params
    import kernels  # pylint: disable=import-outside-toplevel  (attn/ imports without kernels/)
    # temperature may be traced while the kernel's scale is static: fold both into q.
    scale = scale_of(q.shape[-1]) / temperature
    ctx = kernels.attention(_heads_last((q * scale).astype(q.dtype)), _heads_last(kp),
                            _heads_last(v), key_lengths=key_lengths, causal=causal, scale=1.0,
                            target=target)
    return _heads_last(ctx)

  return fused


def _dot_cost(dq, dk, d_attn=None):
  del dk, d_attn
  return ScoreCost(per_key=0, per_query=0, per_pair=2 * dq)


def _check_same_dim(name, q, k):
  if q.shape[-1] != k.shape[-1]:
    raise ValueError(
        f"score {name!r} needs queries and keys of the same size, got dq={q.shape[-1]} and "
        f"dk={k.shape[-1]}; use 'general' or 'additive' for different sizes")


def _require(name, what, value):
  if value is None:
    raise ValueError(f"score {name!r} needs {what}")
  return value


def _unit_scale(d):
  del d
  return 1.0


def _inverse_sqrt(d):
  return d ** -0.5


@register("score", "dot", fused=_dot_product_fused(_unit_scale), cost=_dot_cost,
          dot_scale=_unit_scale)
def dot(params, q, k):
  """Luong dot: e_ij = q_i . k_j."""
  del params
  _check_same_dim("dot", q, k)
  return jnp.einsum("...qd,...kd->...qk", q, k, preferred_element_type=accum_dtype(q, k))


@register("score", "scaled_dot", fused=_dot_product_fused(_inverse_sqrt), cost=_dot_cost,
          dot_scale=_inverse_sqrt)
def scaled_dot(params, q, k):
  """Transformer scaled dot: e_ij = q_i . k_j / sqrt(d)."""
  del params
  _check_same_dim("scaled_dot", q, k)
  e = dot(None, q, k)
  return e / jnp.sqrt(jnp.asarray(q.shape[-1], e.dtype))


def init_general(key, dq, dk, *, d_attn=None, max_len=None):
  del d_attn, max_len
  return {"W": _lecun(key, (dq, dk), _F32)}


def general_keys(params, k):
  """k W^T: [..., Tk, dq], so the per-query work is a dot product."""
  return jnp.einsum("...ke,de->...kd", k, params["W"].astype(k.dtype),
                    preferred_element_type=accum_dtype(k))


def _general_cost(dq, dk, d_attn=None):
  del d_attn
  return ScoreCost(per_key=2 * dk * dq, per_query=0, per_pair=2 * dq)


@register("score", "general", init=init_general, aliases=("bilinear",), prepare=general_keys,
          cost=_general_cost)
def general(params, q, kp):
  """Luong general (bilinear): e_ij = q_i W k_j^T, W: [dq, dk]; kp = k W^T from general_keys."""
  acc = accum_dtype(q, kp)
  return jnp.einsum("...qd,...kd->...qk", q.astype(acc), kp.astype(acc))


def init_additive(key, dq, dk, *, d_attn=None, max_len=None):
  del max_len
  d_attn = _require("additive", "d_attn", d_attn)
  kw, ku, kv = jax.random.split(key, 3)
  return {"W": _lecun(kw, (dq, d_attn), _F32), "U": _lecun(ku, (dk, d_attn), _F32),
          "b": jnp.zeros((d_attn,), _F32), "v": _lecun(kv, (d_attn, 1), _F32)[:, 0]}


def additive_keys(params, k):
  """U k_j: [..., Tk, d_attn] (Bahdanau's precomputed key projection)."""
  return jnp.einsum("...kd,da->...ka", k, params["U"].astype(k.dtype),
                    preferred_element_type=accum_dtype(k))


def additive_fused(params, q, kp, v, *, temperature, causal, key_lengths, target="auto"):
  """kernels.additive_attention: the [Tq, Tk, d_attn] tanh tensor is never formed."""
  import kernels  # pylint: disable=import-outside-toplevel  (attn/ imports without kernels/)
  W, b = params["W"].astype(q.dtype), params["b"].astype(q.dtype)  # [H, dq, da], [H, da]
  qp = jnp.einsum("nhqd,hda->nhqa", q, W) + b[:, None, :]  # [N, H, Tq, da]
  ctx = kernels.additive_attention(
      _heads_last(qp), _heads_last(kp.astype(q.dtype)), (params["v"] / temperature).astype(q.dtype),
      _heads_last(v), key_lengths=key_lengths, causal=causal, target=target)
  return _heads_last(ctx)


def _additive_cost(dq, dk, d_attn=None):
  # per pair: the add and tanh of W q + U k, then v^T (one multiply-add per d_attn each)
  return ScoreCost(per_key=2 * dk * d_attn, per_query=2 * dq * d_attn, per_pair=4 * d_attn)


@register("score", "additive", init=init_additive, aliases=("concat",), prepare=additive_keys,
          fused=additive_fused, cost=_additive_cost, additive_keys=True)
def additive(params, q, kp):
  """Bahdanau additive (Luong concat): e_ij = v^T tanh(W q_i + U k_j + b); kp = U k from additive_keys.

  Materializes a [..., Tq, Tk, d_attn] tensor; `kernels.additive_attention` is the fused form.
  """
  acc = accum_dtype(q, kp)
  qp = jnp.einsum("...qd,da->...qa", q, params["W"].astype(q.dtype), preferred_element_type=acc)
  h = jnp.tanh(qp[..., :, None, :] + kp.astype(acc)[..., None, :, :] + params["b"])  # [..., Tq, Tk, da]
  return jnp.einsum("...qka,a->...qk", h, params["v"].astype(acc))


def init_location(key, dq, dk, *, d_attn=None, max_len=None):
  del dk, d_attn
  max_len = _require("location", "max_len (the longest source it will score)", max_len)
  return {"W": _lecun(key, (dq, max_len), _F32)}


def _location_cost(dq, dk, d_attn=None):
  del dk, d_attn  # the used columns of W_a: one dq-vector product per source position
  return ScoreCost(per_key=0, per_query=0, per_pair=2 * dq)


@register("score", "location", init=init_location, cost=_location_cost, positional=True)
def location(params, q, k):
  """Luong location: e_t = W_a h_t over source positions, from the query alone. W: [dq, max_len]."""
  Tk, max_len = k.shape[-2], params["W"].shape[-1]
  if Tk > max_len:
    raise ValueError(f"score 'location' was initialized for sources up to max_len={max_len}, "
                     f"got Tk={Tk}")
  e = jnp.einsum("...qd,dl->...ql", q, params["W"].astype(q.dtype),
                 preferred_element_type=accum_dtype(q))
  e = e[..., :Tk]  # [..., Tq, Tk]
  return jnp.broadcast_to(e, jnp.broadcast_shapes(e.shape, k.shape[:-2] + (1, Tk)))
