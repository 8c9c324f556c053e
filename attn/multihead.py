"""Multi-head attention on top of attend(): project, split heads, attend, merge (Vaswani et al. 2017).

Axis names: B batch (any leading dims), Tq/Tk lengths, H heads, dh head size.
Params: wq [d_q, H, dh], wk/wv [d_kv, H, dh], wo [H, dh, d_out]; per-head score and scope
parameters stacked on a leading H axis.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from attn import core
from attn.precision import accum_dtype

_F32 = jnp.float32


def init_multihead(key, d_model, num_heads, *, d_kv=None, d_head=None, d_out=None,
                   score="scaled_dot", d_attn=None, max_len=None, scope="global"):
  """Parameters for multihead(). d_kv defaults to d_model (self-attention), d_head to
  d_model // num_heads, d_out to d_model; d_attn/max_len feed scores and scopes that need them."""
  d_kv = d_model if d_kv is None else d_kv
  d_out = d_model if d_out is None else d_out
  if d_head is None:
    if d_model % num_heads:
      raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}; pass d_head")
    d_head = d_model // num_heads
  kq, kk, kv, ko, ks, kp = jax.random.split(key, 6)
  init = jax.nn.initializers.lecun_normal(in_axis=0, out_axis=(1, 2))
  out_init = jax.nn.initializers.lecun_normal(in_axis=(0, 1), out_axis=2)
  params = {
      "wq": init(kq, (d_model, num_heads, d_head), _F32),
      "wk": init(kk, (d_kv, num_heads, d_head), _F32),
      "wv": init(kv, (d_kv, num_heads, d_head), _F32),
      "wo": out_init(ko, (num_heads, d_head, d_out), _F32),
  }
  heads = jnp.arange(num_heads)
  score_params = jax.vmap(lambda h: core.init_score(
      score, jax.random.fold_in(ks, h), d_head, d_head, d_attn=d_attn, max_len=max_len))(heads)
  if score_params is not None:
    params["score"] = score_params
  scope_params = jax.vmap(lambda h: core.init_scope(
      scope, jax.random.fold_in(kp, h), d_head, d_attn=d_attn or d_head))(heads)
  if scope_params is not None:
    params["scope"] = scope_params
  return params


@functools.partial(jax.jit, static_argnames=("num_heads", "score", "normalizer", "causal", "scope",
                                             "half_width", "top_k", "fused"))
def multihead(params, x_q, x_kv=None, *, num_heads, score="scaled_dot", normalizer="softmax",
              mask=None, causal=False, temperature=1.0, scope="global", half_width=None,
              top_k=None, key_lengths=None, fused=False):
  """Multi-head attention.

  x_q: [..., Tq, d_model]; x_kv: [..., Tk, d_kv], or None for self-attention (x_kv = x_q).
  mask: bool broadcastable to [..., Tq, Tk] (shared by all heads); causal: top-left aligned.
  key_lengths: [...] valid keys per sequence (padding; combined with mask).
  fused: all heads through the score's fused kernel in one call: O(T) memory for long
    sequences, weights=None; needs padding as key_lengths rather than a mask. True runs kernel
    target "auto", a target name (`kernels.targets`) that target.
  Projections, scores, softmaxes and the output projection accumulate in accum_dtype: float32,
  or float64 for float64 inputs (which stay float64-accurate end to end).
  Returns (out [..., Tq, d_out] in x_q's dtype, weights [..., H, Tq, Tk] per head in the
  accumulation dtype; None for linear attention and fused=True).
  """
  x_kv = x_q if x_kv is None else x_kv
  if params["wq"].shape[1] != num_heads:
    raise ValueError(f"params were built for {params['wq'].shape[1]} heads, got num_heads={num_heads}")
  for name, x, w in (("x_q", x_q, params["wq"]), ("x_kv", x_kv, params["wk"])):
    if x.shape[-1] != w.shape[0]:
      raise ValueError(f"{name} has feature size {x.shape[-1]}, params expect {w.shape[0]}")
  # Accumulate in accum_dtype(x) (float64 for float64 x: a float32 accumulator would make the
  # cast back a mere relabelling of float32-accurate values), then return to x's dtype.
  proj = lambda x, w: jnp.einsum("...td,dhe->...hte", x, w.astype(x.dtype),
                                 preferred_element_type=accum_dtype(x)).astype(x.dtype)
  q, k, v = proj(x_q, params["wq"]), proj(x_kv, params["wk"]), proj(x_kv, params["wv"])  # [..., H, T, dh]
  score_params, scope_params = params.get("score"), params.get("scope")

  head_axis = lambda p: None if p is None else 0  # per-head parameters: a leading H axis
  if fused:
    # All heads in one kernel call (the kernels' own head axis), not a vmap of H = 1 calls.
    why = core.fused_unsupported(score, normalizer, scope, mask)
    if why:
      raise ValueError(why)
    kp = jax.vmap(functools.partial(core.prepare_keys, score), in_axes=(head_axis(score_params), -3),
                  out_axes=-3)(score_params, k)
    ctx = core.fused_heads(score, score_params, q, kp, v, temperature=temperature, causal=causal,
                           key_lengths=key_lengths,
                           target=core.fused_target(fused))  # [..., H, Tq, dh]
    w = None
  elif (score_params is None and scope_params is None
        and core.get(scope, "scope").kept_keys is not None):
    # The heads as a batch axis, not a vmap: the scope's own path decides per call whether a
    # tie sends it to the dense form (lax.cond), and a vmap would run both branches.
    ctx, w = core.attend(None, q, k, v, score=score, normalizer=normalizer,
                         mask=None if mask is None else jnp.asarray(mask)[..., None, :, :],
                         temperature=temperature, causal=causal, scope=scope,
                         half_width=half_width, top_k=top_k,
                         key_lengths=None if key_lengths is None
                         else jnp.asarray(key_lengths)[..., None])
  else:
    def one_head(sp, cp, q, k, v, mask):
      return core.attend(sp, q, k, v, score=score, normalizer=normalizer, mask=mask,
                         temperature=temperature, causal=causal, scope=scope, scope_params=cp,
                         half_width=half_width, top_k=top_k, key_lengths=key_lengths)

    # Heads are vmapped (axis -3) so per-head score/scope parameters stay a leading H axis.
    ctx, w = jax.vmap(
        one_head,
        in_axes=(head_axis(score_params), head_axis(scope_params), -3, -3, -3, None),
        out_axes=-3,  # the mask is shared by every head
    )(score_params, scope_params, q, k, v, mask)  # ctx [..., H, Tq, dh], w [..., H, Tq, Tk]
  out = jnp.einsum("...hte,hed->...td", ctx, params["wo"].astype(ctx.dtype),
                   preferred_element_type=accum_dtype(ctx))  # [..., Tq, d_out]
  return out.astype(x_q.dtype), w

