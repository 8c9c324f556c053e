"""greedy_decode / beam_search against brute-force enumeration in NumPy.

The toy decoder is a general autoregressive model: its state carries a code that is unique for
every prefix (base-(V+1) digits of the tokens fed so far), and log p(. | prefix) is a row of a
table indexed by that code. A search that feeds a hypothesis the wrong parent's state therefore
gets wrong log-probs, and the attention weights of each step, [code, t, example], say exactly which
prefix and step produced them.
"""

import functools
import itertools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attn import decoding as decode
from attn.data.tokens import BOS, EOS, PAD

V, TS = 5, 3                 # vocabulary (PAD, BOS, EOS, 3, 4), source length of the toy weights
BASE = V + 1                 # code digits y + 1 in 1..V: distinct prefixes, distinct codes
P = 4099                     # table rows (prime > the largest code at T = 5): no collisions


def next_code(code, y_prev):
  return code * BASE + y_prev + 1


def toy_init(ex):
  ex = jnp.asarray(ex, jnp.int32)
  zeros = jnp.zeros_like(ex)
  return {"ex": ex, "code": zeros, "t": zeros}


def counting_step(table, calls):
  """toy_step(table) that appends the step index t of every call to `calls` (a host callback;
  read after jax.effects_barrier())."""
  inner = toy_step(table)
  def step_fn(state, y_prev):
    jax.debug.callback(lambda t: calls.append(int(t[0])), state["t"])
    return inner(state, y_prev)
  return step_fn


def toy_step(table):
  """step_fn over a [E, P, V] log-prob table (a traced argument, not a closed-over constant)."""
  def step_fn(state, y_prev):
    code = next_code(state["code"], y_prev)                           # [B]
    logp = table[state["ex"], code % P]                               # [B, V]
    w = jnp.stack([code, state["t"], state["ex"]], -1).astype(jnp.float32)  # [B, TS]
    return {"ex": state["ex"], "code": code, "t": state["t"] + 1}, logp, w
  return step_fn


@functools.partial(jax.jit, static_argnames=("T",))
def run_greedy(table, ex, *, T):
  return decode.greedy_decode(toy_step(table), toy_init(ex), ex.shape[0], T)


@functools.partial(jax.jit, static_argnames=("T", "K", "alpha"))
def run_beam(table, ex, *, T, K, alpha):
  return decode.beam_search(toy_step(table), toy_init(ex), ex.shape[0], T, beam_size=K,
                            length_penalty=alpha)


def random_table(seed, E=3, eos_bias=0.0, special=-6.0):
  """[E, P, V] float32 log-softmax rows; PAD/BOS unlikely (logit `special`, may be -inf)."""
  rng = np.random.default_rng(seed)
  logits = rng.normal(0.0, 1.5, (E, P, V))
  logits[..., EOS] += eos_bias
  logits[..., [PAD, BOS]] = special
  m = logits.max(-1, keepdims=True)
  logp = logits - m - np.log(np.exp(logits - m).sum(-1, keepdims=True))
  return logp.astype(np.float32)


# ----------------------------------------------------------------------------- NumPy references

def np_weights(ex, tokens, T):
  """[T, TS] weights the toy emits along `tokens` (zeros after the last token)."""
  w, code, y_prev = np.zeros((T, TS), np.float32), 0, BOS
  for t, y in enumerate(tokens):
    code = next_code(code, y_prev)
    w[t] = (code, t, ex)
    y_prev = y
  return w


def np_log_probs(table, ex, tokens):
  """Per-token float64 log-probs of `tokens` under the toy."""
  out, code, y_prev = [], 0, BOS
  for y in tokens:
    code = next_code(code, y_prev)
    out.append(np.float64(table[ex, code % P, y]))
    y_prev = y
  return out


