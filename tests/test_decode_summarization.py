"""Summarization options of greedy_decode / beam_search: min_len, n-gram blocking, the GNMT coverage
penalty and per-step extras (e.g. the pointer-generator's p_gen), against NumPy references.

The main toy is the prefix-code decoder of test_decode.py: its state carries a code unique to
every prefix, and the log-probs, attention row and extras of a step are rows of tables indexed by
that code, so a hypothesis given another beam's state or history gets values that the NumPy
reference, recomputing them along the returned tokens, does not.
"""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attn import decoding as search
from attn.data.tokens import BOS, EOS, PAD

V, TS = 5, 3                 # vocabulary (PAD, BOS, EOS, 3, 4), source length
BASE = V + 1                 # code digits y + 1 in 1..V: distinct prefixes, distinct codes
P = 4099                     # table rows


def next_code(code, y_prev):
  return code * BASE + y_prev + 1


def code_step(logp_table, attn_table, pgen_table):
  """step_fn over [E, P, V] log-probs, [E, P, TS] attention and [E, P] extras tables; with
  pgen_table None it returns no extras."""
  def step_fn(state, y_prev):
    code = next_code(state["code"], y_prev)                             # [B]
    row = (state["ex"], code % P)
    out = ({"ex": state["ex"], "code": code}, logp_table[row], attn_table[row])
    if pgen_table is None:
      return out
    return out + ({"p_gen": pgen_table[row], "minus": -pgen_table[row]},)
  return step_fn


def code_init(ex):
  ex = jnp.asarray(ex, jnp.int32)
  return {"ex": ex, "code": jnp.zeros_like(ex)}


@functools.partial(jax.jit, static_argnames=("T", "min_len", "n"))
def run_greedy(tables, ex, *, T, min_len=0, n=0):
  return search.greedy_decode(code_step(*tables), code_init(ex), ex.shape[0], T,
                              min_len=min_len, block_repeat_ngram=n)


@functools.partial(jax.jit,
                   static_argnames=("T", "K", "alpha", "min_len", "n", "beta", "early_exit"))
def run_beam(tables, ex, src_len, *, T, K, alpha=0.6, min_len=0, n=0, beta=0.0, early_exit=True):
  return search.beam_search(code_step(*tables), code_init(ex), ex.shape[0], T, beam_size=K,
                            length_penalty=alpha, min_len=min_len, block_repeat_ngram=n,
                            coverage_penalty=beta, source_lengths=src_len,
                            early_exit=early_exit)


def random_tables(seed, E=3, eos_bias=0.0, extras=True):
  """(log-probs [E, P, V], attention [E, P, TS], p_gen [E, P] or None), float32. Attention rows
  are sparse (about a third of the entries exactly 0) so the coverage floor matters."""
  rng = np.random.default_rng(seed)
  logits = rng.normal(0.0, 1.5, (E, P, V))
  logits[..., EOS] += eos_bias
  logits[..., [PAD, BOS]] = -6.0
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  attn = rng.dirichlet(np.ones(TS), (E, P)) * (rng.random((E, P, TS)) > 0.33)
  attn /= np.maximum(attn.sum(-1, keepdims=True), 1e-9)
  pgen = rng.random((E, P)) if extras else None
  return tuple(None if x is None else x.astype(np.float32) for x in (logp, attn, pgen))


# ----------------------------------------------------------------------------- NumPy references

def np_rows(tokens):
  """Table row of the step that produced each token."""
  rows, code, y_prev = [], 0, BOS
  for y in tokens:
    code = next_code(code, y_prev)
    rows.append(code % P)
    y_prev = y
  return rows


def np_constrain(logp, prefix, min_len, n):
  """The documented constraint rules on one row of float64 log-probs, given the generated prefix."""
  logp, t = np.array(logp, np.float64), len(prefix)
  if n:
    banned = {prefix[s + n - 1] for s in range(t - n + 1)
              if prefix[s:s + n - 1] == prefix[t - n + 1:t]} - {EOS}
    blocked = logp.copy()
    blocked[list(banned)] = -np.inf
    if np.isfinite(blocked).any():
      logp = blocked
  if t + 1 < min_len:
    no_eos = logp.copy()
    no_eos[EOS] = -np.inf
    if np.isfinite(no_eos).any():
      logp = no_eos
  return logp


