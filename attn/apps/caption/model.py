"""Show, attend and tell in miniature (Xu et al. 2015): a small CNN turns each image region into a
feature vector, and the recurrent decoders of attn.models.decoders caption the image from them.

The regions take the place of a source sentence's tokens: the region encoder returns what the
recurrent encoder returns (`EncoderOutput`: outputs [B, R, He], the fixed-vector summary
[B, He], the mask [B, R]), so every registered decoder runs unchanged: `bahdanau` attends over
the regions with any registered score, normalizer and scope (model.rnn.*), `none` reads only the
summary (the mean of the region features: the fixed-vector bottleneck Xu et al. compare with),
and teacher forcing, greedy and beam search, the counterfactual interventions and the loss are
the seq2seq model's (attn.models.seq2seq.Seq2Seq).

Axis names: B batch, R regions, P region size in pixels (a region's input is P*P pixels, the
model config's `src_vocab`), C1, C2 the convolutions' channels, He the region feature size
(model.rnn.enc_out_dim).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from attn.models import registries
from attn.models.config import ModelConfig
from attn.models.dropout import dropout
from attn.models.encoder import EncoderOutput
from attn.models.seq2seq import Seq2Seq

# The region CNN's channels; each convolution (3x3, ReLU) is followed by 2x2 average pooling.
CONV_CHANNELS = (8, 16)


def region_size(cfg: ModelConfig) -> int:
  """P, the region's side in pixels: src_vocab holds P*P, the width of one region's input."""
  side = math.isqrt(cfg.src_vocab)
  if side * side != cfg.src_vocab:
    raise ValueError(f"src_vocab={cfg.src_vocab} is not the pixel count of a square region")
  return side


class RegionEncoder(nnx.Module):
  """Per-region CNN features plus a learned embedding of each region's position (so that the
  decoder can read the regions in order), tanh(W cnn(x_r) + p_r): [B, R, He]."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, compute_dtype: str = "float32"):
    del compute_dtype  # a few thousand FLOPs a pixel: float32 throughout
    self.cfg = cfg
    P, (c1, c2) = region_size(cfg), CONV_CHANNELS
    self.conv1 = nnx.Conv(1, c1, (3, 3), padding="SAME", rngs=rngs)
    self.conv2 = nnx.Conv(c1, c2, (3, 3), padding="SAME", rngs=rngs)
    He = cfg.rnn.enc_out_dim
    self.proj = nnx.Linear((P // 4) ** 2 * c2, He, rngs=rngs)
    self.positions = nnx.Param(0.1 * jax.random.normal(rngs.params(), (cfg.max_src_len, He)))

  def embed(self, src):
    """The regions' input features W cnn(x_r) + p_r, before the nonlinearity: [B, R, He]. (What
    a token encoder's embeddings are to gradient x input and integrated gradients,
    attn.inspection.measures.)"""
    B, R, _ = src.shape
    P = region_size(self.cfg)
    x = src.reshape(B * R, P, P, 1).astype(jnp.float32)
    x = nnx.avg_pool(jax.nn.relu(self.conv1(x)), (2, 2), strides=(2, 2))  # [B*R, P/2, P/2, C1]
    x = nnx.avg_pool(jax.nn.relu(self.conv2(x)), (2, 2), strides=(2, 2))  # [B*R, P/4, P/4, C2]
    return self.proj(x.reshape(B, R, -1)) + self.positions[...][:R]  # [B, R, He]

  def __call__(self, src, src_lengths, *, dropout_key=None, embed_offset=None) -> EncoderOutput:
    """src: [B, R, P*P] pixels; src_lengths: [B] regions that exist (the rest are padding);
    embed_offset: optional [B, R, He] added to `embed(src)` (what attribution methods
    differentiate with respect to)."""
    R = src.shape[1]
    h = self.embed(src)  # [B, R, He]
    if embed_offset is not None:
      h = h + embed_offset
    h = dropout(jnp.tanh(h), self.cfg.dropout, dropout_key)
    mask = jnp.arange(R)[None, :] < src_lengths[:, None]  # [B, R]
    h = jnp.where(mask[..., None], h, 0.0)
    count = jnp.maximum(jnp.sum(mask, axis=1, keepdims=True), 1)
    final = jnp.sum(h, axis=1) / count  # [B, He] the mean region feature
    return EncoderOutput(h, final, mask)


class Captioner(Seq2Seq):
  """The region encoder and a registered recurrent decoder (model.rnn.decoder); everything else
  is Seq2Seq's. model.rnn.emb_dim, dec_hidden, enc_hidden (x2 with bidirectional: the region
  feature size), cell, dropout and the attention settings take effect; model.max_src_len bounds
  the number of regions."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, compute_dtype: str = "float32"):
    self.cfg = cfg
    self.encoder = RegionEncoder(cfg, rngs=rngs, compute_dtype=compute_dtype)
    self.decoder = registries.DECODERS.get(cfg.rnn.decoder)(cfg, rngs=rngs,
                                                           compute_dtype=compute_dtype)


def build_captioner(cfg: ModelConfig, seed: int = 0, compute_dtype: str = "float32") -> Captioner:
  return Captioner(cfg, rngs=nnx.Rngs(params=seed), compute_dtype=compute_dtype)