def np_greedy(table, ex, T):
  tokens, code, y_prev = [], 0, BOS
  while len(tokens) < T and (not tokens or tokens[-1] != EOS):
    code = next_code(code, y_prev)
    y_prev = int(np.argmax(table[ex, code % P]))
    tokens.append(y_prev)
  return tokens


def np_all_hypotheses(table, ex, T, alpha):
  """Every complete hypothesis, best first: (score, tokens, log P). Complete = ends in EOS within
  T tokens, or T tokens without EOS. Zero-probability ones (log P = -inf) are left out."""
  out = []
  for n in range(1, T + 1):
    for seq in itertools.product(range(V), repeat=n):
      if EOS in seq[:-1] or (n < T and seq[-1] != EOS):
        continue
      logp = sum(np_log_probs(table, ex, seq))
      if np.isfinite(logp):
        out.append((logp / ((5.0 + n) / 6.0) ** alpha, list(seq), logp))
  return sorted(out, key=lambda h: -h[0])


def padded(tokens, T):
  return np.array(tokens + [PAD] * (T - len(tokens)), np.int32)


def check_hypothesis(out_tokens, out_len, out_w, ex, tokens, T):
  np.testing.assert_array_equal(out_tokens, padded(tokens, T))
  assert int(out_len) == len(tokens)
  np.testing.assert_array_equal(out_w, np_weights(ex, tokens, T))


# ----------------------------------------------------------------------------- greedy

def edge_case_table(seed):
  """Example 0 ends at once (EOS dominant), example 1 never emits EOS, example 2 is random."""
  table = random_table(seed)
  table[0, :, EOS] = np.log(0.9)
  table[1, :, EOS] = -30.0
  return table


@pytest.mark.parametrize("seed", [0, 1])
def test_greedy_matches_numpy(seed):
  T, table, ex = 5, edge_case_table(seed), np.array([0, 1, 2], np.int32)
  out = run_greedy(table, ex, T=T)
  for b in range(3):
    tokens = np_greedy(table, b, T)
    check_hypothesis(out.tokens[b], out.lengths[b], out.weights[b], b, tokens, T)
    np.testing.assert_allclose(out.scores[b], sum(np_log_probs(table, b, tokens)), rtol=1e-5)
  assert out.lengths[0] == 1 and out.tokens[0, 0] == EOS and (out.tokens[0, 1:] == PAD).all()
  assert out.lengths[1] == T and EOS not in np.asarray(out.tokens[1])
  assert out.tokens.dtype == jnp.int32 and out.weights.shape == (3, T, TS)


def test_greedy_eager_equals_jit():
  table, ex = edge_case_table(3), np.array([0, 1, 2], np.int32)
  eager = decode.greedy_decode(toy_step(jnp.asarray(table)), toy_init(ex), 3, 5)
  jitted = run_greedy(table, ex, T=5)
  for a, b in zip(eager[:4], jitted[:4]):
    np.testing.assert_array_equal(a, b)


# ----------------------------------------------------------------------------- beam search

@pytest.mark.parametrize("seed", range(4))
def test_beam_size_1_equals_greedy(seed):
  table = edge_case_table(seed) if seed % 2 else random_table(seed, eos_bias=0.5)
  ex = np.array([0, 1, 2], np.int32)
  g = run_greedy(table, ex, T=5)
  b = run_beam(table, ex, T=5, K=1, alpha=0.0)
  for name in ("tokens", "lengths", "weights", "scores"):
    np.testing.assert_array_equal(getattr(b, name), getattr(g, name), err_msg=name)


# K = 4^3 live prefixes x V tokens = 320 >= every candidate at every step for T = 4: exhaustive.
K_ALL, T_ALL = 320, 4