def np_greedy(logp_table, ex, T, min_len=0, n=0):
  tokens = []
  while len(tokens) < T and (not tokens or tokens[-1] != EOS):
    row = np_rows(tokens + [0])[-1]
    tokens.append(int(np.argmax(np_constrain(logp_table[ex, row], tokens, min_len, n))))
  return tokens


def has_repeated_ngram(tokens, n):
  grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
  return len(grams) != len(set(grams))


def np_coverage_penalty(weights, src_len, beta):
  """float64 GNMT coverage penalty of one [T, Ts] attention history."""
  cov = np.asarray(weights, np.float64).sum(0)[:src_len]
  return beta * np.log(np.clip(cov, search.COVERAGE_FLOOR, 1.0)).sum()


def np_all_hypotheses(tables, ex, src_len, T, alpha, beta, min_len, n):
  """Every complete hypothesis the constraints allow, best first: (score, tokens, log P)."""
  logp_table, attn_table, _ = tables
  out = []
  for length in range(1, T + 1):
    for seq in itertools.product(range(V), repeat=length):
      seq = list(seq)
      if EOS in seq[:-1] or (length < T and seq[-1] != EOS):
        continue
      rows = np_rows(seq)
      if not all(np_constrain(logp_table[ex, r], seq[:t], min_len, n)[seq[t]] > -np.inf
                 for t, r in enumerate(rows)):
        continue
      logp = sum(np.float64(logp_table[ex, r, y]) for r, y in zip(rows, seq))
      cp = np_coverage_penalty(attn_table[ex, rows], src_len, beta)
      out.append((logp / ((5.0 + length) / 6.0) ** alpha + cp, seq, logp))
  return sorted(out, key=lambda h: -h[0])


def check_histories(tables, ex, tokens, length, weights, extras, T):
  """weights [T, TS] and extras {name: [T]} are the ones the toy gives along `tokens`."""
  _, attn_table, pgen_table = tables
  rows = np_rows([int(y) for y in tokens[:length]])
  w = np.zeros((T, TS), np.float32)
  w[:length] = attn_table[ex, rows]
  np.testing.assert_array_equal(weights, w)
  g = np.zeros(T, np.float32)
  g[:length] = pgen_table[ex, rows]
  np.testing.assert_array_equal(extras["p_gen"], g)
  np.testing.assert_array_equal(extras["minus"], -g)


# ----------------------------------------------------------------------------- defaults

# beam_search(K=3, T=5, alpha=0.6) and greedy_decode(T=5) of random_tables(21) for ex = [0, 1],
# computed by the searches before min_len / n-gram blocking / coverage / extras existed.
GOLDEN_BEAM_TOKENS = [[[4, 2, 0, 0, 0], [4, 3, 2, 0, 0], [4, 3, 3, 3, 3]],
                      [[3, 2, 0, 0, 0], [2, 0, 0, 0, 0], [3, 3, 2, 0, 0]]]
GOLDEN_BEAM_SCORES = [["-0x1.b82474p-2", "-0x1.01fa98p+1", "-0x1.26d05cp+1"],
                      ["-0x1.2f5a26p+0", "-0x1.6b4c50p+0", "-0x1.8236fap+0"]]
GOLDEN_GREEDY_TOKENS = [[4, 2, 0, 0, 0], [3, 3, 2, 0, 0]]


