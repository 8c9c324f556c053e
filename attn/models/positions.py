"""Positional encodings of the Transformer, registered by name (registry kind "pos_encoding").

Axis names: B batch, T length, d model width, H heads, dh head size.

Attention is permutation-equivariant; an encoding is how order gets in. Each registered class
carries its own facts and pure functions (no caller tests an encoding's name):
- `init(key, max_len, d_model) -> params | None`: learned parameters, or None.
- `embed(params, x, positions) -> x`: added to the scaled token embeddings before the first
  layer. x: [B, T, d]; positions: [B or 1, T] int.
- `rotate(x, positions) -> x`: applied to the queries and keys of every self-attention head
  before the score. x: [B, H, T, dh]; positions: [B or 1, T] int.
- `bias(num_heads, q_pos, k_pos) -> [B or 1, H, Tq, Tk] | None`: added to the self-attention
  scores (attn.attend's `bias`). q_pos: [B or 1, Tq], k_pos: [B or 1, Tk] int.
- `bounded`: True when positions past a table's length do not exist (the widest batch each
  side takes: model.max_src_len, model.transformer.max_tgt_len).
- `forms_bias`: True when `bias` adds to the scores: the fused kernels and linear attention
  form no scores, so such a self-attention runs unfused (and cannot be linear).
- `unsupported(cfg, role) -> str | None`: why a self-attention variant cannot carry it.

Only self-attention sees `rotate` and `bias`: in cross-attention target and source positions
are not positions on one axis, so a relative distance between them means nothing.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from attn import registry
from attn.models import registries

_F32 = jnp.float32

# The wavelength base of the sinusoids (Vaswani et al. 2017, sec. 3.5) and of RoPE's rotation
# frequencies (Su et al. 2021, eq. 15): theta_i = BASE^(-2i/d).
BASE = 10000.0


def _angles(positions, d):
  """pos * BASE^(-2i/d) for i < ceil(d / 2): [..., T, ceil(d/2)] float32."""
  inv_freq = BASE ** (-jnp.arange(0, d, 2, dtype=_F32) / d)  # [ceil(d/2)]
  return jnp.asarray(positions, _F32)[..., None] * inv_freq


class PositionalEncoding:
  """No positions: the model sees its inputs as sets (the encoder is permutation-equivariant)."""
  forms_bias = False
  bounded = False

  @staticmethod
  def init(key, max_len, d_model):
    del key, max_len, d_model
    return None

  @staticmethod
  def embed(params, x, positions):
    del params, positions
    return x

  @staticmethod
  def rotate(x, positions):
    del positions
    return x

  @staticmethod
  def bias(num_heads, q_pos, k_pos):
    del num_heads, q_pos, k_pos
    return None

  @classmethod
  def unsupported(cls, cfg, role) -> str | None:
    del cfg, role
    return None


registries.POS_ENCODINGS.register("none")(PositionalEncoding)


def sinusoids(positions, d):
  """Vaswani et al. (2017) sec. 3.5: PE(p, 2i) = sin(p / BASE^(2i/d)), PE(p, 2i+1) = cos(...).

  positions: [..., T] int. Returns [..., T, d] float32 (an odd d drops the last cosine).
  """
  a = _angles(positions, d)  # [..., T, ceil(d/2)]
  pe = jnp.stack([jnp.sin(a), jnp.cos(a)], axis=-1)  # [..., T, ceil(d/2), 2]: sin, cos interleaved
  return pe.reshape(pe.shape[:-2] + (-1,))[..., :d]


@registries.POS_ENCODINGS.register("sinusoidal")
class Sinusoidal(PositionalEncoding):
  """Fixed sinusoids added to the embeddings (Vaswani et al. 2017); defined at every position."""

  @staticmethod
  def embed(params, x, positions):
    del params
    return x + sinusoids(positions, x.shape[-1]).astype(x.dtype)


@registries.POS_ENCODINGS.register("learned")
class Learned(PositionalEncoding):
  """A learned embedding per absolute position (Gehring et al. 2017), up to the table's length."""
  bounded = True

  @staticmethod
  def init(key, max_len, d_model):
    # The token embeddings enter at unit scale (times sqrt(d)); a small table lets the tokens
    # dominate at the start, as in BERT/GPT-2 (std 0.02).
    return {"table": 0.02 * jax.random.normal(key, (max_len, d_model), _F32)}

  @staticmethod
  def embed(params, x, positions):
    max_len = params["table"].shape[0]
    if x.shape[-2] > max_len:  # traced positions cannot be checked; a static length can
      raise ValueError(f"learned positions cover {max_len} positions, got a sequence of "
                       f"{x.shape[-2]} (raise model.max_src_len / model.max_tgt_len)")
    return x + jnp.take(params["table"], positions, axis=0).astype(x.dtype)


