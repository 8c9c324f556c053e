"""Greedy and beam search as jax.lax loops over a pure one-step decoder function.

Axis names: B batch, K beams, T = max_len (output positions), Ts source length, V vocabulary
(the width of step_fn's log_probs: V_ext = V + Ts for a pointer-generator's extended vocabulary).

The model side is one pure function (closing over the parameters):

    step_fn(state, y_prev) -> (state, log_probs, weights)            or
    step_fn(state, y_prev) -> (state, log_probs, weights, extras)

- `state`: any pytree whose leaves have a leading batch axis B (beam search tiles it to B*K and
  reorders it by beam parent at every step, so every per-hypothesis quantity must live here);
- `y_prev`: [B] int32, the previous token (BOS at the first step). It can be any id the search
  emitted, i.e. any column of log_probs: with an extended vocabulary (See et al. 2017) ids >= the
  decoder's embedding size are source copies, and step_fn must map them to UNK before embedding
  them. The searches never look at ids beyond comparing them (EOS, n-gram blocking);
- `log_probs`: [B, V] float32, log-softmax of the next-token distribution (must be <= 0: the
  early-exit bound of beam search relies on scores never increasing along a hypothesis). V is read
  from its shape and must not change between steps;
- `weights`: [B, Ts] float32, the attention of that step (zeros for models without attention);
- `extras` (optional): dict name -> [B] float32, per-step quantities to record along each
  hypothesis (e.g. {"p_gen": ...}, the pointer-generator's generation probability).

Both searches return a `DecodeOutput`: tokens [B, T] int32 without BOS, EOS included, PAD after
it; lengths [B] int32 counting EOS; weights [B, T, Ts] float32, row t being the attention of the
step that produced token t (zeros after EOS); scores [B] float32, the sum of the token
log-probabilities (EOS included); extras: dict name -> [B, T] float32 laid out like the weights,
or None when step_fn returns no extras. A hypothesis that never emits EOS stops at T tokens.

Constraints for summarization (both searches; all off by default, and then the searches run
exactly the program they ran without them): `min_len` (no EOS before min_len tokens, EOS counted)
and `block_repeat_ngram` (no token that would repeat an n-gram of the hypothesis' own generated
tokens, Paulus et al. 2018). Beam search also takes the GNMT coverage penalty (`coverage_penalty`,
`source_lengths`) into the ranking of finished hypotheses.

Neither function jits itself: call them inside your own `jax.jit` with the parameters passed as
arguments, so step_fn closes over traced arrays rather than baking them in as constants (arrays
closed over by a jitted function become compile-time constants, and folding large ones is slow).
Static (Python scalars): B, T, K, the special ids, length_penalty, min_len, block_repeat_ngram,
coverage_penalty and early_exit; source_lengths is an ordinary (traced) array.

    @functools.partial(jax.jit, static_argnames=("max_len", "beam_size"))
    def translate(params, src, src_len, *, max_len, beam_size):
      model = nnx.merge(graphdef, params)
      memory = model.decoder.memory(model.encoder(src, src_len))       # leaves [B, ...]
      B = src.shape[0]
      init = {"memory": memory, "dec": model.decoder.initial_state_from_memory(memory),
              "t": jnp.zeros([B], jnp.int32)}                           # t per row: leading B

      def step_fn(s, y_prev):
        dec, logits, att = model.decoder.step(s["memory"], s["dec"], y_prev, s["t"][0])
        return ({**s, "dec": dec, "t": s["t"] + 1},
                jax.nn.log_softmax(logits.astype(jnp.float32)), att.weights)

      return decode.beam_search(step_fn, init, B, max_len, beam_size=beam_size)

Loops: both use `lax.while_loop`, not `lax.scan` over T. Decoding needs no gradient (the one thing
scan would add), and the while loop stops as soon as the whole batch is done: greedy when every
row has emitted EOS, beam search when no live hypothesis can beat the worst finished one of any
example. With T set generously (e.g. 2 x source length + 10) most batches finish well before T.
Outputs are written into preallocated [.., T, ..] buffers, so all shapes stay static.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from attn.data.tokens import BOS as BOS_ID, EOS as EOS_ID, PAD as PAD_ID

NEG_INF = -jnp.inf  # only ever combined through jnp.where / max / top_k, never multiplied by 0

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

StepFn = Callable[[Any, jax.Array], tuple]  # (state, log_probs, weights[, extras])


class NBest(NamedTuple):
  """All K hypotheses of a beam search, best first (sorted by `scores`)."""
  tokens: jax.Array     # [B, K, T] int32, PAD after EOS
  lengths: jax.Array    # [B, K] int32, EOS included (T for a hypothesis cut at max_len)
  weights: jax.Array    # [B, K, T, Ts] float32, zeros after EOS
  log_probs: jax.Array  # [B, K] float32, sum of token log-probs
  # [B, K] float32, the ranking: log_probs / gnmt_length_penalty(lengths)
  # + gnmt_coverage_penalty(weights) (the latter 0 unless coverage_penalty > 0)
  scores: jax.Array
  valid: jax.Array      # [B, K] bool: False for filler slots (fewer than K possible hypotheses)
  extras: dict | None = None  # name -> [B, K, T] float32, zeros after EOS; None without extras


class DecodeOutput(NamedTuple):
  tokens: jax.Array    # [B, T] int32
  lengths: jax.Array   # [B] int32
  weights: jax.Array   # [B, T, Ts] float32
  scores: jax.Array    # [B] float32, sum of token log-probs (not length-normalized)
  nbest: NBest | None = None  # beam search only
  extras: dict | None = None  # name -> [B, T] float32, zeros after EOS; None without extras


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


def tile_beams(tree, beam_size):
  """[B, ...] -> [B*K, ...] (row b*K + k is beam k of example b), for every leaf of `tree`.

  Use it to close step_fn over per-source arrays that never change during decoding (encoder
  memory) instead of carrying them in `state`, which beam search reorders at every step.
  """
  return jax.tree.map(lambda x: jnp.repeat(x, beam_size, axis=0), tree)


def _unpack(out):
  """step_fn's output -> (state, log_probs, weights, extras dict or None)."""
  if not isinstance(out, tuple) or len(out) not in (3, 4):
    raise ValueError("step_fn must return (state, log_probs, weights) or (state, log_probs, "
                     f"weights, extras), got {type(out).__name__} of length "
                     f"{len(out) if isinstance(out, tuple) else '?'}")
  return (*out[:3], out[3] if len(out) == 4 else None)