def test_defaults_reproduce_the_searches_before_these_options_bit_for_bit():
  tables, ex, T = random_tables(21), np.array([0, 1], np.int32), 5
  src_len = np.array([3, 2], np.int32)
  no_extras = tables[:2] + (None,)
  base = run_beam(no_extras, ex, None, T=T, K=3)
  np.testing.assert_array_equal(base.nbest.tokens, GOLDEN_BEAM_TOKENS)
  np.testing.assert_array_equal(
      base.nbest.scores, np.array([[float.fromhex(s) for s in r] for r in GOLDEN_BEAM_SCORES],
                                  np.float32))
  greedy = run_greedy(no_extras, ex, T=T)
  np.testing.assert_array_equal(greedy.tokens, GOLDEN_GREEDY_TOKENS)
  assert base.extras is None and base.nbest.extras is None and greedy.extras is None
  # Options at values that change nothing, and extras, leave every array bit for bit the same.
  out = run_beam(tables, ex, src_len, T=T, K=3, min_len=1, beta=0.0)
  out = out._replace(extras=None, nbest=out.nbest._replace(extras=None))
  for a, b in zip(jax.tree.leaves(base), jax.tree.leaves(out)):
    np.testing.assert_array_equal(a, b)
  for a, b in zip(jax.tree.leaves(greedy),
                  jax.tree.leaves(run_greedy(tables, ex, T=T, min_len=1)._replace(extras=None))):
    np.testing.assert_array_equal(a, b)


# ----------------------------------------------------------------------------- min_len

def eos_first_tables(seed):
  tables = random_tables(seed, E=2)
  tables[0][..., EOS] = np.log(0.9)  # EOS is the argmax everywhere
  return tables


def test_min_len_greedy_and_beam():
  T, min_len, ex = 6, 4, np.array([0, 1], np.int32)
  tables = eos_first_tables(3)
  assert [np_greedy(tables[0], b, T) for b in range(2)] == [[EOS], [EOS]]
  out = run_greedy(tables, ex, T=T, min_len=min_len)
  for b in range(2):
    tokens = np_greedy(tables[0], b, T, min_len=min_len)
    assert len(tokens) == min_len and tokens[-1] == EOS
    np.testing.assert_array_equal(out.tokens[b], tokens + [PAD] * (T - min_len))
    assert int(out.lengths[b]) == min_len
    # Scores stay the model's log-probs of the chosen tokens.
    np.testing.assert_allclose(
        out.scores[b], sum(tables[0][b, r, y] for r, y in zip(np_rows(tokens), tokens)),
        rtol=1e-5)
  beam = run_beam(tables, ex, None, T=T, K=3, min_len=min_len)
  assert (np.asarray(beam.nbest.lengths) >= min_len).all() and np.asarray(beam.nbest.valid).all()
  assert (np.asarray(beam.lengths) == min_len).all()  # EOS at once is still the likeliest end


# ----------------------------------------------------------------------------- n-gram blocking

@pytest.mark.parametrize("n,min_len", [(1, 3), (3, 0)])
def test_ngram_blocking_greedy_matches_numpy(n, min_len):
  T, ex = 8, np.array([0, 1, 2], np.int32)
  for seed in range(4):
    tables = random_tables(100 + seed, eos_bias=-1.0)
    out = run_greedy(tables, ex, T=T, min_len=min_len, n=n)
    for b in range(3):
      tokens = np_greedy(tables[0], b, T, min_len=min_len, n=n)
      np.testing.assert_array_equal(out.tokens[b], tokens + [PAD] * (T - len(tokens)),
                                    err_msg=f"seed {seed}, example {b}")
      check_histories(tables, b, out.tokens[b], int(out.lengths[b]), out.weights[b],
                      {k: v[b] for k, v in out.extras.items()}, T)


TA, TB, TC, TD = 3, 4, 5, 6  # content tokens a, b, c, d of the Markov toy (vocabulary of 7)


def markov_step(table):
  """step_fn with log p(. | y_prev) = table[ex, y_prev] ([E, V, V]); attention unused."""
  def step_fn(state, y_prev):
    return state, table[state["ex"], y_prev], jnp.zeros((y_prev.shape[0], 2))
  return step_fn


