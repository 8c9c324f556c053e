"""Recurrent cells (registered by name) and the (bi)directional multi-layer encoder.

Axis names: B batch, Ts source length, E embedding size, He encoder output size.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from attn.models.dropout import dropout
from attn.models.layers import mixed_cell, operand_dtype
from attn.models import recurrence, registries


@registries.CELLS.register("gru")
class GRU:
  """GRU (Cho et al. 2014); the carry is h."""
  gates = 3  # weight blocks of the input and recurrent matmuls (cost models)
  make = staticmethod(lambda d_in, d_hidden, rngs, compute_dtype="float32": mixed_cell(
      nnx.GRUCell(d_in, d_hidden, rngs=rngs), compute_dtype))
  carry_from_h = staticmethod(lambda h: h)
  h_of = staticmethod(lambda carry: carry)

  @staticmethod
  def step(cell: nnx.GRUCell, h, xi):
    """nnx.GRUCell's update from xi = cell.dense_i(x) computed beforehand: h [B, H], xi [B, 3H]
    -> h'. The same arithmetic as GRUCell.__call__ (its reset gate scales the bias-free
    recurrent candidate, dense_h(h)_n)."""
    return GRU.update(cell, h, xi, cell.dense_h(h))

  @staticmethod
  def update(cell: nnx.GRUCell, h, xi, hh):
    """The step from both products: xi = dense_i(x), hh = dense_h(h) [B, 3H] -> h'."""
    xr, xz, xn = jnp.split(xi, 3, axis=-1)
    hr, hz, hn = jnp.split(hh, 3, axis=-1)
    r, z = cell.gate_fn(xr + hr), cell.gate_fn(xz + hz)
    n = cell.activation_fn(xn + r * hn)
    return (1.0 - z) * n + z * h


@registries.CELLS.register("lstm")
class LSTM:
  """LSTM (Hochreiter & Schmidhuber 1997); the carry is (c, h), started from c = 0."""
  gates = 4
  make = staticmethod(lambda d_in, d_hidden, rngs, compute_dtype="float32": mixed_cell(
      nnx.OptimizedLSTMCell(d_in, d_hidden, rngs=rngs), compute_dtype))
  carry_from_h = staticmethod(lambda h: (jnp.zeros_like(h), h))
  h_of = staticmethod(lambda carry: carry[1])

  @staticmethod
  def step(cell: nnx.OptimizedLSTMCell, carry, xi):
    """nnx.OptimizedLSTMCell's update from xi = cell.dense_i(x) computed beforehand:
    carry (c, h) [B, H] each, xi [B, 4H] -> (c', h'). The same arithmetic as its __call__."""
    return LSTM.update(cell, carry, xi, cell.dense_h(carry[1]))

  @staticmethod
  def update(cell: nnx.OptimizedLSTMCell, carry, xi, hh):
    """The step from both products: xi = dense_i(x), hh = dense_h(h) (its bias included)."""
    c, _ = carry
    i, f, g, o = jnp.split(xi + hh, 4, axis=-1)
    c = cell.gate_fn(f) * c + cell.gate_fn(i) * cell.activation_fn(g)
    return c, cell.gate_fn(o) * cell.activation_fn(c)


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
      carry, x = self.run_layer(layer, x, src_lengths)  # x: [B, Ts, He]
      x = jnp.where(mask[..., None], x, 0.0)
      if key is not None and layer is not self.layers[-1]:
        x = dropout(x, cfg.dropout, key)
    if cfg.rnn.bidirectional:
      final = jnp.concatenate([h_of(carry[0]), h_of(carry[1])], axis=-1)  # [B, He]
    else:
      final = h_of(carry)
    return EncoderOutput(x, final, mask)

  def run_layer(self, layer, x, lengths):
    """One layer, as `layer(x, seq_lengths=lengths)` computes it (nnx.RNN or nnx.Bidirectional
    of nnx.RNNs): (final carry, or the (forward, backward) pair, and outputs [B, Ts, He]).

    The layers keep flax's modules, so parameters and checkpoints keep their layout, but the
    scan is ours: each direction's input projection dense_i runs once over all [B * Ts]
    positions before the scan, one large matmul (and one weight gradient) instead of Ts small
    ones whose weight gradients the backward scan adds up step by step; and the backward
    direction runs t = Ts-1..0 holding its initial carry past each length instead of flipping
    every sequence with a gather. The scans read time-major arrays: x [B, Ts, d] is turned once
    (d is the narrowest width here), rather than each direction's [B, Ts, gates * H] projection,
    and the directions' outputs are joined time-major and turned back once."""
    xt = jnp.swapaxes(x, 0, 1)  # [Ts, B, d]
    if isinstance(layer, nnx.Bidirectional):
      carry_f, out_f = _scan_direction(self.cfg.rnn.cell, layer.forward_rnn.cell, xt, lengths,
                                       reverse=False)
      carry_b, out_b = _scan_direction(self.cfg.rnn.cell, layer.backward_rnn.cell, xt, lengths,
                                       reverse=True)
      return (carry_f, carry_b), jnp.swapaxes(jnp.concatenate([out_f, out_b], axis=-1), 0, 1)
    carry, out = _scan_direction(self.cfg.rnn.cell, layer.cell, xt, lengths, reverse=False)
    return carry, jnp.swapaxes(out, 0, 1)


def _scan_direction(cell_name: str, cell, xt, lengths, *, reverse: bool):
  """One direction of a recurrent layer over right-padded sequences. xt: [T, B, d] (time-major);
  lengths: [B]. Returns (the carry after each sequence's last step in scan order, outputs
  [T, B, H]: the state after each position; past a length, the forward direction repeats its
  last state and the backward one its initial zeros).

  The recurrent weight's gradient is one product after the loop (attn.models.recurrence)."""
  kind = registries.CELLS.get(cell_name)
  T, B, _ = xt.shape
  xi = cell.dense_i(xt)  # [T, B, gates * H]
  carry0 = kind.carry_from_h(jnp.zeros((B, cell.hidden_features), jnp.float32))
  graphdef, params = nnx.split(cell)

  def body(products, operands, carry, inputs):
    params, lengths = operands
    cell = nnx.merge(graphdef, params)
    xi_t, t = inputs
    hh = products("dense_h", kind.h_of(carry))
    if cell.dense_h.bias is not None:
      hh = hh + cell.dense_h.bias[...]
    new = kind.update(cell, carry, xi_t, hh)
    live = (t < lengths)[:, None]  # [B, 1]: positions past a length leave the carry as it was
    carry = jax.tree.map(lambda a, b: jnp.where(live, a, b), new, carry)
    return carry, kind.h_of(carry)

  weights = {"dense_h": cell.dense_h.kernel[...]}
  return recurrence.scan(body, weights, (params, lengths), carry0, (xi, jnp.arange(T)),
                         dtype=operand_dtype(cell.dense_h), reverse=reverse)
