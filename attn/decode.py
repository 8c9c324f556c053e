"""Greedy and beam search as jax.lax loops over a pure one-step decoder function.

Axis names: B batch, K beams, T = max_len (output positions), Ts source length, V vocabulary.

The model side is one pure function (closing over the parameters):

    step_fn(state, y_prev) -> (state, log_probs, weights)

- `state`: any pytree whose leaves have a leading batch axis B (beam search tiles it to B*K and
  reorders it by beam parent at every step, so every per-hypothesis quantity must live here);
- `y_prev`: [B] int32, the previous token (BOS at the first step);
- `log_probs`: [B, V] float32, log-softmax of the next-token distribution (must be <= 0: the
  early-exit bound of beam search relies on scores never increasing along a hypothesis);
- `weights`: [B, Ts] float32, the attention of that step (zeros for models without attention).

Both searches return a `DecodeOutput`: tokens [B, T] int32 without BOS, EOS included, PAD after
it; lengths [B] int32 counting EOS; weights [B, T, Ts] float32, row t being the attention of the
step that produced token t (zeros after EOS); scores [B] float32, the sum of the token
log-probabilities (EOS included). A hypothesis that never emits EOS stops at T tokens (length T).

Neither function jits itself: call them inside your own `jax.jit` with the parameters passed as
arguments, so step_fn closes over traced arrays rather than baking them in as constants (arrays
closed over by a jitted function become compile-time constants, and folding large ones is slow). Nothing but B, T, K and the special ids needs to be static.

    @functools.partial(jax.jit, static_argnames=("max_len", "beam_size"))
    def translate(params, src, src_len, *, max_len, beam_size):
      model = nnx.merge(graphdef, params)
      memory = model.decoder.memory(model.encoder(src, src_len))       # leaves [B, ...]
      B = src.shape[0]
      init = {"memory": memory, "dec": model.decoder.initial_state_from_memory(memory),
              "t": jnp.zeros([B], jnp.int32)}                           # t per row: leading B

      def step_fn(s, y_prev):
        dec, logits, w = model.decoder.step(s["memory"], s["dec"], y_prev, s["t"][0])
        return ({**s, "dec": dec, "t": s["t"] + 1},
                jax.nn.log_softmax(logits.astype(jnp.float32)), w)

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

from attn.tokens import BOS as BOS_ID, EOS as EOS_ID, PAD as PAD_ID

NEG_INF = -jnp.inf  # only ever combined through jnp.where / max / top_k, never multiplied by 0

StepFn = Callable[[Any, jax.Array], tuple[Any, jax.Array, jax.Array]]


class NBest(NamedTuple):
  """All K hypotheses of a beam search, best first (sorted by `scores`)."""
  tokens: jax.Array     # [B, K, T] int32, PAD after EOS
  lengths: jax.Array    # [B, K] int32, EOS included (T for a hypothesis cut at max_len)
  weights: jax.Array    # [B, K, T, Ts] float32, zeros after EOS
  log_probs: jax.Array  # [B, K] float32, sum of token log-probs
  scores: jax.Array     # [B, K] float32, log_probs / gnmt_length_penalty(lengths), the ranking
  valid: jax.Array      # [B, K] bool: False for filler slots (fewer than K possible hypotheses)


class DecodeOutput(NamedTuple):
  tokens: jax.Array    # [B, T] int32
  lengths: jax.Array   # [B] int32
  weights: jax.Array   # [B, T, Ts] float32
  scores: jax.Array    # [B] float32, sum of token log-probs (not length-normalized)
  nbest: NBest | None = None  # beam search only


def gnmt_length_penalty(length, alpha):
  """GNMT length penalty lp(L) = ((5 + L) / 6)^alpha (Wu et al. 2016, eq. 14); 1 for alpha = 0.

  A hypothesis' beam score is log P(y) / lp(|y|), |y| counting EOS.
  """
  if alpha == 0:  # exactly 1: beam search with K = 1 then equals greedy bit for bit
    return jnp.ones_like(jnp.asarray(length, jnp.float32))
  return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


def tile_beams(tree, beam_size):
  """[B, ...] -> [B*K, ...] (row b*K + k is beam k of example b), for every leaf of `tree`.

  Use it to close step_fn over per-source arrays that never change during decoding (encoder
  memory) instead of carrying them in `state`, which beam search reorders at every step.
  """
  return jax.tree.map(lambda x: jnp.repeat(x, beam_size, axis=0), tree)


def _step_shapes(step_fn, init_state, batch_size):
  """V and Ts from an abstract evaluation of one step; checks the state's batch axis."""
  for path, leaf in jax.tree_util.tree_leaves_with_path(init_state):
    if jnp.ndim(leaf) == 0 or jnp.shape(leaf)[0] != batch_size:
      raise ValueError(f"state leaf {jax.tree_util.keystr(path)} has shape {jnp.shape(leaf)}; "
                       f"every leaf needs a leading batch axis of size {batch_size}")
  y0 = jax.ShapeDtypeStruct((batch_size,), jnp.int32)
  _, logp, w = jax.eval_shape(step_fn, init_state, y0)
  if logp.ndim != 2 or logp.shape[0] != batch_size:
    raise ValueError(f"step_fn log_probs must be [B={batch_size}, V], got {logp.shape}")
  if w.ndim != 2 or w.shape[0] != batch_size:
    raise ValueError(f"step_fn weights must be [B={batch_size}, Ts], got {w.shape}")
  return logp.shape[1], w.shape[1]


