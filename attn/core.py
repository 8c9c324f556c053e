"""attend(): score -> scope -> normalizer -> weighted sum, every stage looked up by name.

Shapes: q: [..., Tq, dq], k: [..., Tk, dk], v: [..., Tk, dv]; mask bool broadcastable to
[..., Tq, Tk], True = may attend. Leading dims are any batch/head dims.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from attn import masks as masks_lib
from attn import normalizers as _normalizers  # noqa: F401  (registers the normalizers)
from attn import scopes as _scopes  # noqa: F401  (registers the scopes)
from attn import scores as _scores  # noqa: F401  (registers the scores)
from attn.precision import accum_dtype
from attn.registry import get


def init_score(name, key, dq, dk, *, d_attn=None, max_len=None):
  """Parameters of score `name` (None for parameter-free scores)."""
  variant = get(name, "score")
  if variant.init is None:
    return None
  return variant.init(key, dq, dk, d_attn=d_attn, max_len=max_len)


def init_scope(name, key, dq, *, d_attn=None):
  """Parameters of scope `name` (None for parameter-free scopes such as global or window)."""
  variant = get(name, "scope")
  if variant.init is None:
    return None
  if d_attn is None:
    raise ValueError(f"scope {name!r} needs d_attn to initialize its parameters")
  return variant.init(key, dq, d_attn=d_attn)


def prepare_keys(name, params, k):
  """The key-side part of score `name` (e.g. U k for additive), to compute once per source and
  pass to attend(..., keys_prepared=True). Identity for scores with nothing to precompute."""
  variant = get(name, "score")
  return k if variant.prepare is None else variant.prepare(params, k)


@functools.partial(jax.jit, static_argnums=0)
def score(name, params, q, k):
  """Scores e: [..., Tq, Tk] (float32, or float64 for float64 inputs) of the registered score."""
  return get(name, "score").fn(params, q, prepare_keys(name, params, k))


def _full_mask(mask, shape):
  if mask is None:
    return jnp.ones(shape, bool)
  mask = jnp.asarray(mask)
  if mask.dtype != jnp.bool_:
    raise ValueError(f"mask must be boolean (True = may attend), got dtype {mask.dtype}")
  try:
    return jnp.broadcast_to(mask, shape)
  except ValueError:
    raise ValueError(f"mask of shape {mask.shape} does not broadcast to scores {shape}") from None


@functools.partial(jax.jit, static_argnames=("kind",))
def normalize(e, mask=None, kind="softmax", temperature=1.0):
  """Weights from scores along the last axis.

  e: [..., Tq, Tk]; mask: bool broadcastable to e, True = may attend.
  temperature divides the scores first: -> 0 approaches a (hard) argmax, large flattens.
  Returns weights [..., Tq, Tk] in float32 (float64 for float64 scores): masked entries exactly 0; a row with no valid entry is
  all zeros with zero gradient.
  """
  acc = accum_dtype(e)
  z = e.astype(acc) / jnp.asarray(temperature, acc)
  return get(kind, "normalizer").fn(z, _full_mask(mask, z.shape))


def _check_qkv(q, k, v):
  if k.shape[-2] != v.shape[-2]:  # k may be prepared (other feature size), never another length
    raise ValueError(f"keys and values disagree on Tk: k {k.shape} vs v {v.shape}")
  if q.ndim < 2 or k.ndim < 2:
    raise ValueError(f"q and k need at least [T, d], got q {q.shape}, k {k.shape}")


def _fused_attend(params, q, k, v, *, score, temperature, causal, key_lengths, keys_prepared):
  """attend() through the fused kernels: no [Tq, Tk] (or [Tq, Tk, d_attn]) tensor is formed."""
  import kernels  # pylint: disable=import-outside-toplevel  (attn/ imports without kernels/)
  lead = jnp.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
  flat = lambda x: jnp.broadcast_to(x, lead + x.shape[-2:]).reshape((-1,) + x.shape[-2:])[:, :, None]
  if key_lengths is not None:
    key_lengths = jnp.broadcast_to(key_lengths, lead).reshape(-1).astype(jnp.int32)
  kp = k if keys_prepared else prepare_keys(score, params, k)
  if score == "additive":
    qp = jnp.einsum("...qd,da->...qa", q, params["W"].astype(q.dtype)) + params["b"].astype(q.dtype)
    ctx = kernels.additive_attention(flat(qp), flat(kp.astype(q.dtype)),
                                     (params["v"] / temperature)[None].astype(q.dtype), flat(v),
                                     key_lengths=key_lengths, causal=causal)
  else:
    # Temperature may be traced; the kernel's scale is static, so fold both into q.
    scale = (1.0 if score == "dot" else q.shape[-1] ** -0.5) / temperature
    ctx = kernels.attention(flat((q * scale).astype(q.dtype)), flat(kp), flat(v),
                            key_lengths=key_lengths, causal=causal, scale=1.0)
  return ctx[:, :, 0].reshape(lead + ctx.shape[1:2] + ctx.shape[-1:]), None


FUSED_SCORES = ("dot", "scaled_dot", "additive")


@functools.partial(jax.jit, static_argnames=("score", "normalizer", "scope", "causal",
                                             "half_width", "top_k", "keys_prepared", "fused"))
def attend(params, q, k, v, *, score="dot", normalizer="softmax", mask=None, temperature=1.0,
           causal=False, scope="global", scope_params=None, half_width=None, top_k=None,
           positions=None, keys_prepared=False, key_lengths=None, fused=False):
  """Attention over keys with a named score, normalizer and scope.

  params: the score's parameters (None for dot / scaled_dot).
  q: [..., Tq, dq], k: [..., Tk, dk], v: [..., Tk, dv]; mask: bool broadcastable to [..., Tq, Tk].
  causal: query i sees keys j <= i (top-left aligned).
  scope: "global", "window" / "local_m" (half_width, positions), "local_p" (scope_params,
    half_width), "topk" (top_k), "linear".
  Returns (context [..., Tq, dv] in v's dtype, weights [..., Tq, Tk] float32). context is
  weights @ v accumulated in float32; a query with no valid key gets zero weights and context.
  Linear attention returns weights=None (it never forms them).
  keys_prepared: k is already `prepare_keys(score, params, k)` (decoders do this once per source).
  key_lengths: [...] valid keys per sequence (a padding mask; combined with `mask`).
  fused: run the fused kernel (kernels.attention for dot/scaled_dot, kernels.additive_attention
    for additive): O(T) memory, weights=None. Needs softmax, the global scope and padding given
    as key_lengths (mask=None); the same zero context for rows with no valid key.
  """
  _check_qkv(q, k, v)
  if fused:
    if score not in FUSED_SCORES or normalizer != "softmax" or scope != "global" or mask is not None:
      raise ValueError(
          f"fused=True supports scores {FUSED_SCORES} with normalizer='softmax', scope='global' and "
          f"padding as key_lengths (no mask); got score={score!r}, normalizer={normalizer!r}, "
          f"scope={scope!r}, mask={'given' if mask is not None else None}")
    return _fused_attend(params, q, k, v, score=score, temperature=temperature, causal=causal,
                         key_lengths=key_lengths, keys_prepared=keys_prepared)
  if key_lengths is not None:
    mask = masks_lib.combine(mask, masks_lib.lengths_to_mask(key_lengths, k.shape[-2])[..., None, :])
  scope_variant = get(scope, "scope")
  if scope_variant.full_attention:
    # Its feature map replaces the score and the softmax; refuse choices it would silently drop.
    if normalizer != "softmax" or get(score, "score").init is not None:
      raise ValueError(f"scope {scope!r} has its own similarity (feature map): use a "
                       f"parameter-free score and normalizer='softmax', got {score!r}/{normalizer!r}")
    return scope_variant.fn(q, k, v, mask, causal=causal)
  kp = k if keys_prepared else prepare_keys(score, params, k)
  e = get(score, "score").fn(params, q, kp)  # [..., Tq, Tk]
  m = _full_mask(mask, e.shape)
  if causal:
    m = m & masks_lib.causal_mask(*e.shape[-2:])
  m, gain = scope_variant.fn(scope_params, q, e, m, half_width=half_width, top_k=top_k,
                             positions=positions)
  w = normalize(e, m, kind=normalizer, temperature=temperature)
  if gain is not None:
    w = w * gain
  ctx = jnp.einsum("...qk,...kd->...qd", w, v.astype(w.dtype))
  return ctx.astype(v.dtype), w
