"""The Transformer's layers: pre-LayerNorm encoder and decoder layers, the embeddings and the two
stacks (Vaswani et al. 2017; Wang et al. 2019 for the pre-LN placement).

Axis names: B batch, Ts source length, Tt target length, d = d_model, H heads, L decoder layers,
V target vocabulary, C the decoding cache length.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from attn.models.config import ModelConfig
from attn.models.dropout import dropout
from attn.models.decoders import StepAttention
from attn.models.layers import linear
from attn.models.params import as_params, values
from attn.models.transformer_attention import Attention, HeadAttention, dense, pos_encoding


# The decoder layer whose head-averaged cross-attention is `StepAttention.weights` (what AER,
# heatmaps and the coverage penalty read); `heads` keeps every layer and head. Garg et al. (2019)
# found the penultimate of six layers' head average the best aligner on German-English AER; we
# take the last layer: the models trained here have one to three decoder layers, where the
# penultimate is often the first (or absent), and the last layer's attention is the one that
# feeds the output distribution directly. Index into the L axis (negative counts from the top).
ALIGNMENT_LAYER = -1

ACTIVATIONS = {"relu": jax.nn.relu, "gelu": jax.nn.gelu}


class FeedForward(nnx.Module):
  """W_2 act(W_1 x + b_1) + b_2 (Vaswani et al. eq. 2), act = ReLU or GELU."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, compute_dtype: str):
    self.activation = cfg.transformer.ff_activation
    self.compute_dtype = compute_dtype
    d, d_ff = cfg.transformer.d_model, cfg.transformer.d_ff
    self.up = linear(d, d_ff, compute_dtype=compute_dtype, rngs=rngs)
    self.down = linear(d_ff, d, compute_dtype=compute_dtype, rngs=rngs)

  def __call__(self, x):
    """x: [..., d] -> [..., d] float32, the Linears' parameters through `dense`."""
    h = ACTIVATIONS[self.activation](_linear(self.up, x, self.compute_dtype))
    return _linear(self.down, h, self.compute_dtype)


def _linear(layer: nnx.Linear, x, compute_dtype):
  """layer(x) through `dense`: x @ kernel + bias (the parameters nnx.Linear holds)."""
  y = dense(x, layer.kernel[...], compute_dtype)
  return y if layer.bias is None else y + layer.bias[...]


def _keys(key, n):
  return [None] * n if key is None else list(jax.random.split(key, n))


def _pre_norm(cfg: ModelConfig, rngs: nnx.Rngs, build):
  """(LayerNorm over d_model, the sublayer `build()` makes): one pre-LN residual block's parts,
  built in that order (the order parameters draw their keys from `rngs`)."""
  norm = nnx.LayerNorm(cfg.transformer.d_model, rngs=rngs)
  return norm, build()


class PackedMasks(NamedTuple):
  """Rows that hold several examples one after another (data.pack): each token's position in
  its own example, and which keys a query may see (the same example; padding has segment 0 and
  is masked by the lengths as well)."""
  src_positions: jax.Array  # [B, Ts] int32
  tgt_positions: jax.Array  # [B, Tt] int32
  src_self: jax.Array  # [B, Ts, Ts] bool
  tgt_self: jax.Array  # [B, Tt, Tt] bool (causality is added by the attention)
  cross: jax.Array  # [B, Tt, Ts] bool
  cross_centres: jax.Array  # [B, Tt] int32: the source index of each target's own position

  @classmethod
  def of(cls, batch) -> "PackedMasks | None":
    """From a batch's src/tgt_segments and _positions; None for a batch of one example a row."""
    if "src_segments" not in batch:
      return None
    s, t = batch["src_segments"], batch["tgt_segments"]
    same = lambda a, b: a[:, :, None] == b[:, None, :]
    cross = same(t, s)
    # A window over the source is centred on the target's position within its own example:
    # that example's first source slot (the first of the row's keys it may see) plus it.
    centres = jnp.argmax(cross, axis=-1).astype(jnp.int32) + batch["tgt_positions"]
    return cls(batch["src_positions"], batch["tgt_positions"], same(s, s), same(t, t), cross,
               centres)


def packed_attention(packed: PackedMasks | None, role: str, x) -> dict:
  """The Attention keywords of packed rows for `role` (src_self, tgt_self, cross) with queries
  x [B, T, d]: the role's mask, and the key index each query's window is centred on (its own
  slot in self-attention); {} for one example a row."""
  if packed is None:
    return {}
  centres = packed.cross_centres if role == "cross" else jnp.arange(x.shape[1])[None]
  return {"mask": getattr(packed, role), "centres": centres}