@pytest.mark.parametrize("alpha", [0.0, 0.6])
@pytest.mark.parametrize("seed,special", [(0, -6.0), (1, -np.inf)])
def test_large_beam_finds_brute_force_optimum(alpha, seed, special):
  table = random_table(seed, eos_bias=0.3, special=special)
  ex = np.array([2, 0, 1], np.int32)
  out = run_beam(table, ex, T=T_ALL, K=K_ALL, alpha=alpha)
  for b, e in enumerate(ex):
    hyps = np_all_hypotheses(table, e, T_ALL, alpha)
    assert hyps[0][0] - hyps[1][0] > 1e-4, "reference has a near tie; pick another seed"
    score, tokens, logp = hyps[0]
    check_hypothesis(out.tokens[b], out.lengths[b], out.weights[b], e, tokens, T_ALL)
    np.testing.assert_allclose(out.scores[b], logp, rtol=1e-5)
    # The n-best list: the 10 best hypotheses in order, each with its own attention history.
    nb = out.nbest
    for k in range(10):
      score, tokens, logp = hyps[k]
      check_hypothesis(nb.tokens[b, k], nb.lengths[b, k], nb.weights[b, k], e, tokens, T_ALL)
      np.testing.assert_allclose(nb.scores[b, k], score, rtol=1e-5)
      np.testing.assert_allclose(nb.log_probs[b, k], logp, rtol=1e-5)
    n_valid = min(K_ALL, len(hyps))
    assert nb.valid[b, :n_valid].all() and not nb.valid[b, n_valid:].any()
    assert (np.diff(np.asarray(nb.scores[b, :n_valid])) <= 0).all()


def crafted_table():
  """From the start, [EOS] has p = .40 and [3, 4, EOS] has p = .45 * .9 * .95 = .385, so the
  short one wins without a length penalty and loses with alpha = 0.6
  (log .385 / (8/6)^.6 = -0.80 > log .40 = -0.92). Everything else is unlikely."""
  table = random_table(7, special=-8.0)
  table[..., EOS] = np.log(0.5)      # later prefixes: end soon
  table[..., 3] = np.log(0.3)
  table[..., 4] = np.log(0.2 - 2e-4)
  table[..., [PAD, BOS]] = np.log(1e-4)
  def row(prefix, probs):
    code = 0
    for y in [BOS] + prefix:
      code = next_code(code, y)
    p = np.full(V, 1e-4)
    for y, q in probs.items():
      p[y] = q
    table[:, code] = np.log(p / p.sum())
  row([], {EOS: 0.40, 3: 0.45, 4: 0.15 - 3e-4})
  row([3], {4: 0.9, 3: 0.05, EOS: 0.05 - 3e-4})
  row([3, 4], {EOS: 0.95, 3: 0.03, 4: 0.02 - 3e-4})
  return table


def test_length_penalty_changes_the_winner():
  table, ex = crafted_table(), np.array([0, 1], np.int32)
  winners = {}
  for alpha in (0.0, 0.6):
    ref = np_all_hypotheses(table, 0, T_ALL, alpha)[0][1]
    out = run_beam(table, ex, T=T_ALL, K=K_ALL, alpha=alpha)
    for b in range(2):
      check_hypothesis(out.tokens[b], out.lengths[b], out.weights[b], b, ref, T_ALL)
    winners[alpha] = ref
  assert winners == {0.0: [EOS], 0.6: [3, 4, EOS]}
  # A small beam finds both too (the crafted paths stay in the top 2K).
  for alpha, ref in winners.items():
    out = run_beam(table, ex, T=5, K=4, alpha=alpha)
    np.testing.assert_array_equal(out.tokens[0], padded(ref, 5))


