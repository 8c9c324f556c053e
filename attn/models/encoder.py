"""Recurrent cells (registered by name) and the (bi)directional multi-layer encoder.

Axis names: B batch, Ts source length, E embedding size, He encoder output size.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from attn.models.dropout import dropout
from attn.models.layers import mixed_cell
from attn.models import registries


@registries.CELLS.register("gru")
class GRU:
  """GRU (Cho et al. 2014); the carry is h."""
  gates = 3  # weight blocks of the input and recurrent matmuls (cost models)
  make = staticmethod(lambda d_in, d_hidden, rngs, compute_dtype="float32": mixed_cell(
      nnx.GRUCell(d_in, d_hidden, rngs=rngs), compute_dtype))
  carry_from_h = staticmethod(lambda h: h)
  h_of = staticmethod(lambda carry: carry)


@registries.CELLS.register("lstm")
class LSTM:
  """LSTM (Hochreiter & Schmidhuber 1997); the carry is (c, h), started from c = 0."""
  gates = 4
  make = staticmethod(lambda d_in, d_hidden, rngs, compute_dtype="float32": mixed_cell(
      nnx.OptimizedLSTMCell(d_in, d_hidden, rngs=rngs), compute_dtype))
  carry_from_h = staticmethod(lambda h: (jnp.zeros_like(h), h))
  h_of = staticmethod(lambda carry: carry[1])


class EncoderOutput(NamedTuple):
  """outputs: [B, Ts, He] (zeros past each length); final: [B, He] the fixed-vector summary
  (last forward state, and first backward state when bidirectional); mask: [B, Ts] bool."""
  outputs: jax.Array
  final: jax.Array
  mask: jax.Array


class Encoder(nnx.Module):
  """Embeddings + a stack of (bi)directional RNN layers with dropout between them.

  compute_dtype: the recurrent matmuls' operand dtype (attn.models.layers); parameters, the
  carry and the outputs stay float32."""

  def __init__(self, cfg, *, rngs: nnx.Rngs, compute_dtype: str = "float32"):
    self.cfg = cfg
    cell = registries.CELLS.get(cfg.rnn.cell)
    self.embed = nnx.Embed(cfg.src_vocab, cfg.rnn.emb_dim, rngs=rngs)
    layers = []
    d_in = cfg.rnn.emb_dim
    for _ in range(cfg.enc_layers):
      fwd = nnx.RNN(cell.make(d_in, cfg.rnn.enc_hidden, rngs, compute_dtype), return_carry=True)
      if cfg.rnn.bidirectional:
        bwd = nnx.RNN(cell.make(d_in, cfg.rnn.enc_hidden, rngs, compute_dtype), return_carry=True,
                      reverse=True, keep_order=True)
        layers.append(nnx.Bidirectional(fwd, bwd, return_carry=True))
      else:
        layers.append(fwd)
      d_in = cfg.rnn.enc_out_dim
    self.layers = nnx.List(layers)

  def __call__(self, src, src_lengths, *, dropout_key=None, embed_offset=None) -> EncoderOutput:
    """src: [B, Ts] int ids; src_lengths: [B]; embed_offset: optional [B, Ts, E] added to the
    embeddings (attribution methods differentiate with respect to it)."""
    cfg, h_of = self.cfg, registries.CELLS.get(self.cfg.rnn.cell).h_of
    keys = [None] * (cfg.enc_layers + 1) if dropout_key is None else list(
        jax.random.split(dropout_key, cfg.enc_layers + 1))
    mask = jnp.arange(src.shape[1])[None, :] < src_lengths[:, None]  # [B, Ts]
    x = self.embed(src)  # [B, Ts, E]
    if embed_offset is not None:
      x = x + embed_offset
    x = dropout(x, cfg.dropout, keys[0])
    for layer, key in zip(self.layers, keys[1:]):
      carry, x = layer(x, seq_lengths=src_lengths)  # x: [B, Ts, He]
      x = jnp.where(mask[..., None], x, 0.0)
      if key is not None and layer is not self.layers[-1]:
        x = dropout(x, cfg.dropout, key)
    if cfg.rnn.bidirectional:
      final = jnp.concatenate([h_of(carry[0]), h_of(carry[1])], axis=-1)  # [B, He]
    else:
      final = h_of(carry)
    return EncoderOutput(x, final, mask)
