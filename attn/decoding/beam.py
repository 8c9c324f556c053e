"""Beam search with the GNMT length and coverage penalties, as one `lax.while_loop` that stops
once every example's search is done by its stop rule (`STOP_RULES`: by default, once no live
hypothesis can beat the worst finished one; see the package docstring for step_fn and the
outputs)."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from attn.data.tokens import BOS as BOS_ID, EOS as EOS_ID, PAD as PAD_ID
from attn.decoding.constraints import check_constraints, constrain
from attn.decoding.penalties import gnmt_coverage_penalty, gnmt_length_penalty
from attn.decoding.settings import Search
from attn.decoding.step import (NEG_INF, DecodeOutput, NBest, StepFn, check_room, check_sizes,
                                f32_extras, step_shapes, tile_beams, unpack)


class _BeamCarry(NamedTuple):
  t: jax.Array          # [] int32, tokens generated so far by every live hypothesis
  state: Any            # leaves [B*K, ...], row b*K + k = live beam k of example b
  live_last: jax.Array  # [B, K] int32, last token of each live hypothesis (BOS at t = 0)
  live_logp: jax.Array  # [B, K] float32, log P(prefix); -inf for empty slots
  live_seqs: jax.Array  # [B, K, T] int32
  live_w: jax.Array     # [B, K, T, Ts] float32
  live_x: dict          # name -> [B, K, T] float32 ({} without extras)
  fin_seqs: jax.Array   # [B, K, T] int32, finished (EOS-terminated) hypotheses, best first
  fin_w: jax.Array      # [B, K, T, Ts]
  fin_x: dict           # name -> [B, K, T]
  fin_logp: jax.Array   # [B, K]
  fin_score: jax.Array  # [B, K], fin_logp / lp(fin_len) + cp(fin_w); -inf for empty slots
  fin_len: jax.Array    # [B, K] int32


def _gather(x, idx):
  """x: [B, N, ...], idx: [B, M] -> [B, M, ...] (per-example gather along the beam axis)."""
  return jax.vmap(lambda xb, ib: xb[ib])(x, idx)


def _top_k(scores, leaves, k):
  """The k best entries along axis 1 of every array in the pytree `leaves`, by `scores` [B, N]."""
  _, idx = jax.lax.top_k(scores, k)  # ties: lowest index first
  return jax.tree.map(lambda x: _gather(x, idx), leaves)


def _chunk_width(N: int, around: int = 64) -> int:
  """The width of `_top_k_wide`'s chunks for rows of N: the divisor of N nearest `around`
  within [3/4, 3/2] of it, so that the rows split into chunks as they are (at K = 5 and a
  vocabulary of 5,908, 70 divides the 29,540 candidates); `around` when none does (the rows
  are then padded, a copy of every candidate a step)."""
  fits = [c for c in range(around * 3 // 4, around * 3 // 2 + 1) if N % c == 0]
  return min(fits, key=lambda c: abs(c - around)) if fits else around


def _top_k_wide(x, k: int, chunk: int | None = None):
  """jax.lax.top_k(x, k) for x [B, N] with N much larger than k: the same values and indices,
  ties to the lowest index. XLA:CPU's top-k walks each row on one thread; here a vectorized max
  over chunks of `chunk` entries (`_chunk_width` when None) picks the k chunks with the
  largest maxima (every one of the k best lies in one of them: a chunk left out has k chunks
  at least as good before it in the tie order), and the top-k runs over those k * chunk
  entries only."""
  B, N = x.shape
  chunk = chunk or _chunk_width(N)
  n = -(-N // chunk)
  if n <= 4 * k:
    return jax.lax.top_k(x, k)
  if n * chunk > N:
    x = jnp.pad(x, ((0, 0), (0, n * chunk - N)), constant_values=NEG_INF)
  blocks = x.reshape(B, n, chunk)
  _, best = jax.lax.top_k(blocks.max(-1), k)                   # [B, k] chunks
  # In index order, so that ties keep resolving to the lowest (a top-k of the negated k
  # indices: XLA:CPU would run jnp.sort as a general sort).
  best = -jax.lax.top_k(-best, k)[0]
  vals, pos = jax.lax.top_k(jnp.take_along_axis(blocks, best[:, :, None], 1).reshape(B, -1), k)
  return vals, jnp.take_along_axis(best, pos // chunk, 1) * chunk + pos % chunk


def _concat(a, b):
  """Concatenates two pytrees of [B, N, ...] arrays along the beam axis."""
  return jax.tree.map(lambda x, y: jnp.concatenate([x, y], 1), a, b)


def _finished(c: _BeamCarry) -> list:
  """The finished hypotheses' fields, in the order the merges below keep them."""
  return [c.fin_seqs, c.fin_w, c.fin_logp, c.fin_score, c.fin_len, c.fin_x]


