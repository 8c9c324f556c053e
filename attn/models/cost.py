"""Analytic matmul FLOPs of a seq2seq training step, from the registry's cost facts.

The cell's `gates`, the decoder's `cell_input_dim` / `readout_flops` / `attention_dims` and the
score's `cost` (attn.scores.ScoreCost) each come from that variant's own entry, so a new decoder
or score brings its cost with it.
"""

from __future__ import annotations

from attn import registry
from attn.models.config import ModelConfig


def forward_flops(mc: ModelConfig, B: int, Ts: int, Tt: int) -> int:
  """Matmul FLOPs of the forward pass on a padded batch [B, Ts] -> [B, Tt]."""
  gates = registry.get(mc.cell, "cell").fn.gates
  decoder = registry.get(mc.decoder, "decoder").fn
  dirs = 2 if mc.bidirectional else 1
  per_src, d_in = 0, mc.emb_dim
  for _ in range(mc.enc_layers):
    per_src += dirs * 2 * gates * mc.enc_hidden * (d_in + mc.enc_hidden)
    d_in = mc.enc_out_dim
  D = mc.dec_hidden
  per_tgt = 2 * gates * D * (decoder.cell_input_dim(mc) + D)
  per_tgt += (mc.dec_layers - 1) * 2 * gates * D * 2 * D
  per_tgt += decoder.readout_flops(mc) + 2 * D * mc.tgt_vocab  # readout, output layer
  per_pair = 0
  if decoder.has_attention:
    dq, dk, key_proj = decoder.attention_dims(mc)
    cost = registry.get(mc.score, "score").cost(dq, dk, mc.d_attn)
    per_src += key_proj + cost.per_key  # keys prepared once per source token
    per_tgt += cost.per_query
    per_pair = cost.per_pair + 2 * mc.enc_out_dim  # the score and the weighted sum of values
  return B * Ts * per_src + B * Tt * (per_tgt + Ts * per_pair)


def train_step_flops(mc: ModelConfig, B: int, Ts: int, Tt: int) -> int:
  """Forward + backward (counted as twice the forward)."""
  return 3 * forward_flops(mc, B, Ts, Tt)