def rotate_pairs(x, positions):
  """RoPE (Su et al. 2021, eq. 34): rotates each pair (x_2i, x_2i+1) by the angle p theta_i,
  theta_i = BASE^(-2i/dh), so that <R_p q, R_s k> depends on p - s only (eq. 16).

  x: [B, H, T, dh] (dh even); positions: [B or 1, T]. Returns x's shape and dtype.
  """
  a = _angles(positions, x.shape[-1])[:, None]  # [B, 1, T, dh/2]: shared by the heads
  cos, sin = jnp.cos(a), jnp.sin(a)
  x1, x2 = x[..., 0::2].astype(_F32), x[..., 1::2].astype(_F32)  # [B, H, T, dh/2]
  out = jnp.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)  # [B, H, T, dh/2, 2]
  return out.reshape(x.shape).astype(x.dtype)


@registries.POS_ENCODINGS.register("rope")
class RoPE(PositionalEncoding):
  """Rotary position embedding (Su et al. 2021): queries and keys rotated by their position."""

  rotate = staticmethod(rotate_pairs)

  @classmethod
  def unsupported(cls, cfg, role) -> str | None:
    # The relative-position property holds for a score of q . k alone: a score with parameters
    # (general's q W k^T, additive's tanh) breaks it, or never compares q and k at all.
    if registry.get(role.score, "score").init is not None:
      return (f"RoPE rotates queries and keys so that their dot product depends on relative "
              f"position; score={role.score!r} is not a dot product (use dot or scaled_dot)")
    if cfg.transformer.d_head % 2:
      return f"RoPE rotates pairs of features: the head size {cfg.transformer.d_head} is odd"
    return None


def alibi_slopes(num_heads):
  """ALiBi's per-head slopes (Press et al. 2022, sec. 3): the geometric sequence starting at and
  multiplied by 2^(-8/H); for H not a power of two, the slopes of the next lower power of two
  and every other slope of twice that (the authors' reference code). [H] float32."""

  def power_of_two(n):
    start = 2.0 ** (-8.0 / n)
    return [start ** (i + 1) for i in range(n)]

  if math.log2(num_heads).is_integer():
    return jnp.asarray(power_of_two(num_heads), _F32)
  lower = 2 ** math.floor(math.log2(num_heads))
  extra = power_of_two(2 * lower)[0::2][:num_heads - lower]
  return jnp.asarray(power_of_two(lower) + extra, _F32)


def alibi_bias(num_heads, q_pos, k_pos):
  """-m_h |i - j| (Press et al. 2022, eq. in sec. 3): the causal form -m_h (i - j) wherever
  j <= i, extended symmetrically to a bidirectional encoder.

  q_pos: [B or 1, Tq], k_pos: [B or 1, Tk] int. Returns [B or 1, H, Tq, Tk] float32 (<= 0).
  """
  dist = jnp.abs(jnp.asarray(q_pos, _F32)[:, :, None] - jnp.asarray(k_pos, _F32)[:, None, :])
  return -alibi_slopes(num_heads)[None, :, None, None] * dist[:, None]  # [B, H, Tq, Tk]


@registries.POS_ENCODINGS.register("alibi")
class ALiBi(PositionalEncoding):
  """Attention with linear biases (Press et al. 2022): a per-head penalty on distance."""
  forms_bias = True
  bias = staticmethod(alibi_bias)

  @classmethod
  def unsupported(cls, cfg, role) -> str | None:
    del cfg
    if registry.get(role.scope, "scope").full_attention:
      return (f"ALiBi adds a bias to the scores, and scope={role.scope!r} never forms them "
              "(its feature map replaces the softmax)")
    return None