def _stop_at_bound(beam: "_Beam", c: _BeamCarry):
  """[B] bool: the example's K best are final (no live hypothesis can enter them)."""
  worst_fin = c.fin_score[:, -1]                              # [B]; -inf while a slot is empty
  # Upper bound on any live future: log P only falls and lp(n) <= lp(T) for n <= T (alpha >= 0),
  # so log P / lp(n) <= live_logp / lp(T). Dividing by lp(t) instead would exit too early.
  # The coverage penalty keeps it a bound: cp <= 0 (coverage is clamped to at most 1, so each
  # log term is <= 0), so log P / lp(n) + cp <= live_logp / lp(T) too. min_len and n-gram
  # blocking only set log-probs to -inf, which keeps log P falling.
  best_live = c.live_logp[:, 0] / beam.lp_max
  return worst_fin > best_live


def _stop_at_k_finished(beam: "_Beam", c: _BeamCarry):
  """[B] bool: K hypotheses of the example have finished (ended in EOS)."""
  del beam
  return c.fin_score[:, -1] > NEG_INF


# When an example's search is done: its K finished hypotheses, ranked by score, are then its
# result, and nothing after that step changes them (it may leave a shrinking batch).
STOP_RULES = {
    # Exact: the K best under the score are final, so stopping changes nothing (the result of
    # running all max_len steps).
    "bound": _stop_at_bound,
    # K hypotheses have finished, whatever the live ones might still reach: the rule of
    # fairseq's beam search, of JoeyNMT's (an example ends once its K beams have ended), and of
    # Hugging Face's early_stopping=True. Fewer steps; a live hypothesis that would have
    # finished later with a better score is lost.
    "k_finished": _stop_at_k_finished,
}


def check_stop(stop: str) -> None:
  if stop not in STOP_RULES:
    raise ValueError(f"stop={stop!r} is not a beam search stop rule; known: "
                     f"{', '.join(STOP_RULES)}")