def _step_shapes(step_fn, init_state, batch_size):
  """V, Ts and the extras' names (None without extras) from an abstract evaluation of one step;
  checks the state's batch axis and the shapes step_fn returns."""
  for path, leaf in jax.tree_util.tree_leaves_with_path(init_state):
    if jnp.ndim(leaf) == 0 or jnp.shape(leaf)[0] != batch_size:
      raise ValueError(f"state leaf {jax.tree_util.keystr(path)} has shape {jnp.shape(leaf)}; "
                       f"every leaf needs a leading batch axis of size {batch_size}")
  y0 = jax.ShapeDtypeStruct((batch_size,), jnp.int32)
  _, logp, w, extras = _unpack(jax.eval_shape(step_fn, init_state, y0))
  if logp.ndim != 2 or logp.shape[0] != batch_size:
    raise ValueError(f"step_fn log_probs must be [B={batch_size}, V], got {logp.shape}")
  if w.ndim != 2 or w.shape[0] != batch_size:
    raise ValueError(f"step_fn weights must be [B={batch_size}, Ts], got {w.shape}")
  if extras is not None:
    if not isinstance(extras, dict):
      raise ValueError(f"step_fn extras must be a dict name -> [B], got {type(extras).__name__}")
    for name, x in extras.items():
      if getattr(x, "shape", None) != (batch_size,):
        raise ValueError(f"step_fn extras[{name!r}] must be [B={batch_size}], got "
                         f"{getattr(x, 'shape', type(x).__name__)}")
    extras = tuple(extras)
  return logp.shape[1], w.shape[1], extras