@functools.partial(jax.jit, static_argnames=("T", "K", "min_len", "n"))
def run_markov(table, ex, *, T, K, min_len=0, n=0):
  init = {"ex": jnp.asarray(ex)}
  if K == 1:
    return search.greedy_decode(markov_step(table), init, ex.shape[0], T, min_len=min_len,
                                block_repeat_ngram=n)
  return search.beam_search(markov_step(table), init, ex.shape[0], T, beam_size=K,
                            min_len=min_len, block_repeat_ngram=n)


def markov_table(rows, vocab):
  """[1, vocab, vocab] log-probs from {y_prev: {y: p}} (unlisted entries share what is left)."""
  p = np.full((vocab, vocab), 1e-3)
  for y_prev, probs in rows.items():
    for y, q in probs.items():
      p[y_prev, y] = q
  return np.log(p / p.sum(-1, keepdims=True)).astype(np.float32)[None]


def test_trigram_blocking_breaks_a_loop_in_greedy_and_beam():
  """A chain that loops a b c a b c ... repeats trigrams without blocking and none with it."""
  loop = markov_table({BOS: {TA: .9}, TA: {TB: .9}, TB: {TC: .9}, TC: {TA: .6, TD: .2},
                       TD: {TA: .5, TB: .3}}, 7)
  ex = np.zeros((1,), np.int32)
  for K in (1, 3):
    free = run_markov(loop, ex, T=9, K=K)
    assert list(np.asarray(free.tokens[0])) == [TA, TB, TC] * 3
    blocked = run_markov(loop, ex, T=9, K=K, n=3)
    hyps = ([blocked.tokens[0]] if K == 1 else
            [h for h, ok in zip(blocked.nbest.tokens[0], blocked.nbest.valid[0]) if ok])
    for h in hyps:
      h = [int(y) for y in h if y != PAD]
      assert not has_repeated_ngram(h, 3), h
    assert has_repeated_ngram([int(y) for y in free.tokens[0]], 3)


def test_a_row_with_every_token_banned_still_ends_or_continues():
  """Vocabulary PAD, BOS, EOS, 3 (PAD and BOS impossible). Unigram blocking bans 3 after the
  first 3 and min_len bans EOS: EOS stays the way out (example 0). When the model itself gives
  EOS probability 0 (example 1), the row keeps its unblocked log-probs. Never a token of
  probability 0, never NaN."""
  p = np.full((2, 4, 4), -np.inf, np.float32)
  p[:, :, 3], p[:, :, EOS] = np.log(0.9), np.log(0.1)
  p[1, :, 3], p[1, :, EOS] = 0.0, -np.inf
  ex = np.array([0, 1], np.int32)
  for K in (1, 2):
    out = run_markov(p, ex, T=5, K=K, min_len=4, n=1)
    np.testing.assert_array_equal(out.tokens, [[3, EOS, PAD, PAD, PAD], [3, 3, 3, 3, 3]])
    np.testing.assert_allclose(out.scores, [np.log(0.9) + np.log(0.1), 0.0], rtol=1e-6)


# ----------------------------------------------------------------------------- coverage penalty

def coverage_case():
  """Markov step over V = 5 (PAD, BOS, EOS, 3, 4) and Ts = 4 source positions (the last never
  attended). From the start, 3 (p .6) then EOS, or 4 (p .18) then EOS, or EOS (p ~.22). Attention:
  start [.5, .25, .25, 0]; after 3 [0, 0, 1, 0]; after 4 [.5, .75, 0, 0]; elsewhere [1/3] * 3 + [0].
  So [3, EOS] covers [.5, .25, 1.25, 0] and [4, EOS] covers [1, 1, .25, 0]."""
  logp = np.full((5, 5), 1e-4)
  logp[BOS, [3, 4]] = [0.6, 0.18]
  logp[BOS, EOS] = 1.0 - logp[BOS].sum() + 1e-4
  logp[[3, 4, EOS], EOS] = 0.999
  logp = np.log(logp / logp.sum(-1, keepdims=True)).astype(np.float32)
  attn = np.full((5, 4), 1 / 3, np.float32)
  attn[:, 3] = 0.0
  attn[BOS], attn[3], attn[4] = [.5, .25, .25, 0], [0, 0, 1, 0], [.5, .75, 0, 0]
  return logp, attn