class EncoderLayer(nnx.Module):
  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, compute_dtype: str):
    self.rate = cfg.dropout
    self.norm_attn, self.attn = _pre_norm(
        cfg, rngs, lambda: Attention(cfg, "enc_self", rngs=rngs, compute_dtype=compute_dtype))
    self.norm_ff, self.ff = _pre_norm(
        cfg, rngs, lambda: FeedForward(cfg, rngs=rngs, compute_dtype=compute_dtype))

  def __call__(self, x, src_lengths, positions, key=None, packed: PackedMasks | None = None):
    """x: [B, Ts, d]; positions: [B or 1, Ts]; packed: the masks of packed rows. Padded keys are
    masked; padded rows computed and never read (cross-attention masks them too)."""
    k1, k2 = _keys(key, 2)
    h = self.norm_attn(x)
    kp, v = self.attn.keys_values(h, positions)
    out, _ = self.attn(self.attn.queries(h, positions), kp, v, q_pos=positions, k_pos=positions,
                       key_lengths=src_lengths, fused=self.attn.fused,
                       **packed_attention(packed, "src_self", x))
    x = x + dropout(out, self.rate, k1)
    return x + dropout(self.ff(self.norm_ff(x)), self.rate, k2)


class DecoderLayer(nnx.Module):
  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, compute_dtype: str):
    self.rate = cfg.dropout
    self.norm_self, self.self_attn = _pre_norm(
        cfg, rngs, lambda: Attention(cfg, "dec_self", rngs=rngs, compute_dtype=compute_dtype))
    self.norm_cross, self.cross = _pre_norm(
        cfg, rngs, lambda: Attention(cfg, "cross", rngs=rngs, compute_dtype=compute_dtype))
    self.norm_ff, self.ff = _pre_norm(
        cfg, rngs, lambda: FeedForward(cfg, rngs=rngs, compute_dtype=compute_dtype))

  def cross_keys_values(self, memory):
    """Cross-attention keys and values of the encoder output [B, Ts, d] (no positions)."""
    return self.cross.keys_values(memory, None)

  def _rest(self, y, q_pos, cross_kv, src_lengths, keys, fused, reweigh=None,
            packed: PackedMasks | None = None):
    """Cross-attention and feed-forward after the self-attention block: (y, HeadAttention
    or None)."""
    h = self.norm_cross(y)
    out, att = self.cross(self.cross.queries(h, q_pos), *cross_kv, q_pos=q_pos, k_pos=None,
                          key_lengths=src_lengths, fused=fused, reweigh=reweigh,
                          **packed_attention(packed, "cross", y))
    y = y + dropout(out, self.rate, keys[0])
    return y + dropout(self.ff(self.norm_ff(y)), self.rate, keys[1]), att

  def __call__(self, y, cross_kv, src_lengths, positions, key=None, reweigh=None,
               packed: PackedMasks | None = None):
    """Teacher forcing. y: [B, Tt, d]; positions: [B or 1, Tt]; reweigh: see Attention.__call__
    (cross-attention); packed: the masks of packed rows. Returns (y, the cross-attention's
    HeadAttention of [B, H, Tt, Ts] arrays, or None)."""
    keys = _keys(key, 3)
    h = self.norm_self(y)
    kp, v = self.self_attn.keys_values(h, positions)
    # Causality alone keeps every valid query off target padding, which sits after it.
    out, _ = self.self_attn(self.self_attn.queries(h, positions), kp, v, q_pos=positions,
                            k_pos=positions, causal=True, fused=self.self_attn.fused,
                            **packed_attention(packed, "tgt_self", y))
    y = y + dropout(out, self.rate, keys[0])
    return self._rest(y, positions, cross_kv, src_lengths, keys[1:], self.cross.fused, reweigh,
                      packed)

  def step(self, y, cache, t, src_lengths):
    """One decoding step. y: [B, 1, d]; cache: {"k", "v": [B, H, C, dh'], "cross_k",
    "cross_v": [B, H, Ts, dh']}; t: [B] this step's position. Returns (y, cache with the step's
    key and value written at t, the cross-attention's HeadAttention [B, H, 1, Ts] or None)."""
    q_pos = t[:, None]  # [B, 1]
    h = self.norm_self(y)
    k_new, v_new = self.self_attn.keys_values(h, q_pos)  # [B, H, 1, dh']
    C = cache["k"].shape[-2]
    slots = jnp.arange(C)
    write = (slots == q_pos)[:, None, :, None]  # [B, 1, C, 1]
    k = jnp.where(write, k_new, cache["k"])
    v = jnp.where(write, v_new, cache["v"])
    mask = (slots <= q_pos)[:, None, :]  # [B, 1, C]: the keys written so far, causally
    out, _ = self.self_attn(self.self_attn.queries(h, q_pos), k, v, q_pos=q_pos,
                            k_pos=slots[None], mask=mask)
    y = y + out
    y, w = self._rest(y, q_pos, (cache["cross_k"], cache["cross_v"]), src_lengths, (None, None),
                      fused=False)
    return y, {**cache, "k": k, "v": v}, w


