"""Normalizers: scores -> attention weights along the key axis.

Every normalizer here has the signature `fn(z, mask) -> weights` with z: [..., Tq, Tk] in the
accumulation dtype (float32, or float64 for float64 scores; already divided by the temperature)
and mask: bool broadcast to z's shape. Contract:
- masked positions get exactly 0;
- a row with no valid position is all zeros, and its gradient is zero (never NaN, never uniform);
- computation is in z's dtype: float32 whatever the input dtype, float64 for float64 scores.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from attn.registry import register


def _neg(z):
  """The most negative finite value of z's dtype: a filler below every valid score. (A float32
  filler would sit above float64 scores under -3.4e38, e.g. at a small temperature, and make
  the row max -- hence every weight of the row -- wrong.)"""
  return jnp.finfo(z.dtype).min


def _row_max(z, mask):
  """Max over valid entries ([..., 1]); finite for fully masked rows. Shift only, so no gradient."""
  return jax.lax.stop_gradient(jnp.max(jnp.where(mask, z, _neg(z)), axis=-1, keepdims=True))


@register("normalizer", "softmax", fusable=True)
def softmax(z, mask):
  """Softmax over valid keys; exact zeros elsewhere."""
  ex = jnp.where(mask, jnp.exp(jnp.where(mask, z, _neg(z)) - _row_max(z, mask)), 0.0)  # [..., Tq, Tk]
  denom = jnp.sum(ex, axis=-1, keepdims=True)
  return ex / jnp.where(denom > 0, denom, 1.0)


def _sorted_valid(z, mask):
  """Valid scores sorted descending, invalid ranks zeroed; plus ranks k and the valid-rank mask.

  Returns z_sorted: [..., Tk] (zeros past the number of valid entries), k: [Tk] float 1..Tk,
  valid_rank: [..., Tk] bool.
  """
  n_valid = jnp.sum(mask, axis=-1, keepdims=True)  # [..., 1]
  z_sorted = -jnp.sort(-jnp.where(mask, z, -jnp.inf), axis=-1)
  k = jnp.arange(1, z.shape[-1] + 1, dtype=z.dtype)
  valid_rank = k <= n_valid
  # Zero the -inf tail so cumulative sums stay finite; those ranks never enter the support.
  return jnp.where(valid_rank, z_sorted, 0.0), k, valid_rank


def _take_rank(x, k_star):
  """x[..., k_star - 1] along the last axis, for k_star >= 0 ([..., 1]); rank 0 reads index 0."""
  return jnp.take_along_axis(x, jnp.maximum(k_star, 1) - 1, axis=-1)


@jax.custom_jvp
def _sparsemax(z, mask):
  # Martins & Astudillo (2016), Algorithm 1: the support is the largest k with
  # 1 + k z_(k) > sum_{j<=k} z_(j); tau = (sum_{j<=k*} z_(j) - 1) / k*.
  z = z - _row_max(z, mask)
  z_sorted, k, valid_rank = _sorted_valid(z, mask)
  cums = jnp.cumsum(z_sorted, axis=-1)
  support = valid_rank & (1.0 + k * z_sorted > cums)
  k_star = jnp.sum(support, axis=-1, keepdims=True)
  tau = (_take_rank(cums, k_star) - 1.0) / jnp.maximum(k_star, 1).astype(z.dtype)
  return jnp.where(mask, jnp.maximum(z - tau, 0.0), 0.0)


@_sparsemax.defjvp
def _sparsemax_jvp(primals, tangents):
  z, mask = primals
  dz, _ = tangents
  p = _sparsemax(z, mask)
  # Jacobian (Martins & Astudillo eq. 12): diag(s) - s s^T / |S|, s the support indicator.
  s = (p > 0).astype(z.dtype)
  size = jnp.maximum(jnp.sum(s, axis=-1, keepdims=True), 1.0)
  dp = s * (dz - jnp.sum(s * dz, axis=-1, keepdims=True) / size)
  return p, dp


@register("normalizer", "sparsemax")
def sparsemax(z, mask):
  """Sparsemax (Martins & Astudillo 2016): Euclidean projection onto the simplex."""
  return _sparsemax(z, mask)


@jax.custom_jvp
def _entmax15(z, mask):
  # Peters, Niculae & Martins (2019), exact sort-based 1.5-entmax: p = [z/2 - tau]_+^2.
  z = (z - _row_max(z, mask)) / 2.0
  z_sorted, k, valid_rank = _sorted_valid(z, mask)
  mean = jnp.cumsum(z_sorted, axis=-1) / k
  mean_sq = jnp.cumsum(z_sorted * z_sorted, axis=-1) / k
  ss = k * (mean_sq - mean * mean)
  delta = (1.0 - ss) / k
  tau = mean - jnp.sqrt(jnp.maximum(delta, 0.0))
  support = valid_rank & (tau <= z_sorted)
  k_star = jnp.sum(support, axis=-1, keepdims=True)
  tau_star = _take_rank(tau, k_star)
  p = jnp.square(jnp.maximum(z - tau_star, 0.0))
  return jnp.where(mask & (k_star > 0), p, 0.0)


@_entmax15.defjvp
def _entmax15_jvp(primals, tangents):
  z, mask = primals
  dz, _ = tangents
  p = _entmax15(z, mask)
  # Jacobian diag(g) - g g^T / sum(g) with g = sqrt(p) (Peters et al. 2019, Prop. 1 at alpha=1.5).
  g = jnp.sqrt(p)
  gsum = jnp.sum(g, axis=-1, keepdims=True)
  dp = g * dz
  dp = dp - g * jnp.sum(dp, axis=-1, keepdims=True) / jnp.where(gsum > 0, gsum, 1.0)
  return p, dp


@register("normalizer", "entmax15")
def entmax15(z, mask):
  """1.5-entmax (Peters et al. 2019): sparse like sparsemax, smooth like softmax."""
  return _entmax15(z, mask)
