"""Greedy decoding: the argmax token at every step, as one `lax.while_loop` that stops once every
row has emitted EOS (see the package docstring for step_fn and the outputs)."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from attn.data.tokens import BOS as BOS_ID, EOS as EOS_ID, PAD as PAD_ID
from attn.decoding.constraints import check_constraints, constrain
from attn.decoding.step import (DecodeOutput, StepFn, check_room, check_sizes, f32_extras,
                                step_shapes, unpack)


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


def first_argmax(x):
  """(jnp.argmax(x, -1), the value there) of x [B, V]: the first index of the row's maximum (of
  its first NaN, if any, as jnp.argmax), as two plain reductions, max then min over matching
  indices: XLA:CPU runs jnp.argmax's paired value-index reduction unvectorized, and greedy
  decoding takes one per step."""
  m = jnp.max(x, axis=-1, keepdims=True)                       # NaN if the row has one
  hit = (x == m) | jnp.isnan(x)
  V = x.shape[-1]
  tok = jnp.min(jnp.where(hit, jnp.arange(V, dtype=jnp.int32), V), axis=-1)
  return tok, m[:, 0]


def greedy_decode(step_fn: StepFn, init_state, batch_size: int, max_len: int, *,
                  bos_id: int = BOS_ID, eos_id: int = EOS_ID, pad_id: int = PAD_ID,
                  min_len: int = 0, block_repeat_ngram: int = 0,
                  keep_weights: bool = True, shrink_to: int = 0) -> DecodeOutput:
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

  keep_weights: False records no attention (weights [B, T, 0]; the same tokens and scores).

  shrink_to: n > 0 lets rows that have emitted EOS leave the batch, which halves down to n rows
  (as beam_search's shrink_to). Greedy is beam search with one beam and no length penalty (the
  same tokens, ties, constraints, weights and scores), so it runs as that search, which knows
  how to shrink its batch; each halving is one more loop to compile.
  """
  if shrink_to:
    from attn.decoding.beam import beam_search  # pylint: disable=import-outside-toplevel
    out = beam_search(step_fn, init_state, batch_size, max_len, beam_size=1, length_penalty=0.0,
                      bos_id=bos_id, eos_id=eos_id, pad_id=pad_id, min_len=min_len,
                      block_repeat_ngram=block_repeat_ngram, keep_weights=keep_weights,
                      shrink_to=shrink_to)
    return out._replace(nbest=None)
  check_sizes(batch_size, max_len)
  check_room(step_fn, init_state, max_len)
  check_constraints(max_len, min_len, block_repeat_ngram)
  B, T = batch_size, max_len
  _, Ts, extra_names = step_shapes(step_fn, init_state, B)
  Ts = Ts if keep_weights else 0

  def cond(c):
    return (c.t < T) & ~jnp.all(c.done)

  def body(c):
    state, logp, w, xs = unpack(step_fn(c.state, c.y_prev))    # [B, V], [B, Ts], {[B]}
    logp = logp.astype(jnp.float32)
    logp = constrain(logp, c.t, c.tokens, min_len=min_len, ngram=block_repeat_ngram,
                      eos_id=eos_id)
    tok, tok_logp = first_argmax(logp)                           # [B], [B]
    tok = jnp.where(c.done, pad_id, tok)
    w = jnp.where(c.done[:, None], 0.0, w.astype(jnp.float32)[:, :Ts])
    xs = {k: jnp.where(c.done, 0.0, v) for k, v in f32_extras(xs, (B,)).items()}
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
