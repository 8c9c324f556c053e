"""The Transformer's multi-head attention on this repo's attention primitives.

Axis names: B batch, T length, d = d_model, H heads, dh = d / H head size, C the decoding cache
length.

Every attention holds `attn.init_multihead`'s parameters (wq, wk, wv [d, H, dh], wo [H, dh, d],
per-head score/scope parameters) and runs `core.attend` once per head (vmapped, as
`attn.multihead` does) or all heads through `core.fused_heads`. It is not one `multihead()` call
because three things happen between the projections and the score: RoPE rotates the queries and
keys, decoding caches the keys, and ALiBi adds a score bias. Each of the three roles (encoder
self-attention, decoder self-attention, cross-attention) has its own variant, a section of
`model.transformer` (an `AttentionRole`).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

import attn
from attn import banded, core, precision, registry
from attn.models import registries
from attn.models.config import ModelConfig
from attn.models.params import as_params, values
from attn.models.positions import PositionalEncoding


class HeadAttention(NamedTuple):
  """What one multi-head attention formed: weights [B, H, Tq, Tk] float32 and the raw scores
  behind them [B, H, Tq, Tk] (before temperature and normalizer, -inf where not attendable)."""
  weights: jax.Array
  scores: jax.Array


class Role(NamedTuple):
  """One of the three attentions: its section in model.transformer, and how it is masked and
  positioned."""
  field: str
  self_attention: bool  # queries and keys on one axis: positional rotation and bias apply
  causal: bool
  keys_on_target: bool  # its keys are target positions (bounded by max_tgt_len, else max_src_len)

  def max_keys(self, cfg: ModelConfig) -> int:
    """The most keys it attends over (a `location` score's max_len)."""
    return cfg.transformer.max_tgt_len if self.keys_on_target else cfg.max_src_len


ROLES = {r.field: r for r in (Role("enc_self", True, False, False),
                              Role("dec_self", True, True, True),
                              Role("cross", False, False, False))}


def dense(x, w, compute_dtype):
  """x [..., K] @ w [K, N] with operands in `compute_dtype`, accumulated in float32. Returns
  [..., N] float32.

  float32 goes through `precision.matmul` too, whose backward reads x^T saved by the forward
  pass: autodiff of the plain einsum leaves XLA:CPU (jax 0.10.2) to form the weight gradients'
  transposed operands from the dropout and LayerNorm around them, fused into strided
  transposing copies. The products are the same; only their summation order may differ."""
  return precision.matmul(x, w, precision.compute_dtype(compute_dtype))


def _head_axis(p):
  return None if p is None else 0  # per-head parameters carry a leading H axis


def prepare_heads(score, score_params, k):
  """The score's key-side work for every head: k [B, H, Tk, dh] -> [B, H, Tk, dk']."""
  return jax.vmap(functools.partial(core.prepare_keys, score),
                  in_axes=(_head_axis(score_params), -3), out_axes=-3)(score_params, k)


def attend_heads(params, q, kp, v, role, *, key_lengths=None, mask=None, causal=False, bias=None,
                 positions=None, fused=False, same_positions=False):
  """Every head's attention with the role's variant (an `AttentionRole`).

  params: attn.init_multihead's parameters (only "score" and "scope" are read here).
  q: [B, H, Tq, dh]; kp: [B, H, Tk, dk'] keys already through `prepare_heads`; v: [B, H, Tk, dh].
  key_lengths: [B] valid keys; mask: bool broadcastable to [B, Tq, Tk] (shared by the heads);
  causal: query i sees keys j <= i; bias: [B or 1, H, Tq, Tk] added to the scores;
  positions: [B, Tq] the queries' positions (where windows are centred).
  fused: all heads in one kernel call (needs softmax, the global scope, no mask and no bias).
  same_positions: queries and keys are the same positions 0..T-1 (self-attention in teacher
  forcing and encoding); a window scope then runs banded, when given no mask and no bias.
  Returns (context [B, H, Tq, dh], weights [B, H, Tq, Tk] float32, raw scores [B, H, Tq, Tk]
  float32 (before the temperature and the normalizer, bias included, -inf where not attendable);
  weights and scores are None when never formed: fused, banded window, linear attention). A query
  with no valid key gets zero weights and context. Under jit, unused weights and scores cost nothing.
  """
  score_params, scope_params = params.get("score"), params.get("scope")
  if fused:
    return core.fused_heads(role.score, score_params, q, kp, v, temperature=role.temperature,
                            causal=causal, key_lengths=key_lengths), None, None
  scope = registry.get(role.scope, "scope")
  if (scope.banded and same_positions and mask is None and bias is None
      and banded.banded_unsupported(role.score, role.normalizer) is None):
    # The masked window forms all [T, T] scores to keep 2 * half_width + 1 per query; the band
    # holds O(T * half_width) per head, the same context. Its weights are never formed: the
    # self-attention callers discard them (only the cross-attention's are read).
    one_band = functools.partial(banded.banded_attend, score=role.score,
                                 normalizer=role.normalizer, temperature=role.temperature,
                                 half_width=role.half_width, causal=causal,
                                 key_lengths=key_lengths)
    return jax.vmap(one_band, in_axes=(_head_axis(score_params), -3, -3, -3),
                    out_axes=-3)(score_params, q, kp, v), None, None

  def one_head(sp, cp, q, k, v, b):
    return core.attend(sp, q, k, v, score=role.score, normalizer=role.normalizer, mask=mask,
                       temperature=role.temperature, causal=causal,
                       scope=scope.at_positions or role.scope, scope_params=cp,
                       half_width=role.half_width, top_k=role.top_k, positions=positions,
                       keys_prepared=True, key_lengths=key_lengths, bias=b, return_scores=True)

  return jax.vmap(one_head, in_axes=(_head_axis(score_params), _head_axis(scope_params), -3, -3,
                                     -3, None if bias is None else -3),
                  out_axes=-3)(score_params, scope_params, q, kp, v, bias)


def pos_encoding(cfg: ModelConfig):
  """The registered positional encoding of model.transformer.pos_encoding."""
  return registries.POS_ENCODINGS.get(cfg.transformer.pos_encoding)


def fused_unsupported(cfg: ModelConfig, field: str) -> str | None:
  """Why role `field` (enc_self, dec_self, cross) runs unfused under model.fused=True; None when
  the kernels run it (padding is always given to them as lengths, never as a mask)."""
  role = getattr(cfg.transformer, field)
  why = core.fused_unsupported(role.score, role.normalizer, role.scope)
  if why is None and ROLES[field].self_attention and pos_encoding(cfg).forms_bias:
    why = (f"pos_encoding={cfg.transformer.pos_encoding!r} adds a bias to the scores, which no "
           "kernel takes")
  return why


class Attention(nnx.Module):
  """One multi-head attention of role `field`: projections, positions, heads, output projection.

  The queries' and keys' positions enter through the model's positional encoding (rotation,
  bias) in self-attention roles only; cross-attention gets `PositionalEncoding` (none)."""

  def __init__(self, cfg: ModelConfig, field: str, *, rngs: nnx.Rngs, compute_dtype: str):
    spec = ROLES[field]
    self.role_field = field
    self.role = getattr(cfg.transformer, field)
    tc = cfg.transformer
    self.num_heads = tc.num_heads
    self.causal = spec.causal
    self.self_attention = spec.self_attention
    self.compute_dtype = compute_dtype
    self.pos = pos_encoding(cfg) if spec.self_attention else PositionalEncoding
    # False, or cfg.fused (True or a kernel target name) where this role can run fused
    self.fused = cfg.fused if cfg.fused and fused_unsupported(cfg, field) is None else False
    # Additive scores get d_attn = dh: a [.., Tq, Tk, d_attn] tensor per head is formed unfused.
    self.params = as_params(attn.init_multihead(
        rngs.params(), tc.d_model, tc.num_heads, score=self.role.score, d_attn=tc.d_head,
        max_len=spec.max_keys(cfg), scope=self.role.scope))

  def _heads(self, x, name):
    """x [B, T, d] through params[name] [d, H, dh] -> [B, H, T, dh]."""
    w = self.params[name][...]
    d, H, dh = w.shape
    y = dense(x, w.reshape(d, H * dh), self.compute_dtype)  # [B, T, H*dh]
    return jnp.swapaxes(y.reshape(y.shape[:-1] + (H, dh)), -2, -3)

  def queries(self, x, positions):
    """x: [B, Tq, d]; positions: [B or 1, Tq]. Returns [B, H, Tq, dh]."""
    return self.pos.rotate(self._heads(x, "wq"), positions)

  def keys_values(self, x, positions):
    """x: [B, Tk, d]; positions: [B or 1, Tk]. Returns prepared keys [B, H, Tk, dk'] and values
    [B, H, Tk, dh] (what the decoding cache holds: nothing about a key is recomputed)."""
    k = self.pos.rotate(self._heads(x, "wk"), positions)
    return prepare_heads(self.role.score, values(self.params.get("score")), k), self._heads(x, "wv")

  def __call__(self, q, kp, v, *, q_pos, k_pos, key_lengths=None, mask=None, causal=False,
               fused=False, reweigh=None, centres=None):
    """Attends with the role's variant and projects back: (out [B, Tq, d] float32,
    HeadAttention of [B, H, Tq, Tk] arrays, or None when the weights are never formed).
    q_pos [B or 1, Tq], k_pos [B or 1, Tk]: positions (bias, windows).
    centres: [B or 1, Tq] the key index a window is centred on, where that is not q_pos (packed
    rows, whose positions restart at every example).
    reweigh: weights [B, H, Tq, Tk] -> weights' of the same shape; the context is then
    weights' @ v (an intervention on what the layer reads; `Transformer.counterfactual`)."""
    p = values(self.params)
    fused = fused and mask is None  # the kernels take key lengths, never a mask
    bias = self.pos.bias(self.num_heads, q_pos, k_pos)
    # Self-attention without a mask is encoding or teacher forcing (a decoding step masks its
    # cache): the keys sit at the queries' positions 0..T-1.
    same_positions = self.self_attention and mask is None
    ctx, w, s = attend_heads(p, q, kp, v, self.role, key_lengths=key_lengths, mask=mask,
                             causal=causal, bias=bias,
                             positions=jnp.broadcast_to(q_pos if centres is None else centres,
                                                        (q.shape[0], q.shape[-2])),
                             fused=fused, same_positions=same_positions)  # ctx [B, H, Tq, dh]
    if reweigh is not None:
      if w is None:
        raise ValueError(f"model.transformer.{self.role_field}: an intervention on the attention "
                         "weights "
                         "needs them formed (not fused, banded or linear)")
      ctx = jnp.einsum("bhqk,bhkd->bhqd", reweigh(w), v.astype(w.dtype)).astype(ctx.dtype)
    H, dh, d = p["wo"].shape
    ctx = jnp.swapaxes(ctx, -2, -3).reshape(ctx.shape[:-3] + (ctx.shape[-2], H * dh))
    att = None if w is None else HeadAttention(w, s)
    return dense(ctx, p["wo"].reshape(H * dh, d), self.compute_dtype), att  # [B, Tq, d]


@functools.lru_cache(maxsize=None)
def attend_once(role, spec: Role, pos, H: int, dh: int) -> str | None:
  """What attend_heads refuses about this role's variant (None if nothing), from an abstract
  evaluation on three positions (jax.eval_shape: a validation step, never a config's
  construction); cached per variant."""
  T = 3

  def once():
    params = attn.init_multihead(jax.random.PRNGKey(0), H * dh, H, score=role.score, d_attn=dh,
                                 max_len=T, scope=role.scope)
    x = jnp.zeros((1, H, T, dh), jnp.float32)
    positions = jnp.arange(T)[None]
    return attend_heads(params, x, prepare_heads(role.score, params.get("score"), x), x, role,
                        causal=spec.causal, bias=pos.bias(H, positions, positions),
                        key_lengths=None if spec.causal else jnp.full((1,), T),
                        positions=positions)

  try:
    jax.eval_shape(once)
  except (ValueError, TypeError) as e:
    return str(e)
  return None