def test_small_beam_is_consistent_and_batch_independent():
  """K = 4: every returned hypothesis is scored right, carries its own weights, the best is at
  least as good as greedy's, and examples decode the same alone as in a batch."""
  T, K, alpha = 5, 4, 0.6
  table = random_table(11, eos_bias=0.2)
  ex = np.array([0, 1, 2], np.int32)
  out = run_beam(table, ex, T=T, K=K, alpha=alpha)
  greedy = run_greedy(table, ex, T=T)
  lp = lambda n: ((5.0 + n) / 6.0) ** alpha
  for b in range(3):
    for k in range(K):
      n = int(out.nbest.lengths[b, k])
      tokens = [int(y) for y in out.nbest.tokens[b, k, :n]]
      assert EOS not in tokens[:-1] and (tokens[-1] == EOS or n == T)
      check_hypothesis(out.nbest.tokens[b, k], n, out.nbest.weights[b, k], b, tokens, T)
      logp = sum(np_log_probs(table, b, tokens))
      np.testing.assert_allclose(out.nbest.log_probs[b, k], logp, rtol=1e-5)
      np.testing.assert_allclose(out.nbest.scores[b, k], logp / lp(n), rtol=1e-5)
    assert out.nbest.scores[b, 0] >= float(greedy.scores[b]) / lp(int(greedy.lengths[b])) - 1e-6
    alone = run_beam(table, ex[b:b + 1], T=T, K=K, alpha=alpha)
    for a, c in zip(jax.tree.leaves(alone), jax.tree.leaves(out)):
      np.testing.assert_array_equal(a[0], c[b])


def test_rejects_state_without_batch_axis():
  with pytest.raises(ValueError, match="leading batch axis"):
    decode.greedy_decode(toy_step(jnp.zeros((1, P, V))), {"ex": jnp.zeros((2,), jnp.int32),
                                                          "code": jnp.int32(0),
                                                          "t": jnp.zeros((2,), jnp.int32)}, 2, 3)


def test_loops_exit_early_once_every_example_is_done():
  """The while loops stop before max_len: greedy when every row has emitted EOS, beam search once
  no live hypothesis can beat the K finished ones. Counted with a host callback per step."""
  table = random_table(5)
  table[..., EOS] = np.log(0.9)
  calls = []
  ex = np.array([0, 1], np.int32)
  greedy = jax.jit(lambda tb, e: decode.greedy_decode(counting_step(tb, calls), toy_init(e), 2,
                                                      8))
  out = greedy(table, ex)
  jax.effects_barrier()
  assert list(np.asarray(out.lengths)) == [1, 1] and calls == [0]
  calls.clear()
  beam = jax.jit(lambda tb, e: decode.beam_search(counting_step(tb, calls), toy_init(e), 2, 8,
                                                  beam_size=2, length_penalty=0.0))
  out = beam(table, ex)
  jax.effects_barrier()
  assert list(np.asarray(out.lengths)) == [1, 1] and calls == [0, 1]


def test_beam_top_k_compiles_to_top_k_not_a_full_sort():
  """Regression guard: without the optimization barrier XLA:CPU ran the K*V top-k as a full sort
  (~100x slower at V = 8000). Compiles only; nothing runs."""
  vocab = 8000
  def f(logp):
    step = lambda s, y: (s, jnp.broadcast_to(logp, (y.shape[0], vocab)), jnp.zeros((y.shape[0], 2)))
    return decode.beam_search(step, {"h": jnp.zeros((2, 1))}, 2, 4, beam_size=3)
  hlo = jax.jit(f).lower(jnp.zeros((vocab,), jnp.float32)).compile().as_text()
  # Sorts of a few entries (ordering the chosen chunks' k indices) are fine; none of K*V.
  sorts = [line for line in hlo.splitlines() if " sort(" in line]
  widths = [int(w) for line in sorts for w in re.findall(r"\d+", line.split("=")[1].split("{")[0])]
  assert max(widths, default=0) < vocab, sorts


@functools.partial(jax.jit, static_argnames=("T", "K", "alpha", "early_exit"))
def run_beam_exit(table, ex, *, T, K, alpha, early_exit):
  return decode.beam_search(toy_step(table), toy_init(ex), ex.shape[0], T, beam_size=K,
                            length_penalty=alpha, early_exit=early_exit)