def _check_sizes(batch_size, max_len, beam_size=1):
  for name, v in (("batch_size", batch_size), ("max_len", max_len), ("beam_size", beam_size)):
    if not isinstance(v, int) or v < 1:
      raise ValueError(f"{name} must be a positive Python int (static), got {v!r}")


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


def greedy_decode(step_fn: StepFn, init_state, batch_size: int, max_len: int, *,
                  bos_id: int = BOS_ID, eos_id: int = EOS_ID, pad_id: int = PAD_ID
                  ) -> DecodeOutput:
  """Argmax decoding: y_t = argmax_y log p(y | y_<t), until EOS or max_len tokens.

  Rows that are done keep being fed to step_fn (the batch is fixed-size) with PAD as y_prev; their
  outputs are discarded. Ties between tokens go to the lowest id (jnp.argmax).
  """
  _check_sizes(batch_size, max_len)
  B, T = batch_size, max_len
  _, Ts = _step_shapes(step_fn, init_state, B)

  def cond(c):
    return (c.t < T) & ~jnp.all(c.done)

  def body(c):
    state, logp, w = step_fn(c.state, c.y_prev)                  # [B, V], [B, Ts]
    logp = logp.astype(jnp.float32)
    tok = jnp.argmax(logp, axis=-1).astype(jnp.int32)            # [B]
    tok_logp = jnp.take_along_axis(logp, tok[:, None], axis=-1)[:, 0]
    tok = jnp.where(c.done, pad_id, tok)
    w = jnp.where(c.done[:, None], 0.0, w.astype(jnp.float32))
    return _GreedyCarry(
        t=c.t + 1, state=state, y_prev=tok,
        done=c.done | (tok == eos_id),
        tokens=jax.lax.dynamic_update_index_in_dim(c.tokens, tok, c.t, axis=1),
        weights=jax.lax.dynamic_update_index_in_dim(c.weights, w, c.t, axis=1),
        scores=c.scores + jnp.where(c.done, 0.0, tok_logp),
        lengths=c.lengths + (~c.done).astype(jnp.int32))

  c = jax.lax.while_loop(cond, body, _GreedyCarry(
      t=jnp.zeros((), jnp.int32), state=init_state,
      y_prev=jnp.full((B,), bos_id, jnp.int32), done=jnp.zeros((B,), bool),
      tokens=jnp.full((B, T), pad_id, jnp.int32), weights=jnp.zeros((B, T, Ts), jnp.float32),
      scores=jnp.zeros((B,), jnp.float32), lengths=jnp.zeros((B,), jnp.int32)))
  return DecodeOutput(tokens=c.tokens, lengths=c.lengths, weights=c.weights, scores=c.scores)


# ----------------------------------------------------------------------------- beam search