class _Embedding(nnx.Module):
  """Token embeddings times sqrt(d) (Vaswani et al. sec. 3.4) plus the positional encoding."""

  def __init__(self, cfg: ModelConfig, vocab: int, max_len: int, *, rngs: nnx.Rngs):
    # std d^-1/2: unit scale times sqrt(d)
    self.embed = nnx.Embed(vocab, cfg.transformer.d_model, rngs=rngs)
    self.pos = pos_encoding(cfg)
    self.pos_params = as_params(self.pos.init(rngs.params(), max_len, cfg.transformer.d_model))
    self.scale = math.sqrt(cfg.transformer.d_model)
    self.rate = cfg.dropout

  def __call__(self, ids, positions, key=None, offset=None):
    """ids: [B, T]; positions: [B or 1, T]; offset: [B, T, d] added to the looked-up
    embeddings (attribution). Returns [B, T, d] float32."""
    x = self.embed(ids)
    if offset is not None:
      x = x + offset
    x = self.pos.embed(values(self.pos_params), x * self.scale, positions)
    return dropout(x, self.rate, key)


class TransformerEncoder(nnx.Module):
  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, compute_dtype: str):
    self.embedding = _Embedding(cfg, cfg.src_vocab, cfg.max_src_len, rngs=rngs)
    self.layers = nnx.List([EncoderLayer(cfg, rngs=rngs, compute_dtype=compute_dtype)
                            for _ in range(cfg.enc_layers)])
    self.norm = nnx.LayerNorm(cfg.transformer.d_model, rngs=rngs)

  @property
  def embed(self) -> nnx.Embed:
    """The token lookup, under the RNN encoder's name (attribution reads it)."""
    return self.embedding.embed

  def __call__(self, src, src_lengths, *, dropout_key=None, embed_offset=None,
               packed: PackedMasks | None = None):
    """src: [B, Ts]; src_lengths: [B]; packed: the positions and masks of packed rows. Returns
    [B, Ts, d] (rows past a length are never read)."""
    keys = _keys(dropout_key, len(self.layers) + 1)
    positions = jnp.arange(src.shape[1])[None] if packed is None else packed.src_positions
    x = self.embedding(src, positions, keys[0], embed_offset)
    for layer, key in zip(self.layers, keys[1:]):
      x = layer(x, src_lengths, positions, key, packed)
    return self.norm(x)


class TransformerDecoder(nnx.Module):
  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, compute_dtype: str):
    self.compute_dtype = compute_dtype
    self.embedding = _Embedding(cfg, cfg.tgt_vocab, cfg.transformer.max_tgt_len, rngs=rngs)
    self.layers = nnx.List([DecoderLayer(cfg, rngs=rngs, compute_dtype=compute_dtype)
                            for _ in range(cfg.dec_layers)])
    self.norm = nnx.LayerNorm(cfg.transformer.d_model, rngs=rngs)
    self.out = None if cfg.transformer.tie_embeddings else linear(
        cfg.transformer.d_model, cfg.tgt_vocab, compute_dtype=compute_dtype, rngs=rngs)

  def logits(self, y):
    """y: [..., d] -> [..., V] float32; tied: y E^T with the target embedding E (Press & Wolf
    2017), whose d^-1/2 scale keeps the logits O(1) for a layer-normalized y."""
    y = self.norm(y)
    if self.out is None:
      return dense(y, self.embedding.embed.embedding[...].T, self.compute_dtype)
    return _linear(self.out, y, self.compute_dtype)

  def __call__(self, memory, src_lengths, tgt_in, dropout_key=None, reweigh=None,
               packed: PackedMasks | None = None):
    """Teacher forcing on tgt_in [B, Tt] (BOS-shifted; packed rows: BOS at every example's
    start). reweigh: (weights [B, H, Tt, Ts], layer index) -> weights', applied to every
    layer's cross-attention. Returns (logits [B, Tt, V], the cross-attention of every layer,
    HeadAttention of [B, L, H, Tt, Ts] arrays, or None when it forms no weights)."""
    keys = _keys(dropout_key, len(self.layers) + 1)
    positions = jnp.arange(tgt_in.shape[1])[None] if packed is None else packed.tgt_positions
    y = self.embedding(tgt_in, positions, keys[0])
    atts = []
    for i, (layer, key) in enumerate(zip(self.layers, keys[1:])):
      layer_reweigh = None if reweigh is None else functools.partial(reweigh, layer=i)
      y, att = layer(y, layer.cross_keys_values(memory), src_lengths, positions, key,
                     reweigh=layer_reweigh, packed=packed)
      atts.append(att)
    stacked = None if atts[0] is None else jax.tree.map(lambda *x: jnp.stack(x, axis=1), *atts)
    return self.logits(y), stacked


def alignment(heads):
  """StepAttention.weights from every layer's cross-attention: layer ALIGNMENT_LAYER's head
  average. heads: [B, L, H, ..., Ts] -> [B, ..., Ts]."""
  return jnp.mean(heads[:, ALIGNMENT_LAYER], axis=1)


def step_attention(att: HeadAttention) -> StepAttention:
  """Every layer's teacher-forced cross-attention [B, L, H, Tt, Ts] as the StepAttention the
  tasks read: weights = `alignment`, heads and the scores behind them kept whole."""
  return StepAttention(alignment(att.weights), scores=att.scores, heads=att.weights)