@pytest.mark.parametrize("K,alpha", [(2, 1.0), (3, 0.6), (2, 2.0)])
def test_early_exit_never_changes_the_result(K, alpha):
  """Early exit (stop once no live hypothesis can beat the worst finished one) must give exactly
  what running all max_len steps gives, n-best included. The bound must divide by the penalty
  at max_len: with the current length's penalty it exits too soon in a few percent of cases.
  One example per batch, so the batch exits as soon as that example's bound says so."""
  T, seeds = 8, 150
  ex = np.zeros((1,), np.int32)
  early_exits = 0
  for seed in range(seeds):
    table = random_table(1000 + seed, E=1, eos_bias=1.0)
    a = run_beam_exit(table, ex, T=T, K=K, alpha=alpha, early_exit=True)
    b = run_beam_exit(table, ex, T=T, K=K, alpha=alpha, early_exit=False)
    for name in ("tokens", "lengths", "valid", "weights"):
      np.testing.assert_array_equal(getattr(a.nbest, name), getattr(b.nbest, name),
                                    err_msg=f"{name}, seed {seed}")
    # The two loops compile to different programs: XLA may round lp(t) by an ulp differently.
    for name in ("scores", "log_probs"):
      np.testing.assert_allclose(getattr(a.nbest, name), getattr(b.nbest, name), rtol=1e-6,
                                 err_msg=f"{name}, seed {seed}")
    early_exits += int(np.asarray(a.nbest.lengths).max() < T)
  assert early_exits > seeds // 4  # the comparison is about runs that did exit early


def test_one_length_penalty_default_for_search_training_and_beam_search():
  import inspect  # pylint: disable=import-outside-toplevel
  from attn.training import TrainConfig  # pylint: disable=import-outside-toplevel
  default = inspect.signature(decode.beam_search).parameters["length_penalty"].default
  assert default == decode.Search().length_penalty == TrainConfig().length_penalty == 0.6
  assert TrainConfig().search() == decode.Search()


@functools.partial(jax.jit, static_argnames=("T", "K", "alpha", "beta", "min_len", "ngram",
                                             "shrink_to"))
def run_beam_shrink(table, ex, *, T, K, alpha, beta, min_len, ngram, shrink_to):
  step = toy_step(table)
  return decode.beam_search(step, toy_init(ex), ex.shape[0], T, beam_size=K, length_penalty=alpha,
                            coverage_penalty=beta, source_lengths=jnp.full(ex.shape, TS),
                            min_len=min_len, block_repeat_ngram=ngram, shrink_to=shrink_to)


@pytest.mark.parametrize("K,alpha,beta,min_len,ngram", [(3, 0.6, 0.0, 0, 0), (2, 1.0, 0.2, 0, 0),
                                                         (3, 0.6, 0.0, 2, 2)])
def test_shrinking_the_batch_never_changes_the_result(K, alpha, beta, min_len, ngram):
  """Finished examples leaving the batch (shrink_to) must give exactly the whole batch's
  search: tokens, lengths, weights and scores of every n-best entry, including examples cut
  off at max_len. Twelve examples shrink to 6 and 3 rows (shrink_to=3)."""
  T, ex = 5, np.arange(12, dtype=np.int32) % 3
  kw = dict(T=T, K=K, alpha=alpha, beta=beta, min_len=min_len, ngram=ngram)
  cut_off = finished_early = 0
  for seed in range(12):
    table = random_table(2000 + seed, eos_bias=seed % 4 - 1.0)
    a = run_beam_shrink(table, ex, shrink_to=0, **kw)
    b = run_beam_shrink(table, ex, shrink_to=3, **kw)
    for name in ("tokens", "lengths", "valid", "weights", "scores", "log_probs"):
      np.testing.assert_array_equal(getattr(a.nbest, name), getattr(b.nbest, name),
                                    err_msg=f"{name}, seed {seed}")
    lengths = np.asarray(a.nbest.lengths)
    cut_off += int((lengths == T).any())
    finished_early += int((lengths.max(1) < T).any())
  assert cut_off and finished_early  # both kinds of example were compared


