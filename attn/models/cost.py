"""Matmul FLOPs of a seq2seq training step: analytic, from the registry's cost facts, and
counted on the traced step (`jaxpr_matmuls`), which checks the analytic count.

The cell's `gates`, the decoder's `cell_input_dim` / `readout_flops` / `attention_dims` and the
score's `cost` (attn.scores.ScoreCost) each come from that variant's own entry, so a new decoder
or score brings its cost with it.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import numpy as np

from attn import registry
from attn.models.config import ModelConfig
from attn.models import registries


def forward_flops(mc: ModelConfig, B: int, Ts: int, Tt: int) -> int:
  """Matmul FLOPs of the forward pass on a padded batch [B, Ts] -> [B, Tt], by the model's
  architecture (each registered arch names its count as `forward_flops`)."""
  return registries.ARCHS.get(mc.arch).forward_flops(mc, B, Ts, Tt)


def recurrent_forward_flops(mc: ModelConfig, B: int, Ts: int, Tt: int) -> int:
  """The RNN encoder-decoder's forward matmul FLOPs (model.arch=rnn)."""
  gates = registries.CELLS.get(mc.rnn.cell).gates
  decoder = registries.DECODERS.get(mc.rnn.decoder)
  dirs = 2 if mc.rnn.bidirectional else 1
  per_src, d_in = 0, mc.rnn.emb_dim
  for _ in range(mc.enc_layers):
    per_src += dirs * 2 * gates * mc.rnn.enc_hidden * (d_in + mc.rnn.enc_hidden)
    d_in = mc.rnn.enc_out_dim
  D = mc.rnn.dec_hidden
  per_tgt = 2 * gates * D * (decoder.cell_input_dim(mc) + D)
  per_tgt += (mc.dec_layers - 1) * 2 * gates * D * 2 * D
  per_tgt += decoder.readout_flops(mc) + 2 * D * mc.tgt_vocab  # readout, output layer
  per_pair = 0
  if decoder.has_attention:
    dq, dk, key_proj = decoder.attention_dims(mc)
    cost = registry.get(mc.rnn.score, "score").cost(dq, dk, mc.rnn.d_attn)
    per_src += key_proj + cost.per_key  # keys prepared once per source token
    per_tgt += cost.per_query
    per_pair = cost.per_pair + 2 * mc.rnn.enc_out_dim  # the score and the weighted sum of values
  return B * Ts * per_src + B * Tt * (per_tgt + Ts * per_pair)


def _heads_pair_flops(mc: ModelConfig, field: str, Tq: int, Tk: int) -> tuple[int, int, int]:
  """One Transformer attention's per-key, per-query and all-pairs FLOPs (every head): the
  role's score (attn.scores.ScoreCost at head size, d_attn = head size as the model builds it)
  and the weighted sum of values. Every query-key pair of the padded [Tq, Tk] grid is counted:
  masks (padding, causality) do not skip work in the dense path."""
  role = getattr(mc.transformer, field)
  if not registry.get(role.scope, "scope").all_pairs:  # banded, top-k, linear: other pair sets
    raise ValueError(
        f"the analytic count covers global attention; model.transformer.{field}.scope="
        f"{role.scope!r} forms "
        "another set of pairs (count the traced step: jaxpr_flops)")
  H, dh = mc.transformer.num_heads, mc.transformer.d_head
  c = registry.get(role.score, "score").cost(dh, dh, dh)
  return H * c.per_key, H * c.per_query, H * Tq * Tk * (c.per_pair + 2 * dh)


def transformer_forward_flops(mc: ModelConfig, B: int, Ts: int, Tt: int) -> int:
  """The Transformer's forward matmul FLOPs (model.arch=transformer): per layer the q/k/v/o
  projections (4 · 2d² per token; cross-attention's k/v once per source token), the scores and
  weighted sums over the padded grid, the feed-forward (2 · 2 d d_ff per token); then the
  output layer (2 d V per target token). LayerNorm, softmax and the embedding lookups (gathers)
  are not matmuls and count nothing."""
  d, F = mc.transformer.d_model, mc.transformer.d_ff
  proj, ff = 2 * d * d, 2 * 2 * d * F
  k_enc, q_enc, pairs_enc = _heads_pair_flops(mc, "enc_self", Ts, Ts)
  enc = Ts * (4 * proj + ff + k_enc + q_enc) + pairs_enc
  k_self, q_self, pairs_self = _heads_pair_flops(mc, "dec_self", Tt, Tt)
  k_cross, q_cross, pairs_cross = _heads_pair_flops(mc, "cross", Tt, Ts)
  dec = (Tt * (4 * proj + k_self + q_self + 2 * proj + q_cross + ff) + pairs_self
         + Ts * (2 * proj + k_cross) + pairs_cross)
  return B * (mc.enc_layers * enc + mc.dec_layers * dec + Tt * 2 * d * mc.tgt_vocab)


def output_layer_flops(mc: ModelConfig, B: int, Tt: int) -> int:
  """The [D, V] output layer's share of train_step_flops (forward + 2x backward), D the
  width the architecture feeds it (`output_width`)."""
  D = registries.ARCHS.get(mc.arch).output_width(mc)
  return 3 * 2 * B * Tt * D * mc.tgt_vocab


