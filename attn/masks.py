"""Boolean attention masks. True = the query may attend to that key.

Conventions shared by `attn/` and `kernels/`:
- A mask is boolean and broadcastable to `[..., Tq, Tk]`.
- Causal masking is top-left aligned, as in `jax.nn.dot_product_attention(is_causal=True)`:
  query i sees keys j <= i, also when Tq != Tk.
- A query row with no valid key returns zero weights and a zero context, in value and gradient
  (never NaN, never the uniform average).
"""

from __future__ import annotations

import jax.numpy as jnp

from attn.precision import accum_dtype


def lengths_to_mask(lengths, T: int):
  """Padding mask from lengths.

  lengths: [...] int, valid prefix length of each sequence.
  Returns: [..., T] bool, True at positions < length.
  """
  return jnp.arange(T) < jnp.asarray(lengths)[..., None]


def padding_mask(key_lengths, Tk: int, *, query_lengths=None, Tq: int | None = None):
  """Attention mask from key (and optionally query) lengths.

  key_lengths: [B] int.  query_lengths: [B] int or None (then Tq is unused).
  Returns: [B, 1, Tk] without query lengths, else [B, Tq, Tk]; padded query rows are fully
  masked, so their context is zero.
  """
  m = lengths_to_mask(key_lengths, Tk)[..., None, :]  # [B, 1, Tk]
  if query_lengths is None:
    return m
  if Tq is None:
    raise ValueError("padding_mask: query_lengths given without Tq")
  return m & lengths_to_mask(query_lengths, Tq)[..., :, None]  # [B, Tq, Tk]


def causal_mask(Tq: int, Tk: int):
  """[Tq, Tk] bool, True where key j <= query i (top-left aligned)."""
  return jnp.arange(Tk)[None, :] <= jnp.arange(Tq)[:, None]


def window_mask(centers, Tk: int, half_width):
  """Local window around per-query centres (Luong local-m / local-p window).

  centers: [..., Tq] int or float, the aligned source position p_t of each query.
  half_width: D; keys with |j - p_t| <= D are kept.
  The distance is computed in accum_dtype(centers) (float32, float64 for float64 centres), so a
  float64 p_t within 1e-9 of the window edge lands on the side float64 puts it.
  Returns: [..., Tq, Tk] bool.
  """
  centers = jnp.asarray(centers)
  acc = accum_dtype(centers)
  j = jnp.arange(Tk, dtype=acc)
  return jnp.abs(j - centers[..., None].astype(acc)) <= half_width


def sliding_window_mask(Tq: int, Tk: int, half_width):
  """Symmetric sliding window for self-attention: query i sees keys |j - i| <= D. [Tq, Tk]."""
  return window_mask(jnp.arange(Tq), Tk, half_width)


def gaussian_window(centers, Tk: int, half_width):
  """Luong et al. (2015) eq. 10 gain exp(-(s - p_t)^2 / (2 sigma^2)), sigma = D / 2.

  centers: [..., Tq] float.  Returns: [..., Tq, Tk] in accum_dtype(centers) (float32, or
  float64 for float64 centres).
  """
  centers = jnp.asarray(centers)
  acc = accum_dtype(centers)
  sigma = half_width / 2.0
  s = jnp.arange(Tk, dtype=acc)
  d = s - centers.astype(acc)[..., None]
  return jnp.exp(-(d * d) / (2.0 * sigma * sigma))


def combine(*masks):
  """Logical AND of masks, ignoring None; None if all are None."""
  out = None
  for m in masks:
    if m is None:
      continue
    out = m if out is None else jnp.logical_and(out, m)
  return out


_WORD = 32  # keys per packed mask word


def pack_bits(mask):
  """bool [..., Tk] -> uint32 [..., ceil(Tk / 32)]: bit i of word w is key 32 w + i. A mask kept
  for a backward pass this way costs Tk / 8 bytes a row instead of Tk (or the float scores XLA
  would otherwise keep to recompute it)."""
  pad = -mask.shape[-1] % _WORD
  mask = jnp.pad(mask, [(0, 0)] * (mask.ndim - 1) + [(0, pad)])
  words = mask.reshape(mask.shape[:-1] + (-1, _WORD)).astype(jnp.uint32)  # [..., W, 32]
  return jnp.sum(words << jnp.arange(_WORD, dtype=jnp.uint32), axis=-1, dtype=jnp.uint32)


def unpack_bits(words, Tk: int):
  """pack_bits' inverse: uint32 [..., W] -> bool [..., Tk]."""
  bits = (words[..., None] >> jnp.arange(_WORD, dtype=jnp.uint32)) & 1  # [..., W, 32]
  return bits.reshape(words.shape[:-1] + (-1,))[..., :Tk].astype(bool)
