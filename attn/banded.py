"""Banded sliding-window self-attention: the `window` scope without the [T, T] score matrix.

Query i sees keys |i - j| <= half_width (and j <= i when causal), as `core.attend(...,
scope="window")` does, but the scores are formed per block of b queries against the band of
b + 2 * half_width keys around it (the sliding-window pattern of Longformer, Beltagy et al. 2020,
computed block by block): memory O(T * (b + 2 * half_width)) per head instead of O(T^2).

Axis names: T the sequence length (queries and keys are the same positions 0..T-1), b the block
size, n = ceil(T / b) blocks, L = b + 2 * w the band length of a block, dh / dk' / dv feature sizes.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from attn import core
from attn.registry import get

# The registered scope whose restriction banded_attend computes.
SCOPE = "window"

# Per query, a block of b forms b + 2w scores and gathers (b + 2w) / b copies of its key and
# value rows (dk' + dv floats each). Head sizes (dk' + dv ~ 64..128) exceed most half-widths, so
# the copies weigh more than the scores: b ~ 2w halves them against b ~ w for a third more scores
# (T=1024, w=16, dh=64, forward: temporaries 0.125 of the masked path's at b=32, 0.19 at b=16).
# The cap keeps a wide window's block from growing with it; the band still spans b + 2w.
MAX_BLOCK = 128


def default_block(half_width: int, T: int) -> int:
  """The smallest power of two >= 2 * half_width (at least 1), at most MAX_BLOCK and T."""
  return max(1, min(1 << max(2 * half_width - 1, 0).bit_length(), MAX_BLOCK, T))


def banded_unsupported(score: str, normalizer: str = "softmax") -> str | None:
  """Why banded_attend cannot run this variant (None when it can).

  Every registered normalizer is covered: the normalizer contract (masked entries exactly 0, a
  row with no valid entry all zeros) makes a row over the band equal the row over all keys.
  Scores must depend on the query and key vectors alone: the band hands the score each block's
  keys re-indexed from 0, so a `positional` score (the registry's flag) would be silently wrong."""
  get(normalizer, "normalizer")  # unknown names fail with the known ones
  if get(score, "score").positional:
    return (f"banded attention scores each block against its band with positions counted from "
            f"the band's start; score {score!r} depends on the key's position, not only on its "
            f"vector: use core.attend(..., scope='window')")
  return None


def _band_layout(T: int, half_width: int, block: int, causal: bool):
  """Static layout of the blocks and bands, as two small tables (no [n, b, L] constant).

  Returns key_pos: [n, L] the key position of each band slot (outside 0..T-1 at the ends),
  near: [b, L] bool, True where the window (and causality) let the block's query r see slot l;
  it is the same table for every block, as slot l of block n holds key n*b - reach + l and query
  r is n*b + r.
  """
  reach = max(min(half_width, T - 1), 0)  # keys farther away do not exist
  n = -(-T // block)
  L = block + 2 * reach
  key_pos = np.arange(n)[:, None] * block - reach + np.arange(L)[None, :]  # [n, L]
  key_pos = key_pos.astype(np.int32)  # the dtype of jnp lengths, without x64
  offset = np.arange(L)[None, :] - reach - np.arange(block)[:, None]  # [b, L] key minus query
  near = np.abs(offset) <= half_width
  if causal:
    near &= offset <= 0
  return key_pos, near


def _bands(x, key_pos):
  """x: [..., T, d] -> [..., n, L, d], the band of each block. Slots outside 0..T-1 read a
  clamped position; they are masked, so they carry zero weight and zero gradient."""
  return x[..., np.clip(key_pos, 0, x.shape[-2] - 1), :]


@functools.partial(jax.jit, static_argnames=("score", "normalizer", "half_width", "causal",
                                             "block"))
def banded_attend(params, q, kp, v, *, score="dot", normalizer="softmax", temperature=1.0,
                  half_width, causal=False, key_lengths=None, block=None):
  """Sliding-window self-attention, block by block; equals core.attend(params, q, k, v,
  score=score, normalizer=normalizer, temperature=temperature, scope="window",
  half_width=half_width, causal=causal, key_lengths=key_lengths, keys_prepared=True)'s context.

  params: the score's parameters (None for dot / scaled_dot).
  q: [..., T, dq]; kp: [..., T, dk'] keys already through `core.prepare_keys(score, params, k)`;
  v: [..., T, dv]. Queries and keys are the same positions 0..T-1.
  half_width: w >= 0, query i sees keys |i - j| <= w (w >= T - 1 is global attention).
  causal: also j <= i. key_lengths: [...] valid keys per sequence.
  block: queries per block b (default `default_block(w, T)`); any b gives the same result.
  Returns the context [..., T, dv] in v's dtype, accumulated in float32 (float64 for float64
  inputs); a query with no valid key gets a zero context, with zero gradient. The weights are
  never formed as a [T, T] matrix and not returned. Memory: O(T * (b + 2w)) scores (times
  d_attn for the additive score) and O(T * (b + 2w) / b * (dk' + dv)) gathered keys and values.
  """
  why = banded_unsupported(score, normalizer)
  if why:
    raise ValueError(why)
  T = q.shape[-2]
  if kp.shape[-2] != T or v.shape[-2] != T:
    raise ValueError(f"banded attention is self-attention: queries, keys and values need one "
                     f"length, got q {q.shape}, kp {kp.shape}, v {v.shape}")
  if not (isinstance(half_width, (int, np.integer)) and half_width >= 0):
    raise ValueError(f"half_width must be an int >= 0, got {half_width!r}")
  block = default_block(int(half_width), T) if block is None else block
  if not (isinstance(block, (int, np.integer)) and block >= 1):
    raise ValueError(f"block must be a positive int, got {block!r}")
  half_width, block = int(half_width), int(block)
  key_pos, near = _band_layout(T, half_width, block, causal)
  n = key_pos.shape[0]

  pad = [(0, 0)] * (q.ndim - 2) + [(0, n * block - T), (0, 0)]
  q_blocks = jnp.pad(q, pad).reshape(q.shape[:-2] + (n, block, q.shape[-1]))  # [..., n, b, dq]
  e = get(score, "score").fn(params, q_blocks, _bands(kp, key_pos))  # [..., n, b, L]
  exists = (key_pos >= 0) & (key_pos < T)  # [n, L]
  mask = jnp.asarray(near) & jnp.asarray(exists)[:, None, :]  # [n, b, L]
  if key_lengths is not None:
    valid = key_pos[:, None, :] < jnp.asarray(key_lengths)[..., None, None, None]  # [..., n, 1, L]
    mask = mask & valid  # [..., n, b, L]
  w = core.normalize(e, mask, kind=normalizer, temperature=temperature)  # [..., n, b, L]
  v_bands = _bands(v, key_pos).astype(w.dtype)  # [..., n, L, dv]
  ctx = jnp.einsum("...nql,...nld->...nqd", w, v_bands)  # [..., n, b, dv]
  ctx = ctx.reshape(ctx.shape[:-3] + (n * block, ctx.shape[-1]))[..., :T, :]  # [..., T, dv]
  return ctx.astype(v.dtype)