@functools.partial(jax.jit, static_argnames=("beta",))
def run_coverage_case(logp, attn, src_len, *, beta):
  def step_fn(state, y_prev):
    return state, logp[y_prev], attn[y_prev]
  B = src_len.shape[0]
  return search.beam_search(step_fn, {"s": jnp.zeros((B,))}, B, 3, beam_size=3,
                            length_penalty=0.0, coverage_penalty=beta, source_lengths=src_len)


def test_coverage_penalty_reranks_as_computed_by_hand():
  logp, attn = coverage_case()
  src_len = np.array([2, 3, 4], np.int32)        # the same hypotheses, three source lengths
  hyps = {"A": [3, EOS], "B": [4, EOS], "E": [EOS]}
  for beta, winners in ((0.0, "AAA"), (1.0, "BAA")):
    out = run_coverage_case(logp, attn, src_len, beta=beta)
    for b, n in enumerate(src_len):
      expected = {}
      for name, seq in hyps.items():
        prev = [BOS] + seq[:-1]
        lp = sum(np.float64(logp[p, y]) for p, y in zip(prev, seq))
        expected[name] = lp + np_coverage_penalty(attn[prev], n, beta)
      order = sorted(expected, key=lambda k: -expected[k])
      assert order[0] == winners[b], (beta, b, expected)
      for k, name in enumerate(order):
        seq = hyps[name]
        np.testing.assert_array_equal(out.nbest.tokens[b, k], seq + [PAD] * (3 - len(seq)))
        np.testing.assert_allclose(out.nbest.scores[b, k], expected[name], rtol=1e-6)
  # By hand, beta = 1, |X| = 2 (p(EOS | 3) = p(EOS | 4) = .9996 after normalization):
  # A = log .6 + log .9996 + log .5 + log .25 = -2.5907,
  # B = log .18 + log .9996 + 0 = -1.7152 (position 2, where A is ahead, is padding there).
  # |X| = 4: the never-attended position costs both log(COVERAGE_FLOOR) instead of -inf.
  out = run_coverage_case(logp, attn, src_len, beta=1.0)
  assert np.isfinite(np.asarray(out.nbest.scores)).all()
  np.testing.assert_allclose(out.nbest.scores[0, :2], [-1.7152, -2.5907], atol=1e-4)


def test_coverage_penalty_needs_source_lengths():
  logp, attn = coverage_case()
  step_fn = lambda s, y: (s, jnp.asarray(logp)[y], jnp.asarray(attn)[y])
  with pytest.raises(ValueError, match="source_lengths"):
    search.beam_search(step_fn, {"s": jnp.zeros((2,))}, 2, 3, beam_size=2, coverage_penalty=0.2)
  with pytest.raises(ValueError, match="source_lengths"):
    search.beam_search(step_fn, {"s": jnp.zeros((2,))}, 2, 3, beam_size=2, coverage_penalty=0.2,
                       source_lengths=jnp.ones((3,), jnp.int32))
  with pytest.raises(ValueError, match="min_len"):
    search.greedy_decode(step_fn, {"s": jnp.zeros((2,))}, 2, 3, min_len=4)
  with pytest.raises(ValueError, match="block_repeat_ngram"):
    search.greedy_decode(step_fn, {"s": jnp.zeros((2,))}, 2, 3, block_repeat_ngram=-1)


# ----------------------------------------------------------------------------- brute force

# K = 4^3 live prefixes x V tokens = 320 >= every candidate at every step for T = 4: exhaustive.
K_ALL, T_ALL = 320, 4