def _check_sizes(batch_size, max_len, beam_size=1):
  for name, v in (("batch_size", batch_size), ("max_len", max_len), ("beam_size", beam_size)):
    if not isinstance(v, int) or v < 1:
      raise ValueError(f"{name} must be a positive Python int (static), got {v!r}")


def _check_constraints(max_len, min_len, block_repeat_ngram):
  for name, v in (("min_len", min_len), ("block_repeat_ngram", block_repeat_ngram)):
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
      raise ValueError(f"{name} must be a Python int >= 0 (static), got {v!r}")
  if min_len > max_len:
    raise ValueError(f"min_len={min_len} > max_len={max_len}: no hypothesis could end")


def _as_f32_extras(extras, shape):
  """Per-step extras as float32 arrays of `shape` ({} for none)."""
  return {k: v.astype(jnp.float32).reshape(shape) for k, v in (extras or {}).items()}


# ----------------------------------------------------------------------------- constraints


def _repeated_ngram_mask(seqs, t, n, vocab_size):
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


def _constrain(logp, t, seqs, *, min_len, ngram, eos_id):
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
    banned = _repeated_ngram_mask(seqs, t, ngram, logp.shape[-1]).at[:, eos_id].set(False)
    blocked = jnp.where(banned, NEG_INF, logp)
    logp = jnp.where(jnp.any(blocked > NEG_INF, axis=-1, keepdims=True), blocked, logp)
  if min_len > 1:  # at min_len <= 1 every EOS already makes at least min_len tokens
    no_eos = logp.at[:, eos_id].set(NEG_INF)
    ban_eos = (t + 1 < min_len) & jnp.any(no_eos > NEG_INF, axis=-1, keepdims=True)  # [R, 1]
    logp = jnp.where(ban_eos, no_eos, logp)
  return logp


# ----------------------------------------------------------------------------- greedy


class _GreedyCarry(NamedTuple):
  t: jax.Array        # [] int32, number of steps taken
  state: Any          # leaves [B, ...]
  y_prev: jax.Array   # [B] int32
  done: jax.Array     # [B] bool, EOS emitted
  tokens: jax.Array   # [B, T] int32
  weights: jax.Array  # [B, T, Ts] float32
  scores: jax.Array   # [B] float32
  lengths: jax.Array  # [B] int32
  extras: dict        # name -> [B, T] float32 ({} without extras)


