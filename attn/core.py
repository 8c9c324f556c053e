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
from attn import registry
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
  Returns weights [..., Tq, Tk] in float32 (float64 for float64 scores): masked entries exactly 0;
  a row with no valid entry is all zeros with zero gradient.
  """
  acc = accum_dtype(e)
  z = e.astype(acc) / jnp.asarray(temperature, acc)
  return get(kind, "normalizer").fn(z, _full_mask(mask, z.shape))


def _check_qkv(q, k, v):
  if k.shape[-2] != v.shape[-2]:  # k may be prepared (other feature size), never another length
    raise ValueError(f"keys and values disagree on Tk: k {k.shape} vs v {v.shape}")
  if q.ndim < 2 or k.ndim < 2:
    raise ValueError(f"q and k need at least [T, d], got q {q.shape}, k {k.shape}")


def _quoted(kind):
  """The variants of `kind` fused attention stands in for, as "'a'" or "'a' or 'b'"."""
  return " or ".join(repr(n) for n in registry.fusable(kind))


def fused_unsupported(score, normalizer="softmax", scope="global", mask=None) -> str | None:
  """Why attend(fused=True) cannot run this variant (None when it can): the kernels fuse
  score -> softmax -> weighted sum over all keys, with padding given as lengths."""
  fused_scores = registry.with_fused("score")
  if (get(score, "score").fused is None or not get(normalizer, "normalizer").fusable
      or not get(scope, "scope").fusable or mask is not None):
    return (f"fused attention supports scores {', '.join(fused_scores)} with normalizer="
            f"{_quoted('normalizer')}, scope={_quoted('scope')} and padding as key_lengths (no "
            f"mask); got score={score!r}, normalizer={normalizer!r}, scope={scope!r}"
            + (", a mask" if mask is not None else ""))
  return None


def fused_target(fused) -> str:
  """The kernel target of a truthy `fused` argument: True -> "auto", a target name -> itself
  (`kernels.targets`; unknown names fail there with the known ones)."""
  return "auto" if fused is True else str(fused)


def fused_heads(score, params, q, kp, v, *, temperature=1.0, causal=False, key_lengths=None,
                target="auto"):
  """Score `score`'s fused kernel over all heads in one call (no [Tq, Tk] tensor is formed).

  q: [..., H, Tq, dq], kp: [..., H, Tk, dk'] (prepared keys), v: [..., H, Tk, dv]; params
  stacked on a leading H axis (or None); key_lengths: [...] valid keys, shared by the heads.
  target: the kernel target ("auto": the platform's).
  Returns context [..., H, Tq, dv]; a query with no valid key gets a zero context.
  """
  lead = jnp.broadcast_shapes(q.shape[:-3], kp.shape[:-3], v.shape[:-3])
  flat = lambda x: jnp.broadcast_to(x, lead + x.shape[-3:]).reshape((-1,) + x.shape[-3:])
  if key_lengths is not None:
    key_lengths = jnp.broadcast_to(key_lengths, lead).reshape(-1).astype(jnp.int32)
  extra = {} if target == "auto" else {"target": target}
  ctx = get(score, "score").fused(params, flat(q), flat(kp), flat(v), temperature=temperature,
                                  causal=causal, key_lengths=key_lengths, **extra)  # [N, H, Tq, dv]
  return ctx.reshape(lead + ctx.shape[1:])


@functools.partial(jax.jit, static_argnames=("score", "normalizer", "scope", "causal",
                                             "half_width", "top_k", "keys_prepared", "fused",
                                             "return_scores"))
def attend(params, q, k, v, *, score="dot", normalizer="softmax", mask=None, temperature=1.0,
           causal=False, scope="global", scope_params=None, half_width=None, top_k=None,
           positions=None, keys_prepared=False, key_lengths=None, fused=False,
           return_scores=False, bias=None):
  """Attention over keys with a named score, normalizer and scope.

  params: the score's parameters (None for dot / scaled_dot).
  q: [..., Tq, dq], k: [..., Tk, dk], v: [..., Tk, dv]; mask: bool broadcastable to [..., Tq, Tk].
  causal: query i sees keys j <= i (top-left aligned).
  scope: "global", "window" / "local_m" (half_width, positions), "local_p" (scope_params,
    half_width), "topk" (top_k), "linear".
  Returns (context [..., Tq, dv] in v's dtype, weights [..., Tq, Tk] in the accumulation dtype:
  float32, float64 for float64 inputs). context is weights @ v accumulated in that dtype; a query
  with no valid key gets zero weights and context.
  Linear attention returns weights=None (it never forms them).
  keys_prepared: k is already `prepare_keys(score, params, k)` (decoders do this once per source).
  key_lengths: [...] valid keys per sequence (a padding mask; combined with `mask`).
  fused: run the score's fused kernel (registry entry `fused`: kernels.attention for
    dot/scaled_dot, kernels.additive_attention for additive): O(T) memory, weights=None. True
    runs kernel target "auto"; a target name (`kernels.targets`, e.g. "triton") runs that one. Needs softmax, the global scope and padding given
    as key_lengths (mask=None); the same zero context for rows with no valid key.
  return_scores: also return the raw scores e [..., Tq, Tk] (before the temperature and the
    normalizer; -inf where the mask, causality or the scope forbid attending), so that
    weights == normalize(e, isfinite(e), normalizer, temperature) (times the scope's gain, for
    local_p). None where no score is formed (linear scope, fused).
  bias: optional additive bias broadcastable to [..., Tq, Tk], added to the scores before the
    scope and the normalizer (a position bias such as ALiBi); the returned raw scores include
    it. The fused kernels and linear attention form no scores to add it to: refused there.
  """
  out = _attend(params, q, k, v, score=score, normalizer=normalizer, mask=mask,
                temperature=temperature, causal=causal, scope=scope, scope_params=scope_params,
                half_width=half_width, top_k=top_k, positions=positions,
                keys_prepared=keys_prepared, key_lengths=key_lengths, fused=fused, bias=bias)
  return out if return_scores else out[:2]


def _attend(params, q, k, v, *, score, normalizer, mask, temperature, causal, scope,
            scope_params, half_width, top_k, positions, keys_prepared, key_lengths, fused,
            bias=None):
  """attend() returning (context, weights, raw scores)."""
  _check_qkv(q, k, v)
  if bias is not None and (fused or get(scope, "scope").full_attention):
    raise ValueError("a score bias needs the scores formed; fused attention and scope "
                     f"{scope!r} never form them")
  if fused:
    why = fused_unsupported(score, normalizer, scope, mask)
    if why:
      raise ValueError(why)
    kp = k if keys_prepared else prepare_keys(score, params, k)
    one_head = lambda x: x[..., None, :, :]  # [..., 1, T, d]
    params = jax.tree.map(lambda p: p[None], params)  # a leading H = 1 axis
    ctx = fused_heads(score, params, one_head(q), one_head(kp), one_head(v),
                      temperature=temperature, causal=causal, key_lengths=key_lengths,
                      target=fused_target(fused))
    return ctx[..., 0, :, :], None, None
  if key_lengths is not None:
    mask = masks_lib.combine(mask, masks_lib.lengths_to_mask(key_lengths, k.shape[-2])[..., None, :])
  scope_variant = get(scope, "scope")
  if scope_variant.full_attention:
    # Its feature map replaces the score and the softmax; refuse choices it would silently drop.
    if not get(normalizer, "normalizer").fusable or get(score, "score").init is not None:
      raise ValueError(f"scope {scope!r} has its own similarity (feature map): use a "
                       f"parameter-free score and normalizer={_quoted('normalizer')}, got "
                       f"{score!r}/{normalizer!r}")
    return (*scope_variant.fn(q, k, v, mask, causal=causal), None)
  kp = k if keys_prepared else prepare_keys(score, params, k)
  e = get(score, "score").fn(params, q, kp)  # [..., Tq, Tk]
  if bias is not None:
    e = e + jnp.asarray(bias).astype(e.dtype)
  m = _full_mask(mask, e.shape)
  if causal:
    m = m & masks_lib.causal_mask(*e.shape[-2:])
  score_variant = get(score, "score")
  if (scope_variant.kept_keys is not None and score_variant.dot_scale is not None
      and get(normalizer, "normalizer").fusable and bias is None and jnp.ndim(temperature) == 0):
    # The scope attends over its few kept keys itself; the dense weights below are formed only
    # for a caller that reads them (under jit, unread, they are never computed).
    kept = scope_variant.kept_keys(score_variant.fn, score_variant.dot_scale(q.shape[-1]),
                                   q, kp, v, e, m, top_k=top_k, temperature=temperature)
    if kept is not None:  # None: at these shapes the dense form is the cheaper
      ctx, keep = kept
      w = normalize(e, keep, kind=normalizer, temperature=temperature)
      return ctx, w, jnp.where(keep, e.astype(w.dtype), -jnp.inf)
  m, gain = scope_variant.fn(scope_params, q, e, m, half_width=half_width, top_k=top_k,
                             positions=positions)
  w = normalize(e, m, kind=normalizer, temperature=temperature)
  if gain is not None:
    w = w * gain
  ctx = jnp.einsum("...qk,...kd->...qd", w, v.astype(w.dtype))
  return ctx.astype(v.dtype), w, jnp.where(m, e.astype(w.dtype), -jnp.inf)
