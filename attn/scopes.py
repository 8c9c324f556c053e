"""Scopes: which source positions a query may attend to, and how they are reweighted.

A scope has the signature
    fn(params, q, e, mask, *, half_width=None, top_k=None, positions=None) -> (mask, gain)
with q: [..., Tq, dq], e: [..., Tq, Tk] scores, mask: bool [..., Tq, Tk] (already combined with
padding/causal masks). It returns the narrowed mask and an optional multiplicative gain
[..., Tq, Tk] applied to the weights after normalization (None for none). Scopes with parameters
have `init(key, dq, *, d_attn) -> params`.

`linear` is registered here too (full_attention=True): it replaces scoring and normalization.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from attn import masks as masks_lib
from attn.linear import linear_attention
from attn.precision import accum_dtype
from attn.registry import register
from attn.topk_sparse import gathering_pays, kept_keys_attention

_F32 = jnp.float32


def _need(scope, option, value):
  if value is None:
    raise ValueError(f"scope {scope!r} needs {option}=")
  if option in ("half_width", "top_k") and not value > 0:
    raise ValueError(f"scope {scope!r}: {option} must be positive, got {value}")
  return value


@register("scope", "global", fusable=True, all_pairs=True)
def global_scope(params, q, e, mask, *, half_width=None, top_k=None, positions=None):
  """Global attention: every (unmasked) source position."""
  return mask, None


@register("scope", "window", at_positions="local_m", banded=True)
def window_scope(params, q, e, mask, *, half_width=None, top_k=None, positions=None):
  """Sliding window: query i sees keys |j - i| <= half_width (self-attention locality)."""
  D = _need("window", "half_width", half_width)
  Tq, Tk = e.shape[-2:]
  return mask & masks_lib.sliding_window_mask(Tq, Tk, D), None


@register("scope", "local_m")
def local_m_scope(params, q, e, mask, *, half_width=None, top_k=None, positions=None):
  """Luong local-m: monotonic alignment p_t = t (or given `positions`), window [p_t - D, p_t + D]."""
  D = _need("local_m", "half_width", half_width)
  Tq, Tk = e.shape[-2:]
  centers = jnp.arange(Tq) if positions is None else positions  # [..., Tq]
  return mask & masks_lib.window_mask(centers, Tk, D), None


def init_local_p(key, dq, *, d_attn):
  k1, k2 = jax.random.split(key)
  lecun = jax.nn.initializers.lecun_normal()
  return {"W_p": lecun(k1, (dq, d_attn), _F32), "v_p": lecun(k2, (d_attn, 1), _F32)[:, 0]}


def local_p_positions(params, q, source_lengths):
  """Luong eq. 9: p_t = S * sigmoid(v_p^T tanh(W_p h_t)).

  q: [..., Tq, dq]; source_lengths: [..., Tq] or broadcastable, S per query row.
  Returns: [..., Tq] predicted positions in [0, S], in accum_dtype(q) (float64 for float64 q,
  so the window edge and the Gaussian below are float64-accurate too).
  """
  h = jnp.tanh(jnp.einsum("...qd,da->...qa", q, params["W_p"].astype(q.dtype),
                          preferred_element_type=accum_dtype(q)))
  return source_lengths * jax.nn.sigmoid(h @ params["v_p"])


@register("scope", "local_p", init=init_local_p)
def local_p_scope(params, q, e, mask, *, half_width=None, top_k=None, positions=None):
  """Luong local-p: predicted centre p_t, window |s - p_t| <= D, weights times a Gaussian (sigma=D/2).

  The window and the Gaussian are computed in p_t's dtype (accum_dtype(q)), not float32.
  """
  D = _need("local_p", "half_width", half_width)
  if params is None:
    raise ValueError("scope 'local_p' needs scope_params (see attn.init_scope('local_p', ...))")
  Tk = e.shape[-1]
  S = jnp.sum(mask, axis=-1).astype(accum_dtype(q))  # [..., Tq] valid source length per row
  p_t = local_p_positions(params, q, S)  # [..., Tq]
  return mask & masks_lib.window_mask(p_t, Tk, D), masks_lib.gaussian_window(p_t, Tk, D)


def _topk_kept_keys(score_fn, scale, q, kp, v, e, mask, *, top_k=None, temperature=1.0):
  """topk's own path over the k kept keys (attn.topk_sparse), where it is the cheaper; else None."""
  top_k = _need("topk", "top_k", top_k)
  if not gathering_pays(top_k, kp.shape[-1], v.shape[-1], e.shape[-1]):
    return None
  return kept_keys_attention(score_fn, scale, q, kp, v, e, mask, top_k=top_k,
                             temperature=temperature)


@register("scope", "topk", aliases=("sparse",), kept_keys=_topk_kept_keys)
def topk_scope(params, q, e, mask, *, half_width=None, top_k=None, positions=None):
  """Top-k sparse attention: each query keeps its k highest-scoring valid keys.

  Algorithm: kth = the k-th largest of where(mask, e, -inf) along each row (`lax.top_k` with
  k' = min(k, Tk), its last value; [..., Tq, 1]), and the mask narrowed to e >= kth. So every
  key tied with the k-th is kept (a row may keep more than k), a row with fewer than k valid
  keys keeps them all (kth = -inf), k >= Tk keeps every valid key, a row with none keeps none.
  The threshold is a constant to the gradient (the mask is piecewise constant in e): the
  gradient reaches e through the normalizer alone, at the kept keys.

  Cost: the top-k, O(Tq * Tk * log k') compares (XLA:CPU's TopK kernel, a partial sort of each
  row), plus the dense [..., Tq, Tk] scores and normalizer of global attention, which it
  narrows: the weights are sparse, the work is not, so it costs global attention's time plus
  the top-k, and its memory plus a mask of Tk / 8 bytes per query.
  """
  k = _need("topk", "top_k", top_k)
  em = jax.lax.stop_gradient(jnp.where(mask, e, -jnp.inf))  # [..., Tq, Tk]
  # The barrier keeps XLA from folding the slice of the k-th value into the top-k: on CPU
  # (jax 0.10.2) a top-k read other than through its leading [0:k] outputs is not matched to
  # the TopK kernel and runs as a stable full sort of every row, ~10-20x slower at Tk = 1024,
  # k = 32 (as in attn.decoding.beam).
  values, _ = jax.lax.optimization_barrier(jax.lax.top_k(em, min(k, e.shape[-1])))
  # e, not em (equal wherever mask holds): with em, the Transformer's cached decoding came
  # out wrong under XLA:CPU's backend level 0 without fusion emitters (the test suite's
  # flags; test_transformer.py::test_masks_cache_decoding_and_gradients), though the masks
  # printed equal: a miscompile under those flags only, not isolated further.
  keep = mask & (e >= values[..., -1:])  # [..., Tq, Tk]
  # Packed to bits and back: the backward pass needs the mask, and XLA would otherwise recompute
  # it from the scores, keeping every layer's [Tq, Tk] float scores alive until then (+30%
  # peak memory in the variant_costs encoder step at T = 1024); the words are Tk / 8 bytes.
  return masks_lib.unpack_bits(masks_lib.pack_bits(keep), e.shape[-1]), None


@register("scope", "linear", full_attention=True)
def linear_scope(q, k, v, mask=None, *, causal=False):
  """Linear attention (Katharopoulos et al. 2020), feature map elu(x) + 1; O(T) in sequence length."""
  return linear_attention(q, k, v, mask, causal=causal)