class _BeamCarry(NamedTuple):
  t: jax.Array          # [] int32, tokens generated so far by every live hypothesis
  state: Any            # leaves [B*K, ...], row b*K + k = live beam k of example b
  live_last: jax.Array  # [B, K] int32, last token of each live hypothesis (BOS at t = 0)
  live_logp: jax.Array  # [B, K] float32, log P(prefix); -inf for empty slots
  live_seqs: jax.Array  # [B, K, T] int32
  live_w: jax.Array     # [B, K, T, Ts] float32
  fin_seqs: jax.Array   # [B, K, T] int32, finished (EOS-terminated) hypotheses, best first
  fin_w: jax.Array      # [B, K, T, Ts]
  fin_logp: jax.Array   # [B, K]
  fin_score: jax.Array  # [B, K], fin_logp / lp(fin_len); -inf for empty slots
  fin_len: jax.Array    # [B, K] int32


def _gather(x, idx):
  """x: [B, N, ...], idx: [B, M] -> [B, M, ...] (per-example gather along the beam axis)."""
  return jax.vmap(lambda xb, ib: xb[ib])(x, idx)


def _top_k(scores, leaves, k):
  """The k best entries along axis 1 of every array in `leaves`, by `scores` [B, N]."""
  _, idx = jax.lax.top_k(scores, k)  # ties: lowest index first
  return [_gather(x, idx) for x in leaves]