def greedy_decode(step_fn: StepFn, init_state, batch_size: int, max_len: int, *,
                  bos_id: int = BOS_ID, eos_id: int = EOS_ID, pad_id: int = PAD_ID,
                  min_len: int = 0, block_repeat_ngram: int = 0) -> DecodeOutput:
  """Argmax decoding: y_t = argmax_y log p(y | y_<t), until EOS or max_len tokens.

  Rows that are done keep being fed to step_fn (the batch is fixed-size) with PAD as y_prev; their
  outputs are discarded. Ties between tokens go to the lowest id (jnp.argmax).

  min_len: EOS is banned while it would end the output with fewer than min_len tokens (EOS
  counted), so the shortest output has min_len tokens. block_repeat_ngram: n > 0 bans every
  token that would repeat an n-gram of the row's generated tokens (BOS excluded; 3 = trigram
  blocking). Banned tokens get log-prob -inf; scores stay the model's log-probs of the chosen
  tokens. The bans never leave a row without a possible token: EOS is never n-gram blocked, and
  min_len yields on a row whose every other token is banned or impossible (that output then ends
  before min_len; it takes all V - 1 other tokens banned, so only tiny vocabularies get there); a
  row whose model gives EOS probability 0 as well keeps its unblocked log-probs.

  There is no coverage penalty here: it re-ranks finished hypotheses, and greedy has one per row
  (beam_search with beam_size=1 does apply it when ranking its finished hypotheses).
  """
  _check_sizes(batch_size, max_len)
  _check_constraints(max_len, min_len, block_repeat_ngram)
  B, T = batch_size, max_len
  _, Ts, extra_names = _step_shapes(step_fn, init_state, B)

  def cond(c):
    return (c.t < T) & ~jnp.all(c.done)

  def body(c):
    state, logp, w, xs = _unpack(step_fn(c.state, c.y_prev))    # [B, V], [B, Ts], {[B]}
    logp = logp.astype(jnp.float32)
    logp = _constrain(logp, c.t, c.tokens, min_len=min_len, ngram=block_repeat_ngram,
                      eos_id=eos_id)
    tok = jnp.argmax(logp, axis=-1).astype(jnp.int32)            # [B]
    tok_logp = jnp.take_along_axis(logp, tok[:, None], axis=-1)[:, 0]
    tok = jnp.where(c.done, pad_id, tok)
    w = jnp.where(c.done[:, None], 0.0, w.astype(jnp.float32))
    xs = {k: jnp.where(c.done, 0.0, v) for k, v in _as_f32_extras(xs, (B,)).items()}
    return _GreedyCarry(
        t=c.t + 1, state=state, y_prev=tok,
        done=c.done | (tok == eos_id),
        tokens=jax.lax.dynamic_update_index_in_dim(c.tokens, tok, c.t, axis=1),
        weights=jax.lax.dynamic_update_index_in_dim(c.weights, w, c.t, axis=1),
        scores=c.scores + jnp.where(c.done, 0.0, tok_logp),
        lengths=c.lengths + (~c.done).astype(jnp.int32),
        extras={k: jax.lax.dynamic_update_index_in_dim(c.extras[k], v, c.t, axis=1)
                for k, v in xs.items()})

  c = jax.lax.while_loop(cond, body, _GreedyCarry(
      t=jnp.zeros((), jnp.int32), state=init_state,
      y_prev=jnp.full((B,), bos_id, jnp.int32), done=jnp.zeros((B,), bool),
      tokens=jnp.full((B, T), pad_id, jnp.int32), weights=jnp.zeros((B, T, Ts), jnp.float32),
      scores=jnp.zeros((B,), jnp.float32), lengths=jnp.zeros((B,), jnp.int32),
      extras={k: jnp.zeros((B, T), jnp.float32) for k in extra_names or ()}))
  return DecodeOutput(tokens=c.tokens, lengths=c.lengths, weights=c.weights, scores=c.scores,
                      extras=None if extra_names is None else c.extras)


# ----------------------------------------------------------------------------- beam search


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


def _concat(a, b):
  """Concatenates two pytrees of [B, N, ...] arrays along the beam axis."""
  return jax.tree.map(lambda x, y: jnp.concatenate([x, y], 1), a, b)


