"""Linear attention (Katharopoulos et al. 2020, "Transformers are RNNs").

sim(q, k) = phi(q) . phi(k) with phi(x) = elu(x) + 1 > 0, so
    out_i = phi(q_i)^T (sum_j phi(k_j) v_j^T) / (phi(q_i)^T sum_j phi(k_j))      (eq. 5)
costs O(T d dv) instead of O(Tq Tk). The causal form replaces the sums by prefix sums (eq. 8-9).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from attn.precision import accum_dtype


def feature_map(x):
  """phi(x) = elu(x) + 1, in the accumulation dtype (float32 or float64)."""
  return jax.nn.elu(x.astype(accum_dtype(x))) + 1.0


def _key_mask(mask, Tk):
  """Reduces a mask broadcastable to [..., Tq, Tk] to a key mask [..., Tk]; refuses per-query masks."""
  mask = jnp.asarray(mask)
  if mask.ndim < 2 or mask.shape[-2] != 1 or mask.shape[-1] not in (1, Tk):
    raise ValueError(
        "linear attention takes only key-padding masks of shape [..., 1, Tk] (plus causal=True); "
        f"got a mask of shape {mask.shape}")
  return jnp.broadcast_to(mask[..., 0, :], mask.shape[:-2] + (Tk,))


def linear_attention(q, k, v, mask=None, *, causal=False):
  """Linear attention with the elu+1 feature map.

  q: [..., Tq, d], k: [..., Tk, d], v: [..., Tk, dv]; mask: key mask broadcastable to
  [..., 1, Tk] or None. causal: query i sees keys j <= i (top-left aligned).
  Returns (context [..., Tq, dv] in v's dtype, None) — the weights are never formed.
  A query with no valid key gets a zero context.
  """
  if q.shape[-1] != k.shape[-1]:
    raise ValueError(f"linear attention needs dq == dk, got {q.shape[-1]} and {k.shape[-1]}")
  Tq, Tk = q.shape[-2], k.shape[-2]
  phq, phk = feature_map(q), feature_map(k)  # [..., Tq, d], [..., Tk, d]
  if mask is not None:
    phk = phk * _key_mask(mask, Tk)[..., None].astype(phk.dtype)
  vf = v.astype(phk.dtype)
  if not causal:
    kv = jnp.einsum("...kd,...ke->...de", phk, vf)  # [..., d, dv]
    num = jnp.einsum("...qd,...de->...qe", phq, kv)  # [..., Tq, dv]
    den = jnp.einsum("...qd,...d->...q", phq, jnp.sum(phk, axis=-2))  # [..., Tq]
  else:
    # Prefix sums S_i = sum_{j<=i} phi(k_j) v_j^T and z_i = sum_{j<=i} phi(k_j) (eq. 9).
    S = jnp.cumsum(phk[..., :, :, None] * vf[..., :, None, :], axis=-3)  # [..., Tk, d, dv]
    z = jnp.cumsum(phk, axis=-2)  # [..., Tk, d]
    last = jnp.minimum(jnp.arange(Tq), Tk - 1)  # the last key query i may see
    num = jnp.einsum("...qd,...qde->...qe", phq, jnp.take(S, last, axis=-3))
    den = jnp.einsum("...qd,...qd->...q", phq, jnp.take(z, last, axis=-2))
  ctx = num / jnp.where(den > 0, den, 1.0)[..., None]
  return ctx.astype(v.dtype), None
