"""The GNMT penalties beam search ranks finished hypotheses by (Wu et al. 2016, eq. 14): a
hypothesis Y of source X scores log P(Y|X) / lp(|Y|) + cp(X; Y)."""

from __future__ import annotations

import jax.numpy as jnp

# Lower clamp of a source position's coverage sum in the GNMT coverage penalty. Eq. 14 has
# log(min(c, 1)), which is -inf for c = 0; OpenNMT-py's "wu" penalty leaves it so (the score of
# the hypothesis becomes -inf), and TF seq2seq / OpenNMT-tf replace an exact 0 by 1, so that an
# unattended position costs nothing while a barely attended one costs a lot. Neither fits here:
# sparsemax and entmax attention give exact zeros all the time, and padding is masked by
# source_lengths instead. A floor keeps the penalty finite and monotone in coverage; at 1e-6 it
# treats a position that got under a millionth of a word's attention over the whole output as
# uncovered whatever the normalizer, and bounds what one position costs at beta * log(1e-6)
# = -13.8 beta.
COVERAGE_FLOOR = 1e-6


def gnmt_length_penalty(length, alpha):
  """GNMT length penalty lp(L) = ((5 + L) / 6)^alpha (Wu et al. 2016, eq. 14); 1 for alpha = 0.

  A hypothesis' beam score is log P(y) / lp(|y|), |y| counting EOS.
  """
  if alpha == 0:  # exactly 1: beam search with K = 1 then equals greedy bit for bit
    return jnp.ones_like(jnp.asarray(length, jnp.float32))
  return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


def gnmt_coverage_penalty(weights, source_lengths, beta):
  """GNMT coverage penalty cp = beta * sum_{i < |X|} log(min(sum_t a_{t,i}, 1)) (Wu et al. 2016,
  eq. 14), each coverage sum clamped from below at COVERAGE_FLOOR (see there).

  weights: [..., T, Ts] attention history of hypotheses (zeros after EOS; the EOS step counts);
  source_lengths: int array broadcastable to [...], |X| per hypothesis (positions >= |X| are
  padding and left out). Returns [...] float32, always <= 0 (0 when beta = 0 or |X| = 0).
  """
  coverage = jnp.sum(jnp.asarray(weights, jnp.float32), axis=-2)                 # [..., Ts]
  inside = jnp.arange(coverage.shape[-1]) < jnp.asarray(source_lengths)[..., None]
  log_cov = jnp.log(jnp.clip(coverage, COVERAGE_FLOOR, 1.0))                     # [..., Ts] <= 0
  return beta * jnp.sum(jnp.where(inside, log_cov, 0.0), axis=-1)