def beam_search(step_fn: StepFn, init_state, batch_size: int, max_len: int, *, beam_size: int,
                length_penalty: float = 0.6, bos_id: int = BOS_ID, eos_id: int = EOS_ID,
                pad_id: int = PAD_ID, early_exit: bool = True) -> DecodeOutput:
  """Beam search with the GNMT length penalty; returns the best hypothesis and the K-best list.

  The standard top-2K scheme (as in Flax's wmt/decode.py and T5X): at step t each of the K live
  hypotheses is extended by every token, the best 2K of the K*V candidates are kept, and
  - an EOS candidate is finished if it ranks among the best K of them (as in Hugging Face's
    BeamSearchScorer: with K = 1 this is exactly greedy's rule, so beam_size=1 with
    length_penalty=0 reproduces greedy_decode); its score log P / lp(t+1) joins the K-best
    finished list, whose members never change again (they are only re-ranked);
  - the best K non-EOS candidates are the new live hypotheses (2K candidates hold at most K EOS
    ones, so there are always K); their state, tokens and attention history are gathered from
    their parent beam, so `weights` always belong to the hypothesis they are returned with.
  At max_len the live hypotheses join the finished ones as cut-off candidates of length T.
  The loop exits early once, for every example, K hypotheses are finished and the best live
  one cannot beat the worst of them even in the best case (log P only falls as a hypothesis
  grows; lp is largest at T since alpha >= 0).

  early_exit: stop at that bound (the default); False runs all max_len steps. Both give the same
  result: the bound divides by lp(T), the largest penalty any continuation can get, never by the
  current length's lp(t), which would understate what a live hypothesis can still reach.

  length_penalty: the GNMT alpha (0 disables it). Returns DecodeOutput for the best hypothesis
  (scores = its sum of log-probs) with `nbest` holding all K, sorted by penalized score.
  """
  _check_sizes(batch_size, max_len, beam_size)
  alpha = float(length_penalty)
  if alpha < 0:
    raise ValueError(f"length_penalty alpha must be >= 0, got {alpha}")
  B, K, T = batch_size, beam_size, max_len
  V, Ts = _step_shapes(step_fn, init_state, B)
  lp = lambda n: gnmt_length_penalty(n, alpha)
  lp_max = lp(T)

  def cond(c):
    if not early_exit:
      return c.t < T
    worst_fin = c.fin_score[:, -1]                              # [B]; -inf while a slot is empty
    # Upper bound on any live future: log P only falls and lp(n) <= lp(T) for n <= T (alpha >= 0),
    # so log P / lp(n) <= live_logp / lp(T). Dividing by lp(t) instead would exit too early.
    best_live = c.live_logp[:, 0] / lp_max
    done = worst_fin > best_live
    return (c.t < T) & ~jnp.all(done)

  def body(c):
    state, logp, w = step_fn(c.state, c.live_last.reshape(B * K))
    logp = logp.astype(jnp.float32).reshape(B, K, V)
    w = w.astype(jnp.float32).reshape(B, K, Ts)

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
      """Tokens and attention histories [B, M, T(, Ts)] of candidates idx [B, M] (into the 2K)."""
      p, y = _gather(parent, idx), _gather(tok, idx)
      seqs = jax.lax.dynamic_update_index_in_dim(_gather(c.live_seqs, p), y, c.t, axis=2)
      hist = jax.lax.dynamic_update_index_in_dim(
          _gather(c.live_w, p), _gather(w, p), c.t, axis=2)
      return seqs, hist

    # Finished: EOS candidates among the best K; merge with the K-best finished so far. Only the
    # first K candidates can finish, so only their histories are built (half the copying).
    first_k = jnp.broadcast_to(jnp.arange(K), (B, K))
    finishing = is_eos[:, :K] & (top_logp[:, :K] > NEG_INF)
    new_score = jnp.where(finishing, top_logp[:, :K] / lp(c.t + 1), NEG_INF)   # [B, K]
    new_seqs, new_hist = extend(first_k)
    all_score = jnp.concatenate([c.fin_score, new_score], 1)  # existing first: they win ties
    fin_seqs, fin_w, fin_logp, fin_score, fin_len = _top_k(all_score, [
        jnp.concatenate([c.fin_seqs, new_seqs], 1), jnp.concatenate([c.fin_w, new_hist], 1),
        jnp.concatenate([c.fin_logp, top_logp[:, :K]], 1), all_score,
        jnp.concatenate([c.fin_len, jnp.full((B, K), c.t + 1, jnp.int32)], 1)], K)

    # Live: the best K non-EOS candidates (2K hold at most K EOS ones), with their parents'
    # decoder state, tokens and attention history.
    live_key = jnp.where(is_eos, NEG_INF, top_logp)
    _, sel = jax.lax.top_k(live_key, K)                        # [B, K] into the 2K
    live_seqs, live_w = extend(sel)
    live_parent = _gather(parent, sel)
    flat = (jnp.arange(B)[:, None] * K + live_parent).reshape(B * K)
    state = jax.tree.map(lambda x: x[flat], state)

    return _BeamCarry(t=c.t + 1, state=state, live_last=_gather(tok, sel),
                      live_logp=_gather(live_key, sel),
                      live_seqs=live_seqs, live_w=live_w, fin_seqs=fin_seqs, fin_w=fin_w,
                      fin_logp=fin_logp, fin_score=fin_score, fin_len=fin_len)

  empty = jnp.full((B, K), NEG_INF, jnp.float32)
  c = jax.lax.while_loop(cond, body, _BeamCarry(
      t=jnp.zeros((), jnp.int32), state=tile_beams(init_state, K),
      live_last=jnp.full((B, K), bos_id, jnp.int32),
      live_logp=empty.at[:, 0].set(0.0),  # one real start, so the K beams do not duplicate it
      live_seqs=jnp.full((B, K, T), pad_id, jnp.int32),
      live_w=jnp.zeros((B, K, T, Ts), jnp.float32),
      fin_seqs=jnp.full((B, K, T), pad_id, jnp.int32),
      fin_w=jnp.zeros((B, K, T, Ts), jnp.float32),
      fin_logp=empty, fin_score=empty, fin_len=jnp.zeros((B, K), jnp.int32)))

  # Hypotheses still live at max_len are complete candidates (cut off, length T). After an early
  # exit they cannot enter the K best, so they are left out.
  live_score = jnp.where((c.t == T) & (c.live_logp > NEG_INF), c.live_logp / lp_max, NEG_INF)
  all_score = jnp.concatenate([c.fin_score, live_score], 1)
  tokens, weights, log_probs, scores, lengths = _top_k(all_score, [
      jnp.concatenate([c.fin_seqs, c.live_seqs], 1), jnp.concatenate([c.fin_w, c.live_w], 1),
      jnp.concatenate([c.fin_logp, c.live_logp], 1), all_score,
      jnp.concatenate([c.fin_len, jnp.full((B, K), T, jnp.int32)], 1)], K)
  nbest = NBest(tokens=tokens, lengths=lengths, weights=weights, log_probs=log_probs,
                scores=scores, valid=scores > NEG_INF)
  return DecodeOutput(tokens=tokens[:, 0], lengths=lengths[:, 0], weights=weights[:, 0],
                      scores=log_probs[:, 0], nbest=nbest)