@dataclasses.dataclass(frozen=True)
class _Beam:
  """One beam search: its static sizes and settings, and the pieces of its loop.

  B, K, T: batch, beam and output sizes; V, Ts: step_fn's vocabulary and source widths. alpha,
  beta: the GNMT length and coverage penalties; src_len: [B, 1] |X| per example (broadcast over
  the beams; None when beta = 0). lp_max: lp(T), the largest length penalty a hypothesis can get.
  stop: the name of the rule (`STOP_RULES`) that says when an example's search is done.
  """
  step_fn: StepFn
  B: int
  K: int
  T: int
  V: int
  Ts: int
  alpha: float
  beta: float
  src_len: Any
  lp_max: Any
  min_len: int
  ngram: int
  eos_id: int
  early_exit: bool
  stop: str

  def lp(self, n):
    return gnmt_length_penalty(n, self.alpha)

  def rank(self, logp, penalty, hist):
    """Ranking score [B, M] of hypotheses with log P [B, M], length penalty lp(|Y|) and attention
    history [B, M, T, Ts]."""
    score = logp / penalty
    if self.beta > 0:
      score = score + gnmt_coverage_penalty(hist, self.src_len, self.beta)
    return score

  def done(self, c: _BeamCarry):
    """[B] bool: the example's search is done by the stop rule; its K finished hypotheses no
    longer change."""
    return STOP_RULES[self.stop](self, c)

  def cond(self, c: _BeamCarry):
    if not self.early_exit:
      return c.t < self.T
    return (c.t < self.T) & ~jnp.all(self.done(c))

  def cond_above(self, rows: int):
    """cond, and more than `rows` examples still searching."""
    return lambda c: self.cond(c) & (jnp.sum(~self.done(c)) > rows)

  def body(self, c: _BeamCarry) -> _BeamCarry:
    B, K, T, V = self.B, self.K, self.T, self.V
    new_state, logp, w, xs = unpack(self.step_fn(c.state, c.live_last.reshape(B * K)))
    logp = logp.astype(jnp.float32)
    logp = constrain(logp, c.t, c.live_seqs.reshape(B * K, T), min_len=self.min_len,
                     ngram=self.ngram, eos_id=self.eos_id)
    logp = logp.reshape(B, K, V)
    w = w.astype(jnp.float32)[:, :self.Ts].reshape(B, K, self.Ts)
    xs = f32_extras(xs, (B, K))                                # name -> [B, K]

    # The 2K best one-token extensions of the K live hypotheses.
    cand = (c.live_logp[:, :, None] + logp).reshape(B, K * V)  # [B, K*V]
    # The barrier keeps XLA from folding the slices below into the top-k: on CPU (jax 0.10.2),
    # top-k outputs sliced in more than one way are not matched back to the TopK kernel and run
    # as a full sort of the K*V candidates, ~100x slower at V = 8000 (35 s vs 0.3 s for B = 64,
    # K = 5, T = 50 with a trivial step).
    top_logp, top_idx = jax.lax.optimization_barrier(_top_k_wide(cand, 2 * K))  # [B, 2K]
    parent = top_idx // V                                      # [B, 2K] live beam index
    tok = (top_idx % V).astype(jnp.int32)                      # [B, 2K]
    is_eos = tok == self.eos_id
    extend = functools.partial(self.extend, c, parent, tok, w, xs)
    fin = self.finish(c, top_logp, is_eos, extend)

    # Live: the best K non-EOS candidates (2K hold at most K EOS ones), with their parents'
    # decoder state, tokens, attention and extras histories.
    live_key = jnp.where(is_eos, NEG_INF, top_logp)
    _, sel = jax.lax.top_k(live_key, K)                        # [B, K] into the 2K
    live_seqs, live_w, live_x = extend(sel)
    live_parent = _gather(parent, sel)
    flat = (jnp.arange(B)[:, None] * K + live_parent).reshape(B * K)
    # A leaf step_fn hands back untouched (the encoder memory, a source's keys and values) is
    # the same for the K beams of an example from the start (`start` tiles it) and stays so, so
    # reordering it within the example is the identity: skipping that copy of the [B*K, Ts, ..]
    # memory at every step changes nothing in the result.
    state = jax.tree.map(lambda old, x: x if x is old else x[flat], c.state, new_state)
    fin_seqs, fin_w, fin_logp, fin_score, fin_len, fin_x = fin
    return _BeamCarry(t=c.t + 1, state=state, live_last=_gather(tok, sel),
                      live_logp=_gather(live_key, sel),
                      live_seqs=live_seqs, live_w=live_w, live_x=live_x, fin_seqs=fin_seqs,
                      fin_w=fin_w, fin_x=fin_x, fin_logp=fin_logp, fin_score=fin_score,
                      fin_len=fin_len)

  @staticmethod
  def extend(c, parent, tok, w, xs, idx):
    """Tokens, attention and extras histories [B, M, T(, Ts)] of candidates idx [B, M] (into
    the 2K of parents `parent` and tokens `tok`, [B, 2K]); w [B, K, Ts] and xs (name -> [B, K])
    are this step's attention and extras of the live beams."""
    p, y = _gather(parent, idx), _gather(tok, idx)
    put = lambda hist, now: jax.lax.dynamic_update_index_in_dim(
        _gather(hist, p), _gather(now, p), c.t, axis=2)
    seqs = jax.lax.dynamic_update_index_in_dim(_gather(c.live_seqs, p), y, c.t, axis=2)
    return seqs, put(c.live_w, w), {k: put(c.live_x[k], v) for k, v in xs.items()}

  def finish(self, c, top_logp, is_eos, extend) -> list:
    """The K best finished hypotheses' fields (as `_finished`) after this step: the EOS
    candidates among the best K of the 2K (top_logp, is_eos: [B, 2K]) merged with those finished
    before. Only the first K candidates can finish, so only their histories are built (half the
    copying)."""
    B, K = self.B, self.K
    first_k = jnp.broadcast_to(jnp.arange(K), (B, K))
    # A done example's rows may still be computed (the rest of its batch searches on), but its
    # finished list is its result: nothing joins it any more. Under the exact bound nothing
    # could; under k_finished a later, better hypothesis would.
    finishing = (is_eos[:, :K] & (top_logp[:, :K] > NEG_INF)
                 & ~self.done(c)[:, None])
    new_seqs, new_hist, new_x = extend(first_k)
    new_score = jnp.where(finishing, self.rank(top_logp[:, :K], self.lp(c.t + 1), new_hist),
                          NEG_INF)                             # [B, K]
    all_score = jnp.concatenate([c.fin_score, new_score], 1)  # existing first: they win ties
    return _top_k(all_score, _concat(_finished(c), [
        new_seqs, new_hist, top_logp[:, :K], new_score, jnp.full((B, K), c.t + 1, jnp.int32),
        new_x]), K)

  def start(self, init_state, bos_id, pad_id, extra_names) -> _BeamCarry:
    """The carry before the first step: one live hypothesis (BOS) per example, none finished."""
    B, K, T, Ts = self.B, self.K, self.T, self.Ts
    empty = jnp.full((B, K), NEG_INF, jnp.float32)
    no_x = lambda: {k: jnp.zeros((B, K, T), jnp.float32) for k in extra_names or ()}
    return _BeamCarry(
        t=jnp.zeros((), jnp.int32), state=tile_beams(init_state, K),
        live_last=jnp.full((B, K), bos_id, jnp.int32),
        live_logp=empty.at[:, 0].set(0.0),  # one real start, so the K beams do not duplicate it
        live_seqs=jnp.full((B, K, T), pad_id, jnp.int32),
        live_w=jnp.zeros((B, K, T, Ts), jnp.float32), live_x=no_x(),
        fin_seqs=jnp.full((B, K, T), pad_id, jnp.int32),
        fin_w=jnp.zeros((B, K, T, Ts), jnp.float32), fin_x=no_x(),
        fin_logp=empty, fin_score=empty, fin_len=jnp.zeros((B, K), jnp.int32))

  def result(self, c: _BeamCarry, extra_names) -> DecodeOutput:
    """The best hypothesis and the K-best list of the final carry."""
    B, K, T = self.B, self.K, self.T
    # Hypotheses still live at max_len are complete candidates (cut off, length T), except those
    # of an example whose search was done before (after an early exit, every example's).
    live_score = jnp.where((c.t == T) & (c.live_logp > NEG_INF) & ~self.done(c)[:, None],
                           self.rank(c.live_logp, self.lp_max, c.live_w), NEG_INF)
    all_score = jnp.concatenate([c.fin_score, live_score], 1)
    tokens, weights, log_probs, scores, lengths, extras = _top_k(all_score, _concat(
        _finished(c),
        [c.live_seqs, c.live_w, c.live_logp, live_score, jnp.full((B, K), T, jnp.int32),
         c.live_x]), K)
    if extra_names is None:
      extras = None
    nbest = NBest(tokens=tokens, lengths=lengths, weights=weights, log_probs=log_probs,
                  scores=scores, valid=scores > NEG_INF, extras=extras)
    return DecodeOutput(tokens=tokens[:, 0], lengths=lengths[:, 0], weights=weights[:, 0],
                        scores=log_probs[:, 0], nbest=nbest,
                        extras=None if extras is None else {k: v[:, 0] for k, v in extras.items()})