@pytest.mark.parametrize("alpha,min_len,n,beta", [(0.6, 3, 1, 0.5), (0.0, 2, 2, 0.3)])
def test_large_beam_finds_the_brute_force_ranking(alpha, min_len, n, beta):
  """With a beam that holds every candidate, the n-best list is every hypothesis the constraints
  allow, ranked by log P / lp + cp, each with its own attention and extras history."""
  tables, ex = random_tables(7, eos_bias=0.3), np.array([2, 0], np.int32)
  src_len = np.array([3, 2], np.int32)
  out = run_beam(tables, ex, src_len, T=T_ALL, K=K_ALL, alpha=alpha, min_len=min_len, n=n,
                 beta=beta)
  nb = out.nbest
  for b, e in enumerate(ex):
    hyps = np_all_hypotheses(tables, e, src_len[b], T_ALL, alpha, beta, min_len, n)
    gaps = -np.diff([h[0] for h in hyps[:11]])
    assert (gaps > 1e-5).all(), "reference has a near tie; pick another seed"
    for k in range(10):
      score, tokens, logp = hyps[k]
      L = len(tokens)
      np.testing.assert_array_equal(nb.tokens[b, k], tokens + [PAD] * (T_ALL - L))
      assert int(nb.lengths[b, k]) == L
      np.testing.assert_allclose(nb.scores[b, k], score, rtol=1e-5)
      np.testing.assert_allclose(nb.log_probs[b, k], logp, rtol=1e-5)
      check_histories(tables, e, nb.tokens[b, k], L, nb.weights[b, k],
                      {name: x[b, k] for name, x in nb.extras.items()}, T_ALL)
    n_valid = min(K_ALL, len(hyps))
    assert nb.valid[b, :n_valid].all() and not nb.valid[b, n_valid:].any()
    for name, x in out.extras.items():
      np.testing.assert_array_equal(x[b], nb.extras[name][b, 0])


def test_small_beam_keeps_extras_and_weights_with_their_hypothesis():
  """K = 3 < the candidates, so beams are reordered by parent at every step: every returned
  hypothesis' attention and extras are still the ones along its own tokens."""
  T, K, ex = 6, 3, np.array([0, 1, 2], np.int32)
  tables = random_tables(31, eos_bias=-0.5)
  out = run_beam(tables, ex, np.array([3, 2, 1], np.int32), T=T, K=K, min_len=2, n=2, beta=0.2)
  for b in range(3):
    for k in range(K):
      L = int(out.nbest.lengths[b, k])
      check_histories(tables, b, out.nbest.tokens[b, k], L, out.nbest.weights[b, k],
                      {name: x[b, k] for name, x in out.nbest.extras.items()}, T)
  assert set(out.extras) == {"p_gen", "minus"} and out.extras["p_gen"].shape == (3, T)
  assert out.nbest.extras["p_gen"].shape == (3, K, T)
  assert out.nbest.extras["p_gen"].dtype == jnp.float32


def test_early_exit_never_changes_the_result_with_coverage_and_constraints():
  T, K, ex, src_len = 8, 2, np.zeros((1,), np.int32), np.array([3], np.int32)
  early_exits = 0
  for seed in range(24):
    tables = random_tables(2000 + seed, E=1, eos_bias=1.0)
    runs = [run_beam(tables, ex, src_len, T=T, K=K, alpha=1.0, min_len=2, n=2, beta=0.4,
                     early_exit=ee) for ee in (True, False)]
    a, b = (r.nbest for r in runs)
    for name in ("tokens", "lengths", "valid", "weights", "extras"):
      jax.tree.map(functools.partial(np.testing.assert_array_equal, err_msg=f"{name} {seed}"),
                   getattr(a, name), getattr(b, name))
    for name in ("scores", "log_probs"):
      np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=1e-6)
    early_exits += int(np.asarray(a.lengths).max() < T)
  assert early_exits > 6


def test_extras_must_be_a_dict_of_batch_vectors():
  step_fn = lambda s, y: (s, jnp.zeros((2, V)), jnp.zeros((2, TS)), {"p_gen": jnp.zeros((2, 1))})
  with pytest.raises(ValueError, match="p_gen"):
    search.greedy_decode(step_fn, {"s": jnp.zeros((2,))}, 2, 3)
