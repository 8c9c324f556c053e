"""The pointer-generator's output distribution and the coverage loss (See et al. 2017), as pure
functions of what the decoder returns.

Axis names: B batch, Tt target steps, Ts source length, V vocabulary, Ve = V + Ts the
source-extended vocabulary: id V + k is the k-th distinct out-of-vocabulary word of that
example's source (attn.data: batch["src_ext"], batch["tgt_ext"]).

    P(w) = p_gen P_vocab(w) + (1 - p_gen) sum_{i: x_i = w} a_i

is formed in log space: log p_gen + log_softmax(logits) and log(1 - p_gen) + log(copy mass), with
p_gen = sigmoid(z) entering as log_sigmoid(z) and log_sigmoid(-z), combined by logaddexp. A word
out of the vocabulary has no vocabulary term (-inf), a word not in the source no copy term.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from attn.errors import ConfigError
from attn.models import registries


def check_config(cfg) -> None:
  """model.rnn.pointer and .coverage need attention formed one step at a time (coverage: the
  additive score, which it enters; both: the weights themselves, so no fused kernel)."""
  r = cfg.rnn
  if not (r.pointer or r.coverage):
    return
  which = "model.rnn.pointer" if r.pointer else "model.rnn.coverage"
  decoder = registries.DECODERS.get(r.decoder)
  if not decoder.has_attention:
    raise ConfigError(f"{which}=True needs an attention decoder (bahdanau or luong), "
                      f"not decoder={r.decoder!r}")
  if cfg.fused:
    raise ConfigError(f"{which}=True needs the attention weights, which model.fused=True "
                      "never forms")
  why = r.coverage and decoder.coverage_unsupported(cfg)
  if why:
    raise ConfigError(f"model.rnn.coverage=True: {why}")
  if r.coverage_loss_weight < 0:
    raise ConfigError(f"model.rnn.coverage_loss_weight={r.coverage_loss_weight} must be >= 0")


def _log_or_neg_inf(x):
  """log x, -inf where x == 0, with a finite gradient everywhere (the double-where guard)."""
  positive = x > 0
  return jnp.where(positive, jnp.log(jnp.where(positive, x, 1.0)), -jnp.inf)


def gold_log_prob(logits, p_gen_logit, weights, src_ext, tgt_ext):
  """log P(y_t) of the gold tokens under the pointer-generator.

  logits: [B, Tt, V]; p_gen_logit: [B, Tt]; weights: [B, Tt, Ts] (attention, rows sum to 1 over
  the source); src_ext: [B, Ts] and tgt_ext: [B, Tt] ids on the extended vocabulary.
  Returns [B, Tt] float32.
  """
  logits = logits.astype(jnp.float32)
  V = logits.shape[-1]
  z = p_gen_logit.astype(jnp.float32)
  in_vocab = tgt_ext < V
  z_y = jnp.take_along_axis(logits, jnp.where(in_vocab, tgt_ext, 0)[..., None], axis=-1)[..., 0]
  log_vocab = jnp.where(in_vocab, z_y - jax.nn.logsumexp(logits, axis=-1), -jnp.inf)
  same = src_ext[:, None, :] == tgt_ext[:, :, None]  # [B, Tt, Ts]: source positions holding y_t
  copy = jnp.sum(jnp.where(same, weights.astype(jnp.float32), 0.0), axis=-1)
  return jnp.logaddexp(jax.nn.log_sigmoid(z) + log_vocab,
                       jax.nn.log_sigmoid(-z) + _log_or_neg_inf(copy))


def extended_log_probs(logits, p_gen_logit, weights, src_ext):
  """The whole distribution over the extended vocabulary, for decoding.

  logits: [B, V]; p_gen_logit: [B]; weights: [B, Ts]; src_ext: [B, Ts].
  Returns log P [B, V + Ts] float32 (sums to 1 in probability; -inf for ids nothing can produce).
  """
  logits = logits.astype(jnp.float32)
  B, V = logits.shape
  Ts = weights.shape[-1]
  z = p_gen_logit.astype(jnp.float32)[:, None]
  log_vocab = jnp.concatenate([jax.nn.log_softmax(logits, axis=-1),
                               jnp.full((B, Ts), -jnp.inf, jnp.float32)], axis=-1)
  # The copy mass of a word is the attention summed over every position holding it.
  copy = jax.vmap(lambda ids, w: jnp.zeros((V + Ts,), jnp.float32).at[ids].add(w))(
      src_ext, weights.astype(jnp.float32))
  return jnp.logaddexp(jax.nn.log_sigmoid(z) + log_vocab,
                       jax.nn.log_sigmoid(-z) + _log_or_neg_inf(copy))


def coverage(weights):
  """c^t = sum_{t' < t} a^{t'}: [B, Tt, Ts] -> [B, Tt, Ts] (zeros at t = 0)."""
  earlier = jnp.cumsum(weights, axis=1)
  return jnp.concatenate([jnp.zeros_like(earlier[:, :1]), earlier[:, :-1]], axis=1)


def coverage_loss(weights, tgt_mask):
  """sum over target tokens of sum_i min(a^t_i, c^t_i) (See et al. eq. 12), float32 scalar.
  weights: [B, Tt, Ts]; tgt_mask: [B, Tt] (1 for real target tokens, EOS included)."""
  w = weights.astype(jnp.float32)
  per_step = jnp.sum(jnp.minimum(w, coverage(w)), axis=-1)  # [B, Tt]
  return jnp.sum(per_step * tgt_mask)