def _row_counts(batch_size: int, shrink_to: int) -> list[int]:
  """The batch sizes the shrinking search runs at: B, then halved while the half is at least
  `shrink_to` rows ([B] alone when shrink_to is 0)."""
  sizes = [batch_size]
  while shrink_to and sizes[-1] // 2 >= shrink_to:
    sizes.append(sizes[-1] // 2)
  return sizes


def _take_examples(c: _BeamCarry, order, K: int) -> _BeamCarry:
  """The carry of examples `order` [B'] (state rows b*K + k follow their example)."""
  per_example = lambda x: x[order]
  per_row = lambda x: x.reshape(-1, K, *x.shape[1:])[order].reshape(-1, *x.shape[1:])
  fields = {f: jax.tree.map(per_example, getattr(c, f)) for f in _BeamCarry._fields
            if f not in ("t", "state")}
  return _BeamCarry(t=c.t, state=jax.tree.map(per_row, c.state), **fields)


def _put_examples(store: _BeamCarry, c: _BeamCarry, rows) -> _BeamCarry:
  """`store` (the whole batch, no state) with the finished and live fields of c's examples,
  which are examples `rows` [B'] of the batch."""
  names = [f for f in _BeamCarry._fields if f.startswith(("fin_", "live_"))]
  put = lambda whole, part: whole.at[rows].set(part)
  return store._replace(t=c.t, **{f: jax.tree.map(put, getattr(store, f), getattr(c, f))
                                  for f in names})


def _check_shrinkable(step_fn, state, K: int, sizes: list[int]) -> None:
  """Refuses a step_fn that cannot run on fewer rows than the batch's (one closing over
  per-example arrays instead of carrying them in its state), from abstract evaluations."""
  for n in sizes[1:]:
    part = jax.tree.map(lambda x: jax.ShapeDtypeStruct((n * K,) + x.shape[1:], x.dtype), state)
    try:
      step_shapes(step_fn, part, n * K)
    except (TypeError, ValueError) as e:
      raise ValueError(f"shrink_to: step_fn fails on {n} examples' {n * K} rows ({e}); a "
                       "search that shrinks its batch needs every per-example array in the "
                       "state, none closed over (or shrink_to=0)") from None


def _shrinking_search(beam: _Beam, c: _BeamCarry, sizes: list[int]) -> tuple[_Beam, _BeamCarry]:
  """Runs the search as `lax.while_loop`s over ever fewer rows: each loop stops once at most
  half of its examples are still searching, and the next one carries on with those (and
  finished ones to fill its rows). An example whose K best are final (`_Beam.done`) keeps them
  to the end of a whole-batch search too, and its live hypotheses cannot enter them at max_len,
  so the result is the same; only rows that no longer matter are no longer computed.
  sizes: `_row_counts`. Returns the whole batch's beam and final carry (without state) for
  `_Beam.result`."""
  whole = beam
  store = c._replace(state=None)
  rows = jnp.arange(beam.B)
  for rest in sizes[1:] + [0]:
    c = jax.lax.while_loop(beam.cond_above(rest) if rest else beam.cond, beam.body, c)
    # Live fields too: a loop that reached max_len leaves live examples behind, whose cut-off
    # hypotheses are candidates. Those of a finished example cannot enter its K best.
    store = _put_examples(store, c, rows)
    if rest:
      # Searching examples first, in their order; stable, so the choice is deterministic.
      order = jnp.argsort(beam.done(c).astype(jnp.int32), stable=True)[:rest]
      c, rows = _take_examples(c, order, beam.K), rows[order]
      beam = dataclasses.replace(
          beam, B=rest, src_len=None if beam.src_len is None else beam.src_len[order])
  return whole, store


def _source_lengths(beta, batch_size, source_lengths):
  """[B, 1] |X| per example for the coverage penalty (None when beta = 0); checks them."""
  if beta <= 0:
    return None
  if source_lengths is None:
    raise ValueError("coverage_penalty > 0 needs source_lengths ([B] int32)")
  if jnp.shape(source_lengths) != (batch_size,):
    raise ValueError(f"source_lengths must be [B={batch_size}], got {jnp.shape(source_lengths)}")
  return jnp.asarray(source_lengths)[:, None]                 # [B, 1] -> broadcast over K


def beam_search(step_fn: StepFn, init_state, batch_size: int, max_len: int, *, beam_size: int,
                length_penalty: float = Search.length_penalty, bos_id: int = BOS_ID,
                eos_id: int = EOS_ID, pad_id: int = PAD_ID, early_exit: bool = True,
                min_len: int = 0, block_repeat_ngram: int = 0, coverage_penalty: float = 0.0,
                source_lengths: jax.Array | None = None,
                keep_weights: bool = True, shrink_to: int = 0,
                stop: str = Search.stop) -> DecodeOutput:
  """Beam search with the GNMT length penalty; returns the best hypothesis and the K-best list.

  The standard top-2K scheme (as in Flax's wmt/decode.py and T5X): at step t each of the K live
  hypotheses is extended by every token, the best 2K of the K*V candidates are kept, and
  - an EOS candidate is finished if it ranks among the best K of them (as in Hugging Face's
    BeamSearchScorer: with K = 1 this is exactly greedy's rule, so beam_size=1 with
    length_penalty=0 reproduces greedy_decode); its score log P / lp(t+1) + cp joins the K-best
    finished list, whose members never change again (they are only re-ranked);
  - the best K non-EOS candidates are the new live hypotheses (2K candidates hold at most K EOS
    ones, so there are always K); their state, tokens, attention and extras histories are
    gathered from their parent beam, so `weights` and `extras` always belong to the hypothesis
    they are returned with.
  At max_len the live hypotheses of an example still searching join its finished ones as
  cut-off candidates of length T.

  stop: when an example's search is done and its K finished hypotheses become its result
  (`STOP_RULES`): "bound" (the default, exact: no live hypothesis can still enter them, so the
  result is that of all max_len steps) or "k_finished" (K have finished: fairseq's and
  JoeyNMT's rule, fewer steps). early_exit: the loop exits once every example is done (the
  default); False runs all max_len steps, with the same result.

  length_penalty: the GNMT alpha (0 disables it). Returns DecodeOutput for the best hypothesis
  (scores = its sum of log-probs) with `nbest` holding all K, sorted by penalized score.

  min_len, block_repeat_ngram: as in greedy_decode, per live hypothesis (its own tokens): such a
  hypothesis cannot finish before min_len tokens, and extensions repeating one of its n-grams are
  not candidates.

  coverage_penalty: the GNMT beta (0 disables it); a finished or cut-off hypothesis ranks by
  log P / lp(|Y|) + gnmt_coverage_penalty(its attention history, source_lengths, beta). It only
  re-ranks finished hypotheses; live ones compete by log P as before (Wu et al. 2016).
  source_lengths: [B] int32, |X| per example; required when coverage_penalty > 0.

  keep_weights: False records no attention (weights [B, T, 0], NBest's [B, K, T, 0]): the same
  tokens and scores without carrying and reordering a [B, K, T, Ts] history per hypothesis at
  every step (for callers that only read the outputs; the coverage penalty needs the history).

  shrink_to: 0 computes every example's K rows at every step until the whole batch is done.
  n > 0 lets done examples (those whose K best no longer change) leave: once at most
  half of the examples are still searching, the loop carries on over half the rows, and so on
  down to n rows. The result is the same; a batch whose examples finish at different steps
  costs less (each halving compiles one more loop body). It needs a step_fn that keeps every
  per-example array in `state`: one that matches closed-over arrays to its rows would read the
  wrong rows once the batch shrinks; a step that fails on the smaller row counts is refused.
  """
  check_sizes(batch_size, max_len, beam_size)
  check_room(step_fn, init_state, max_len)
  check_constraints(max_len, min_len, block_repeat_ngram)
  alpha = float(length_penalty)
  if alpha < 0:
    raise ValueError(f"length_penalty alpha must be >= 0, got {alpha}")
  if shrink_to < 0:
    raise ValueError(f"shrink_to must be >= 0, got {shrink_to}")
  check_stop(stop)
  beta = float(coverage_penalty)
  if beta < 0:
    raise ValueError(f"coverage_penalty beta must be >= 0, got {beta}")
  src_len = _source_lengths(beta, batch_size, source_lengths)
  if beta > 0 and not keep_weights:
    raise ValueError("coverage_penalty > 0 ranks by the attention history: keep_weights=True")
  V, Ts, extra_names = step_shapes(step_fn, init_state, batch_size)
  Ts = Ts if keep_weights else 0
  beam = _Beam(step_fn, batch_size, beam_size, max_len, V, Ts, alpha, beta, src_len,
               gnmt_length_penalty(max_len, alpha), min_len, block_repeat_ngram, eos_id,
               early_exit, stop)
  c = beam.start(init_state, bos_id, pad_id, extra_names)
  sizes = _row_counts(batch_size, shrink_to)
  if len(sizes) > 1:
    _check_shrinkable(step_fn, c.state, beam_size, sizes)
    beam, c = _shrinking_search(beam, c, sizes)
  else:
    c = jax.lax.while_loop(beam.cond, beam.body, c)
  return beam.result(c, extra_names)