def beam_search(step_fn: StepFn, init_state, batch_size: int, max_len: int, *, beam_size: int,
                length_penalty: float = 0.6, bos_id: int = BOS_ID, eos_id: int = EOS_ID,
                pad_id: int = PAD_ID, early_exit: bool = True, min_len: int = 0,
                block_repeat_ngram: int = 0, coverage_penalty: float = 0.0,
                source_lengths: jax.Array | None = None) -> DecodeOutput:
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
  At max_len the live hypotheses join the finished ones as cut-off candidates of length T.
  The loop exits early once, for every example, K hypotheses are finished and the best live
  one cannot beat the worst of them even in the best case (log P only falls as a hypothesis
  grows; lp is largest at T since alpha >= 0; cp <= 0).

  early_exit: stop at that bound (the default); False runs all max_len steps. Both give the same
  result: the bound divides by lp(T), the largest penalty any continuation can get, never by the
  current length's lp(t), which would understate what a live hypothesis can still reach.

  length_penalty: the GNMT alpha (0 disables it). Returns DecodeOutput for the best hypothesis
  (scores = its sum of log-probs) with `nbest` holding all K, sorted by penalized score.

  min_len, block_repeat_ngram: as in greedy_decode, per live hypothesis (its own tokens): such a
  hypothesis cannot finish before min_len tokens, and extensions repeating one of its n-grams are
  not candidates.

  coverage_penalty: the GNMT beta (0 disables it); a finished or cut-off hypothesis ranks by
  log P / lp(|Y|) + gnmt_coverage_penalty(its attention history, source_lengths, beta). It only
  re-ranks finished hypotheses; live ones compete by log P as before (Wu et al. 2016).
  source_lengths: [B] int32, |X| per example; required when coverage_penalty > 0.
  """
  _check_sizes(batch_size, max_len, beam_size)
  _check_constraints(max_len, min_len, block_repeat_ngram)
  alpha = float(length_penalty)
  if alpha < 0:
    raise ValueError(f"length_penalty alpha must be >= 0, got {alpha}")
  beta = float(coverage_penalty)
  if beta < 0:
    raise ValueError(f"coverage_penalty beta must be >= 0, got {beta}")
  B, K, T = batch_size, beam_size, max_len
  if beta > 0:
    if source_lengths is None:
      raise ValueError("coverage_penalty > 0 needs source_lengths ([B] int32)")
    if jnp.shape(source_lengths) != (B,):
      raise ValueError(f"source_lengths must be [B={B}], got {jnp.shape(source_lengths)}")
    src_len = jnp.asarray(source_lengths)[:, None]                # [B, 1] -> broadcast over K
  V, Ts, extra_names = _step_shapes(step_fn, init_state, B)
  lp = lambda n: gnmt_length_penalty(n, alpha)
  lp_max = lp(T)

  def rank(logp, penalty, hist):
    """Ranking score [B, M] of hypotheses with log P [B, M], length penalty lp(|Y|) and attention
    history [B, M, T, Ts]."""
    score = logp / penalty
    if beta > 0:
      score = score + gnmt_coverage_penalty(hist, src_len, beta)
    return score

  def cond(c):
    if not early_exit:
      return c.t < T
    worst_fin = c.fin_score[:, -1]                              # [B]; -inf while a slot is empty
    # Upper bound on any live future: log P only falls and lp(n) <= lp(T) for n <= T (alpha >= 0),
    # so log P / lp(n) <= live_logp / lp(T). Dividing by lp(t) instead would exit too early.
    # The coverage penalty keeps it a bound: cp <= 0 (coverage is clamped to at most 1, so each
    # log term is <= 0), so log P / lp(n) + cp <= live_logp / lp(T) too. min_len and n-gram
    # blocking only set log-probs to -inf, which keeps log P falling.
    best_live = c.live_logp[:, 0] / lp_max
    done = worst_fin > best_live
    return (c.t < T) & ~jnp.all(done)

  def body(c):
    state, logp, w, xs = _unpack(step_fn(c.state, c.live_last.reshape(B * K)))
    logp = logp.astype(jnp.float32)
    logp = _constrain(logp, c.t, c.live_seqs.reshape(B * K, T), min_len=min_len,
                      ngram=block_repeat_ngram, eos_id=eos_id)
    logp = logp.reshape(B, K, V)
    w = w.astype(jnp.float32).reshape(B, K, Ts)
    xs = _as_f32_extras(xs, (B, K))                            # name -> [B, K]

    # The 2K best one-token extensions of the K live hypotheses.
    cand = (c.live_logp[:, :, None] + logp).reshape(B, K * V)  # [B, K*V]
    # The barrier keeps XLA from folding the slices below into the top-k: on CPU (jax 0.10.2),
    # top-k outputs sliced in more than one way are not matched back to the TopK kernel and run
    # as a full sort of the K*V candidates, ~100x slower at V = 8000 (35 s vs 0.3 s for B = 64,
    # K = 5, T = 50 with a trivial step).
    top_logp, top_idx = jax.lax.optimization_barrier(jax.lax.top_k(cand, 2 * K))  # [B, 2K]
    parent = top_idx // V                                      # [B, 2K] live beam index
    tok = (top_idx % V).astype(jnp.int32)                      # [B, 2K]
    is_eos = tok == eos_id

    def extend(idx):
      """Tokens, attention and extras histories [B, M, T(, Ts)] of candidates idx [B, M] (into
      the 2K)."""
      p, y = _gather(parent, idx), _gather(tok, idx)
      put = lambda hist, now: jax.lax.dynamic_update_index_in_dim(
          _gather(hist, p), _gather(now, p), c.t, axis=2)
      seqs = jax.lax.dynamic_update_index_in_dim(_gather(c.live_seqs, p), y, c.t, axis=2)
      return seqs, put(c.live_w, w), {k: put(c.live_x[k], v) for k, v in xs.items()}

    # Finished: EOS candidates among the best K; merge with the K-best finished so far. Only the
    # first K candidates can finish, so only their histories are built (half the copying).
    first_k = jnp.broadcast_to(jnp.arange(K), (B, K))
    finishing = is_eos[:, :K] & (top_logp[:, :K] > NEG_INF)
    new_seqs, new_hist, new_x = extend(first_k)
    new_score = jnp.where(finishing, rank(top_logp[:, :K], lp(c.t + 1), new_hist),
                          NEG_INF)                             # [B, K]
    all_score = jnp.concatenate([c.fin_score, new_score], 1)  # existing first: they win ties
    fin_seqs, fin_w, fin_logp, fin_score, fin_len, fin_x = _top_k(all_score, _concat(
        [c.fin_seqs, c.fin_w, c.fin_logp, c.fin_score, c.fin_len, c.fin_x],
        [new_seqs, new_hist, top_logp[:, :K], new_score, jnp.full((B, K), c.t + 1, jnp.int32),
         new_x]), K)

    # Live: the best K non-EOS candidates (2K hold at most K EOS ones), with their parents'
    # decoder state, tokens, attention and extras histories.
    live_key = jnp.where(is_eos, NEG_INF, top_logp)
    _, sel = jax.lax.top_k(live_key, K)                        # [B, K] into the 2K
    live_seqs, live_w, live_x = extend(sel)
    live_parent = _gather(parent, sel)
    flat = (jnp.arange(B)[:, None] * K + live_parent).reshape(B * K)
    state = jax.tree.map(lambda x: x[flat], state)

    return _BeamCarry(t=c.t + 1, state=state, live_last=_gather(tok, sel),
                      live_logp=_gather(live_key, sel),
                      live_seqs=live_seqs, live_w=live_w, live_x=live_x, fin_seqs=fin_seqs,
                      fin_w=fin_w, fin_x=fin_x, fin_logp=fin_logp, fin_score=fin_score,
                      fin_len=fin_len)

  empty = jnp.full((B, K), NEG_INF, jnp.float32)
  no_x = lambda: {k: jnp.zeros((B, K, T), jnp.float32) for k in extra_names or ()}
  c = jax.lax.while_loop(cond, body, _BeamCarry(
      t=jnp.zeros((), jnp.int32), state=tile_beams(init_state, K),
      live_last=jnp.full((B, K), bos_id, jnp.int32),
      live_logp=empty.at[:, 0].set(0.0),  # one real start, so the K beams do not duplicate it
      live_seqs=jnp.full((B, K, T), pad_id, jnp.int32),
      live_w=jnp.zeros((B, K, T, Ts), jnp.float32), live_x=no_x(),
      fin_seqs=jnp.full((B, K, T), pad_id, jnp.int32),
      fin_w=jnp.zeros((B, K, T, Ts), jnp.float32), fin_x=no_x(),
      fin_logp=empty, fin_score=empty, fin_len=jnp.zeros((B, K), jnp.int32)))

  # Hypotheses still live at max_len are complete candidates (cut off, length T). After an early
  # exit they cannot enter the K best, so they are left out.
  live_score = jnp.where((c.t == T) & (c.live_logp > NEG_INF), rank(c.live_logp, lp_max, c.live_w),
                         NEG_INF)
  all_score = jnp.concatenate([c.fin_score, live_score], 1)
  tokens, weights, log_probs, scores, lengths, extras = _top_k(all_score, _concat(
      [c.fin_seqs, c.fin_w, c.fin_logp, c.fin_score, c.fin_len, c.fin_x],
      [c.live_seqs, c.live_w, c.live_logp, live_score, jnp.full((B, K), T, jnp.int32), c.live_x]),
      K)
  if extra_names is None:
    extras = None
  nbest = NBest(tokens=tokens, lengths=lengths, weights=weights, log_probs=log_probs,
                scores=scores, valid=scores > NEG_INF, extras=extras)
  return DecodeOutput(tokens=tokens[:, 0], lengths=lengths[:, 0], weights=weights[:, 0],
                      scores=log_probs[:, 0], nbest=nbest,
                      extras=None if extras is None else {k: v[:, 0] for k, v in extras.items()})