def train_step_flops(mc: ModelConfig, B: int, Ts: int, Tt: int) -> int:
  """Forward + backward, the backward counted as twice the forward: every matmul y = x W has
  two transposes, dx = dy W^T and dW = x^T dy, each as large as the forward one. That holds
  for every matmul of the step, the encoder's first layer included (its dx is the embeddings'
  gradient); the embedding lookups are gathers, not matmuls, and count nothing. Checked against
  the traced step's dot_generals (`jaxpr_matmuls`) in tests/test_mixed_precision.py; the
  traced step does ~1% more at the multi30k preset's sizes: it recomputes the attention in the
  backward pass (decoders.AttentionMixin.attend) and runs the bridge s_0 = tanh(W h_enc) once
  per sentence, neither counted here (and the additive score's per-pair add and tanh are
  counted as 2 d_attn FLOPs though they are not matmul work)."""
  return 3 * forward_flops(mc, B, Ts, Tt)


def unpadded_flops_per_token(mc: ModelConfig, src_len: np.ndarray, tgt_len: np.ndarray) -> float:
  """Training matmul FLOPs per target token when no slot is padding: every example a batch of
  one at its own lengths (src_len, tgt_len: [N] slots each example fills, target tokens EOS
  included). The floor any batching can reach with this model; `plan_flops_per_token` over a
  padded plan is above it by the padding's share of the work."""
  pairs, counts = np.unique(np.stack([src_len, tgt_len], 1), axis=0, return_counts=True)
  total = sum(int(c) * train_step_flops(mc, 1, int(s), int(t)) for (s, t), c in zip(pairs, counts))
  return total / float(np.sum(tgt_len))


def plan_flops_per_token(mc: ModelConfig, batches, tgt_len: np.ndarray) -> float:
  """Training matmul FLOPs per real target token over padded batches [(Ts, Tt, rows)] (rows:
  [B] example indices into tgt_len, -1 a filler row that counts work but no tokens)."""
  flops = tokens = 0
  for Ts, Tt, rows in batches:
    flops += train_step_flops(mc, len(rows), int(Ts), int(Tt))
    tokens += int(tgt_len[rows[rows >= 0]].sum())
  return flops / tokens


def dot_flops(lhs_shape, rhs_shape, dims) -> int:
  """2 M N K of one dot_general of operands `lhs_shape`, `rhs_shape` with dimension numbers
  `dims`: twice the result's size (batch x lhs free x rhs free) times the contracted size."""
  (lc, rc), (lb, rb) = dims
  free = lambda shape, skip: int(np.prod([n for i, n in enumerate(shape) if i not in skip]))
  out = (int(np.prod([lhs_shape[i] for i in lb])) * free(lhs_shape, set(lc) | set(lb))
         * free(rhs_shape, set(rc) | set(rb)))
  return 2 * out * int(np.prod([lhs_shape[i] for i in lc]))


class Matmul(NamedTuple):
  """One dot_general of a traced function: FLOPs (2 M N K per execution, times the trip counts
  of the scans around it), operand and result dtypes, the scan nesting depth, and its
  dimension_numbers (((lhs contracting, rhs contracting), (lhs batch, rhs batch)))."""
  flops: int
  lhs: jax.core.ShapedArray
  rhs: jax.core.ShapedArray
  out: jax.core.ShapedArray
  in_scan: int
  dims: tuple = ()

  @property
  def flops_per_call(self) -> int:
    """2 M N K: the FLOPs of one execution."""
    return dot_flops(self.lhs.shape, self.rhs.shape, self.dims)

  @property
  def executions(self) -> int:
    """How many times the step runs it: the trip counts of the scans around it."""
    return self.flops // self.flops_per_call


def jaxpr_matmuls(closed_jaxpr) -> list[Matmul]:
  """Every dot_general of a (closed) jaxpr, inside nested jaxprs too (jit, scan bodies times
  their length, custom_jvp/vjp bodies; the costlier branch of a cond). A while loop's trip
  count is unknown: it raises ValueError rather than count a guess."""
  return _walk(getattr(closed_jaxpr, "jaxpr", closed_jaxpr), 1, 0)


def _walk(jaxpr, mult, depth) -> list[Matmul]:
  out = []
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if name == "dot_general":
      dims = eqn.params["dimension_numbers"]
      lhs, rhs, res = eqn.invars[0].aval, eqn.invars[1].aval, eqn.outvars[0].aval
      out.append(Matmul(dot_flops(lhs.shape, rhs.shape, dims) * mult, lhs, rhs, res, depth, dims))
      continue
    if name == "while":
      if _walk(eqn.params["body_jaxpr"].jaxpr, 1, 0):
        raise ValueError("a while loop holds matmuls and its trip count is unknown")
      continue
    subs = [v for p in eqn.params.values() for v in (p if isinstance(p, (tuple, list)) else (p,))
            if hasattr(v, "eqns") or hasattr(getattr(v, "jaxpr", None), "eqns")]
    subs = [getattr(v, "jaxpr", v) for v in subs]
    if name == "cond":  # one branch runs: count the costliest
      counted = [_walk(b, mult, depth) for b in subs]
      out.extend(max(counted, key=lambda ms: sum(m.flops for m in ms), default=[]))
      continue
    length = eqn.params["length"] if name == "scan" else 1
    for sub in subs:
      out.extend(_walk(sub, mult * length, depth + (name == "scan")))
  return out


def jaxpr_flops(fn, *args) -> int:
  """Matmul FLOPs of fn(*args), counted on its jaxpr (`jaxpr_matmuls`)."""
  return sum(m.flops for m in jaxpr_matmuls(jax.make_jaxpr(fn)(*args)))