def test_shrinking_computes_fewer_rows():
  """The rows step_fn runs on, counted per call: with shrink_to the batch halves once most
  examples are done (here EOS is likely, so they finish fast, but example 2 never emits EOS)."""
  table = random_table(7, eos_bias=3.0)
  table[2, :, EOS] = -np.inf
  rows = []

  def counting(tb):
    inner = toy_step(tb)
    def step_fn(state, y_prev):
      jax.debug.callback(lambda y: rows.append(int(y.shape[0])), y_prev)
      return inner(state, y_prev)
    return step_fn

  ex = np.arange(8, dtype=np.int32) % 3
  ex[2:] = 0
  ex[5] = 2
  search = lambda s: jax.jit(lambda tb, e: decode.beam_search(
      counting(tb), toy_init(e), 8, 6, beam_size=2, shrink_to=s))
  whole = search(0)(table, ex)
  jax.effects_barrier()
  whole_rows, rows[:] = list(rows), []
  shrunk = search(2)(table, ex)
  jax.effects_barrier()
  np.testing.assert_array_equal(whole.nbest.tokens, shrunk.nbest.tokens)
  assert whole_rows == [16] * 6
  assert rows[0] == 16 and rows[-1] == 4 and sum(rows) < sum(whole_rows), rows


def test_shrinking_refuses_a_step_fn_closing_over_beam_rows():
  """A step that matches a closed-over [B, ...] memory to its rows by their count (any multiple
  of B) runs on the whole batch's B and B*K rows but not on a shrunk batch: refused at trace
  time, naming the setting."""
  memory = jnp.zeros((8, 1))

  def step_fn(state, y_prev):
    per_row = jnp.tile(memory, (y_prev.shape[0] // 8, 1))
    return state, jnp.zeros((y_prev.shape[0], V)) + per_row, jnp.zeros((y_prev.shape[0], 2))
  search = lambda s: decode.beam_search(step_fn, {"t": jnp.zeros((8,), jnp.int32)}, 8, 4,
                                        beam_size=2, shrink_to=s)
  assert search(0).tokens.shape == (8, 4)
  with pytest.raises(ValueError, match="shrink_to: step_fn fails on 2 examples' 4 rows"):
    search(2)


@pytest.mark.parametrize("B,N,k", [(3, 5000, 10), (2, 777, 6), (4, 300, 2), (2, 40, 4),
                                   (2, 29540, 10)])
@pytest.mark.parametrize("kind", ["normal", "ties", "half -inf", "all -inf"])
def test_wide_top_k_is_lax_top_k(B, N, k, kind):
  """The chunked top-k of the beam step: the same values and indices as jax.lax.top_k, ties
  (to the lowest index) and -inf rows included, rows split into chunks as they are (5000 by
  50s, 29540 by 70s) or padded (777: no width near 64 divides it)."""
  from attn.decoding.beam import _top_k_wide  # pylint: disable=import-outside-toplevel
  x = np.random.default_rng(N + k).standard_normal((B, N)).astype(np.float32)
  if kind == "ties":
    x = np.round(x * 2) / 2
  elif kind == "half -inf":
    x[:, : N // 2] = -np.inf
  elif kind == "all -inf":
    x[:] = -np.inf
  want, got = jax.lax.top_k(x, k), jax.jit(_top_k_wide, static_argnums=1)(x, k)
  np.testing.assert_array_equal(got[0], want[0])
  np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize("N,width", [(29540, 70), (5000, 50), (777, 64), (5908, 64), (4096, 64)])
def test_chunk_width_divides_the_rows_where_a_width_near_64_does(N, width):
  from attn.decoding.beam import _chunk_width  # pylint: disable=import-outside-toplevel
  assert _chunk_width(N) == width


# ----------------------------------------------------------------------------- stop rules

def np_beam_k_finished(table, ex, T, K, alpha):
  """A plain NumPy beam search of the same top-2K scheme that ends once K hypotheses have
  finished: [(score, tokens, log P)] best first, in float32 as the search computes them.
  Candidates tie to the lowest flat index (beam * V + token); finished ones already kept win
  ties against new ones."""
  f32 = np.float32
  lp = lambda n: f32(((5.0 + n) / 6.0) ** alpha)
  live = [(f32(0.0), [])] + [(f32(-np.inf), [])] * (K - 1)   # one real start
  fin = []                                                   # (score, tokens, log P)
  for t in range(T):
    cand = [(logp + table[ex, code_of(toks) % P, y], k, y)
            for k, (logp, toks) in enumerate(live)
            for y in range(V)]
    order = sorted(range(len(cand)), key=lambda i: (-cand[i][0], i))[:2 * K]
    top = [cand[i] for i in order]
    new = [(logp / lp(t + 1), live[k][1] + [y], logp) for logp, k, y in top[:K]
           if y == EOS and logp > -np.inf]
    fin = sorted(fin + new, key=lambda h: -h[0])[:K]         # stable: kept ones first
    live_cands = sorted(range(2 * K), key=lambda i: (-(top[i][0] if top[i][2] != EOS else
                                                       -np.inf), i))[:K]
    live = [((top[i][0] if top[i][2] != EOS else f32(-np.inf)), live[top[i][1]][1] + [top[i][2]])
            for i in live_cands]
    if len(fin) == K:
      return fin
  cut = [(logp / lp(T), toks, logp) for logp, toks in live if logp > -np.inf]
  return sorted(fin + cut, key=lambda h: -h[0])[:K]


def code_of(tokens):
  """The toy's state code after feeding BOS and then `tokens` (the step's table row)."""
  code, y_prev = 0, BOS
  for y in tokens:
    code, y_prev = next_code(code, y_prev), y
  return next_code(code, y_prev)


@functools.partial(jax.jit, static_argnames=("T", "K", "alpha", "stop", "shrink_to",
                                             "early_exit"))
def run_beam_stop(table, ex, *, T, K, alpha, stop, shrink_to=0, early_exit=True):
  return decode.beam_search(toy_step(table), toy_init(ex), ex.shape[0], T, beam_size=K,
                            length_penalty=alpha, stop=stop, shrink_to=shrink_to,
                            early_exit=early_exit)


@pytest.mark.parametrize("K,alpha", [(2, 0.6), (3, 1.0), (4, 0.0)])
def test_k_finished_matches_a_numpy_beam_search(K, alpha):
  """stop="k_finished": each example's K best are the first K hypotheses to finish (or, if
  fewer finish by max_len, those and the cut-off live ones), as a plain NumPy search of the
  same scheme finds them, though its batch mates search on after it is done."""
  T, ex = 6, np.array([0, 1, 2], np.int32)
  cut_off = done_early = 0
  for seed in range(8):
    table = random_table(3000 + seed, eos_bias=seed % 3 - 1.0)
    out = run_beam_stop(table, ex, T=T, K=K, alpha=alpha, stop="k_finished")
    for b in range(len(ex)):
      want = np_beam_k_finished(table, b, T, K, alpha)
      for k, (score, tokens, logp) in enumerate(want):
        n = len(tokens)
        check_hypothesis(out.nbest.tokens[b, k], out.nbest.lengths[b, k],
                         out.nbest.weights[b, k], b, tokens, T)
        np.testing.assert_allclose(out.nbest.scores[b, k], score, rtol=1e-6)
        np.testing.assert_allclose(out.nbest.log_probs[b, k], logp, rtol=1e-6)
        cut_off += int(tokens[-1] != EOS)
      assert not np.asarray(out.nbest.valid[b, len(want):]).any()
      done_early += int(max(len(h[1]) for h in want) < T)
  assert cut_off and done_early  # both endings were compared


@pytest.mark.parametrize("K,alpha", [(2, 0.6), (3, 1.0)])
def test_k_finished_is_the_same_shrunk_or_run_to_max_len(K, alpha):
  """A done example's K best never change: letting done examples leave the batch, or running
  all max_len steps, gives the early-exiting whole-batch result bit for bit."""
  T, ex = 5, np.arange(12, dtype=np.int32) % 3
  for seed in range(6):
    table = random_table(4000 + seed, eos_bias=seed % 3 - 1.0)
    kw = dict(T=T, K=K, alpha=alpha, stop="k_finished")
    a = run_beam_stop(table, ex, **kw)
    for b in (run_beam_stop(table, ex, shrink_to=3, **kw),
              run_beam_stop(table, ex, early_exit=False, **kw)):
      for name in ("tokens", "lengths", "valid", "weights", "scores", "log_probs"):
        np.testing.assert_array_equal(getattr(a.nbest, name), getattr(b.nbest, name),
                                      err_msg=f"{name}, seed {seed}")


def test_k_finished_stops_sooner_than_the_bound():
  """Counted steps: k_finished never runs more steps than the exact bound, and over these
  tables it runs fewer (the bound waits until no live hypothesis can catch up)."""
  steps = []
  search = {stop: jax.jit(lambda tb, e, stop=stop: decode.beam_search(
      counting_step(tb, steps), toy_init(e), 2, 8, beam_size=3, length_penalty=1.0, stop=stop))
            for stop in ("bound", "k_finished")}
  fewer = 0
  for seed in range(10):
    table = random_table(5000 + seed, eos_bias=1.0)
    n = {}
    for stop, fn in search.items():
      steps.clear()
      jax.block_until_ready(fn(table, np.array([0, 1], np.int32)))
      jax.effects_barrier()
      n[stop] = len(steps)
    assert n["k_finished"] <= n["bound"], (seed, n)
    fewer += int(n["k_finished"] < n["bound"])
  assert fewer >= 3


def test_unknown_stop_rule_is_refused_by_name():
  with pytest.raises(ValueError, match="stop='soon' is not a beam search stop rule; known: "
                                       "bound, k_finished"):
    decode.beam_search(toy_step(jnp.zeros((1, P, V))), toy_init(np.zeros((1,), np.int32)), 1, 3,
                       beam_size=2, stop="soon")


@functools.partial(jax.jit, static_argnames=("T", "min_len", "ngram", "shrink_to"))
def run_greedy_shrink(table, ex, *, T, min_len, ngram, shrink_to):
  return decode.greedy_decode(toy_step(table), toy_init(ex), ex.shape[0], T, min_len=min_len,
                              block_repeat_ngram=ngram, shrink_to=shrink_to)


@pytest.mark.parametrize("min_len,ngram", [(0, 0), (2, 2)])
def test_greedy_shrinking_is_greedy(min_len, ngram):
  """Greedy with shrink_to runs as a one-beam search that lets finished rows leave: the same
  tokens, lengths, weights and scores as the plain greedy loop, rows cut off at max_len
  included."""
  T, ex = 6, np.arange(12, dtype=np.int32) % 3
  cut_off = finished_early = 0
  for seed in range(8):
    table = random_table(6000 + seed, eos_bias=seed % 4 - 1.5)
    kw = dict(T=T, min_len=min_len, ngram=ngram)
    a = run_greedy_shrink(table, ex, shrink_to=0, **kw)
    b = run_greedy_shrink(table, ex, shrink_to=3, **kw)
    assert b.nbest is None
    for name in ("tokens", "lengths", "weights"):
      np.testing.assert_array_equal(getattr(a, name), getattr(b, name),
                                    err_msg=f"{name}, seed {seed}")
    np.testing.assert_allclose(a.scores, b.scores, rtol=1e-6, err_msg=f"seed {seed}")
    lengths = np.asarray(a.lengths)
    cut_off += int((lengths == T).any())
    finished_early += int((lengths < T).any())
  assert cut_off and finished_early
