"""Summarization's constraints on what a search may emit, as bans (log-prob -inf) on a step's
log-probs: `min_len` (no EOS before min_len tokens, EOS counted) and `block_repeat_ngram` (no token
that would repeat an n-gram of the hypothesis' own generated tokens, Paulus et al. 2018). Both
off (0) leave the log-probs untouched, so the searches then run the program they ran without them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from attn.decoding.step import NEG_INF


def check_constraints(max_len, min_len, block_repeat_ngram):
  for name, v in (("min_len", min_len), ("block_repeat_ngram", block_repeat_ngram)):
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
      raise ValueError(f"{name} must be a Python int >= 0 (static), got {v!r}")
  if min_len > max_len:
    raise ValueError(f"min_len={min_len} > max_len={max_len}: no hypothesis could end")


def repeated_ngram_mask(seqs, t, n, vocab_size):
  """[R, V] bool: True for every token y such that seqs[r, t-n+1 : t] + [y] is an n-gram that
  already occurs in seqs[r, :t] (trigram blocking for n = 3, Paulus et al. 2018).

  seqs: [R, T] int32, generated tokens (no BOS); only positions < t are read. t: [] int32.
  Static shapes: the n-1 most recent tokens are compared with every window seqs[s : s+n-1],
  s <= t-n (windows whose following token is already generated), and the token following each
  matching window is scattered into the mask.
  """
  R, T = seqs.shape
  S = T - n + 1                                             # windows seqs[s : s+n], s < S
  if S <= 0:
    return jnp.zeros((R, vocab_size), bool)
  match = jnp.broadcast_to(jnp.arange(S) <= t - n, (R, S))  # [R, S]; none while t < n
  for j in range(n - 1):
    # Index clamped at 0 while t < n-1: no window matches then anyway.
    recent = jax.lax.dynamic_index_in_dim(seqs, jnp.maximum(t - (n - 1) + j, 0), axis=1,
                                          keepdims=False)  # [R]
    match = match & (seqs[:, j:j + S] == recent[:, None])
  follow = seqs[:, n - 1:n - 1 + S]                         # [R, S] the token after each window
  return jnp.zeros((R, vocab_size), bool).at[jnp.arange(R)[:, None], follow].max(match)


def constrain(logp, t, seqs, *, min_len, ngram, eos_id):
  """log_probs [R, V] with min_len and n-gram blocking applied for output position t ([] int32),
  given the generated tokens seqs [R, T]. Banned tokens get -inf.

  Neither constraint can leave a row without a possible token. EOS is never n-gram blocked (ending
  repeats no content), so it is the way out of a row whose every other token is blocked; if the
  model itself gives EOS -inf there, that row keeps its unblocked log-probs rather than picking
  an impossible token. min_len's EOS ban is likewise dropped on a row where every other token is
  impossible: the hypothesis then ends before min_len (only possible when all V - 1 other tokens
  are blocked or have probability 0, i.e. with tiny vocabularies).
  """
  if ngram:
    banned = repeated_ngram_mask(seqs, t, ngram, logp.shape[-1]).at[:, eos_id].set(False)
    blocked = jnp.where(banned, NEG_INF, logp)
    logp = jnp.where(jnp.any(blocked > NEG_INF, axis=-1, keepdims=True), blocked, logp)
  if min_len > 1:  # at min_len <= 1 every EOS already makes at least min_len tokens
    no_eos = logp.at[:, eos_id].set(NEG_INF)
    ban_eos = (t + 1 < min_len) & jnp.any(no_eos > NEG_INF, axis=-1, keepdims=True)  # [R, 1]
    logp = jnp.where(ban_eos, no_eos, logp)
  return logp
