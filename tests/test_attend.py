"""attend(): every score x normalizer, masks and scopes, against float64 NumPy and hand-computed cases."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import attn
import np_reference as ref

SCORES = attn.canonical_names("score")
NORMALIZERS = attn.canonical_names("normalizer")


def _qkv(lead=(2,), Tq=5, Tk=7, dq=6, dk=6, dv=3, seed=0, dtype=jnp.float32):
  kq, kk, kv = jax.random.split(jax.random.PRNGKey(seed), 3)
  return (jax.random.normal(kq, lead + (Tq, dq)).astype(dtype),
          jax.random.normal(kk, lead + (Tk, dk)).astype(dtype),
          jax.random.normal(kv, lead + (Tk, dv)).astype(dtype))


@pytest.mark.parametrize("score,normalizer", list(itertools.product(SCORES, NORMALIZERS)))
def test_attend_matches_numpy_with_padding(score, normalizer):
  q, k, v = _qkv(lead=(4,), Tq=5, Tk=7)
  params = attn.init_score(score, jax.random.PRNGKey(1), 6, 6, d_attn=4, max_len=9)
  # Lengths strictly inside (0, Tk) catch an off-by-one at the padding boundary; the last row
  # has no keys. The reference builds its own mask from the lengths.
  lengths = [1, 6, 3, 0]
  mask = attn.masks.padding_mask(jnp.array(lengths), 7)  # [4, 1, 7]
  ctx, w = attn.attend(params, q, k, v, score=score, normalizer=normalizer, mask=mask,
                       temperature=0.7)
  e = ref.SCORES[score](params, q, k)
  m_ref = ref.attention_mask(5, 7, key_lengths=lengths, lead=(4,))
  ctx_ref, w_ref = ref.attend(e, v, m_ref, normalizer, temperature=0.7)
  np.testing.assert_allclose(w, w_ref, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(ctx, ctx_ref, rtol=1e-5, atol=1e-5)
  assert (np.asarray(ctx[3]) == 0).all()


def test_causal_is_top_left_aligned_for_cross_attention():
  q, k, v = _qkv(lead=(), Tq=4, Tk=6)
  _, w = attn.attend(None, q, k, v, causal=True)
  expected_support = np.array([[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0],
                               [1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0]], bool)
  np.testing.assert_array_equal(np.asarray(w) > 0, expected_support)


def test_window_mask_hand_computed():
  expected = np.array([[1, 1, 0, 0, 0],
                       [1, 1, 1, 0, 0],
                       [0, 1, 1, 1, 0],
                       [0, 0, 1, 1, 1]], bool)
  np.testing.assert_array_equal(attn.masks.sliding_window_mask(4, 5, 1), expected)
  q, k, v = _qkv(lead=(), Tq=4, Tk=5)
  _, w = attn.attend(None, q, k, v, scope="window", half_width=1)
  np.testing.assert_array_equal(np.asarray(w) > 0, expected)


def test_local_m_uses_given_positions():
  q, k, v = _qkv(lead=(), Tq=3, Tk=8)
  _, w = attn.attend(None, q, k, v, scope="local_m", half_width=1, positions=jnp.array([6, 0, 3]))
  expected = np.zeros((3, 8), bool)
  expected[0, 5:8] = expected[1, 0:2] = expected[2, 2:5] = True
  np.testing.assert_array_equal(np.asarray(w) > 0, expected)


def test_local_p_hand_computed_centre_window_and_gaussian():
  # W_p = 0 gives tanh(0) = 0, sigmoid(0) = 1/2, so p_t = S/2 = 3 for S = 6 valid keys.
  q, k, v = _qkv(lead=(), Tq=2, Tk=8)
  sp = {"W_p": jnp.zeros((6, 4)), "v_p": jnp.ones((4,))}
  mask = attn.masks.lengths_to_mask(6, 8)[None, :]  # [1, 8]: keys 6, 7 are padding
  _, w = attn.attend(None, q, k, v, mask=mask, scope="local_p", scope_params=sp, half_width=2)
  s = np.arange(8)
  window = (np.abs(s - 3) <= 2) & (s < 6)
  gain = np.exp(-((s - 3.0) ** 2) / (2 * 1.0**2))  # sigma = D/2 = 1
  e = np.asarray(q, np.float64) @ np.asarray(k, np.float64).T
  base = ref.softmax(e, np.broadcast_to(window, e.shape))
  np.testing.assert_allclose(w, base * gain, rtol=1e-5, atol=1e-7)


def test_local_p_matches_numpy_and_trains_its_position_predictor():
  q, k, v = _qkv(lead=(3,), Tq=4, Tk=9)
  sp = attn.init_scope("local_p", jax.random.PRNGKey(3), 6, d_attn=5)
  lengths = [1, 8, 4]
  mask = attn.masks.padding_mask(jnp.array(lengths), 9)
  ctx, w = attn.attend(None, q, k, v, mask=mask, scope="local_p", scope_params=sp, half_width=2)
  _, m, gain = ref.local_p(sp, q, ref.attention_mask(4, 9, key_lengths=lengths, lead=(3,)), 2)
  ctx_ref, w_ref = ref.attend(ref.dot(None, q, k), v, m, gain=gain)
  np.testing.assert_allclose(w, w_ref, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(ctx, ctx_ref, rtol=1e-5, atol=1e-5)
  g = jax.grad(lambda sp: attn.attend(None, q, k, v, mask=mask, scope="local_p", scope_params=sp,
                                      half_width=2)[0].sum())(sp)
  assert all(np.isfinite(x).all() and np.abs(x).sum() > 0 for x in jax.tree.leaves(g))


@pytest.mark.parametrize("top_k", [1, 3, 20])
def test_topk_matches_naive_selection(top_k):
  q, k, v = _qkv(lead=(2,), Tq=5, Tk=8)
  lengths = [7, 2]
  ctx, w = attn.attend(None, q, k, v, key_lengths=jnp.array(lengths), scope="topk", top_k=top_k)
  e = ref.dot(None, q, k)
  m = ref.topk_mask(e, ref.attention_mask(5, 8, key_lengths=lengths, lead=(2,)), top_k)
  assert (m.sum(-1) == np.minimum(top_k, [[7], [2]])).all()
  ctx_ref, w_ref = ref.attend(e, v, m)
  np.testing.assert_allclose(w, w_ref, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(ctx, ctx_ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("Tq,Tk", [(5, 7), (7, 4), (6, 6)])
def test_linear_attention_matches_its_weight_matrix_definition(causal, Tq, Tk):
  q, k, v = _qkv(lead=(4,), Tq=Tq, Tk=Tk)
  lengths = [Tk - 1, 1, Tk // 2, 0]
  mask = attn.masks.padding_mask(jnp.array(lengths), Tk)
  ctx, w = attn.attend(None, q, k, v, mask=mask, scope="linear", causal=causal)
  assert w is None
  expected = ref.linear_attention(q, k, v, ref.lengths_mask(lengths, Tk), causal=causal)
  np.testing.assert_allclose(ctx, expected, rtol=1e-5, atol=1e-5)
  assert (np.asarray(ctx[3]) == 0).all()


def test_linear_attention_refuses_per_query_masks_and_parametric_scores():
  q, k, v = _qkv(lead=(), Tq=3, Tk=3)
  with pytest.raises(ValueError, match="key-padding"):
    attn.attend(None, q, k, v, mask=attn.masks.causal_mask(3, 3), scope="linear")
  with pytest.raises(ValueError, match="own similarity"):
    attn.attend(None, q, k, v, scope="linear", normalizer="sparsemax")


SCOPES = [("global", {}), ("window", {"half_width": 1}), ("local_m", {"half_width": 2}),
          ("topk", {"top_k": 2}), ("linear", {})]


# Linear attention has no normalizer choice (others are refused, tested above).
@pytest.mark.parametrize("scope,opts,normalizer", [
    (s, o, n) for (s, o), n in itertools.product(SCOPES, NORMALIZERS)
    if s != "linear" or n == "softmax"])
def test_no_nan_in_value_or_gradient_with_fully_masked_rows(scope, opts, normalizer):
  q, k, v = _qkv(lead=(3,), Tq=4, Tk=6)
  mask = attn.masks.padding_mask(jnp.array([6, 0, 3]), 6)

  @jax.jit
  def loss(q, k, v):
    ctx, _ = attn.attend(None, q, k, v, normalizer=normalizer, mask=mask, scope=scope, **opts)
    return jnp.sum(ctx**2), ctx

  (_, ctx), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)
  assert np.isfinite(ctx).all() and (np.asarray(ctx[1]) == 0).all()
  for g in grads:
    assert np.isfinite(g).all() and (np.asarray(g[1]) == 0).all()


@pytest.mark.parametrize("score,normalizer,scope,opts", [
    ("additive", "softmax", "global", {}), ("general", "entmax15", "global", {}),
    ("scaled_dot", "sparsemax", "window", {"half_width": 1}), ("dot", "softmax", "linear", {}),
])
def test_attend_gradients_match_finite_differences(score, normalizer, scope, opts):
  with jax.enable_x64(True):
    q, k, v = _qkv(lead=(2,), Tq=3, Tk=4, dtype=jnp.float64)
    params = attn.init_score(score, jax.random.PRNGKey(2), 6, 6, d_attn=3)
    params = jax.tree.map(lambda p: p.astype(jnp.float64), params)
    mask = attn.masks.padding_mask(jnp.array([4, 2]), 4)
    f = lambda p, q, k, v: attn.attend(p, q, k, v, score=score, normalizer=normalizer, mask=mask,
                                       scope=scope, **opts)[0]
    check_grads(f, (params, q, k, v), order=1, modes=("rev",), atol=1e-5, rtol=1e-5, eps=1e-6)


@pytest.mark.parametrize("score", SCORES)
def test_vmap_equals_batched_and_jit_equals_eager(score):
  q, k, v = _qkv(lead=(4,), Tq=3, Tk=5)
  params = attn.init_score(score, jax.random.PRNGKey(1), 6, 6, d_attn=4, max_len=5)
  mask = attn.masks.padding_mask(jnp.array([5, 1, 3, 0]), 5)  # [4, 1, 5]
  run = lambda q, k, v, m: attn.attend(params, q, k, v, score=score, mask=m)
  batched = run(q, k, v, mask)
  mapped = jax.vmap(run)(q, k, v, mask)
  with jax.disable_jit():
    eager = run(q, k, v, mask)
  for a, b in ((mapped, batched), (eager, batched)):
    np.testing.assert_allclose(a[0], b[0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(a[1], b[1], rtol=1e-6, atol=1e-7)


def test_bfloat16_inputs_accumulate_in_float32_and_return_input_dtype():
  q, k, v = _qkv(lead=(2,), Tq=5, Tk=6, dtype=jnp.bfloat16)
  ctx, w = attn.attend(None, q, k, v, score="scaled_dot")
  assert ctx.dtype == jnp.bfloat16 and w.dtype == jnp.float32
  ctx_ref, w_ref = ref.attend(ref.scaled_dot(None, q.astype(jnp.float32), k.astype(jnp.float32)),
                              v.astype(jnp.float32))
  np.testing.assert_allclose(w, w_ref, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(ctx.astype(jnp.float32), ctx_ref, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("kwargs,match", [
    (dict(k=jnp.ones((2, 6, 6)), v=jnp.ones((2, 5, 3))), "disagree on Tk"),
    (dict(mask=jnp.ones((2, 5, 7))), "boolean"),
    (dict(mask=jnp.ones((2, 4, 7), bool)), "does not broadcast"),
    (dict(scope="window"), "half_width"),
    (dict(scope="topk"), "top_k"),
    (dict(scope="local_p", half_width=2), "scope_params"),
    (dict(scope="glocal"), "global"),
])
def test_bad_input_errors_name_the_problem(kwargs, match):
  q, k, v = _qkv(lead=(2,), Tq=5, Tk=7)
  args = dict(k=k, v=v) | kwargs
  k_, v_ = args.pop("k"), args.pop("v")
  with pytest.raises((ValueError, KeyError), match=match):
    attn.attend(None, q, k_, v_, **args)


@pytest.mark.parametrize("score", ["dot", "scaled_dot", "additive"])
@pytest.mark.parametrize("causal", [False, True])
def test_fused_attend_equals_unfused_in_value_and_gradient(score, causal):
  q, k, v = _qkv(lead=(2, 3), Tq=5, Tk=7, dq=8, dk=8, dv=4)
  params = attn.init_score(score, jax.random.PRNGKey(1), 8, 8, d_attn=6)
  lengths = jnp.array([[7, 3, 0], [1, 7, 5]])  # one sequence with no keys at all

  def run(fused, params, q, k, v):
    ctx, w = attn.attend(params, q, k, v, score=score, key_lengths=lengths, causal=causal,
                         temperature=0.7, fused=fused)
    return ctx, w

  (a, w), (b, w_fused) = run(False, params, q, k, v), run(True, params, q, k, v)
  assert w_fused is None
  np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
  assert (np.asarray(b[0, 2]) == 0).all()
  loss = lambda fused: jax.grad(lambda *a: jnp.sum(run(fused, *a)[0] ** 2),
                                argnums=(0, 1, 2, 3))(params, q, k, v)
  for ga, gb in zip(jax.tree.leaves(loss(False)), jax.tree.leaves(loss(True))):
    assert np.isfinite(gb).all()
    np.testing.assert_allclose(gb, ga, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kwargs", [dict(score="general"), dict(normalizer="sparsemax"),
                                    dict(scope="window", half_width=1),
                                    dict(mask=jnp.ones((5, 7), bool))])
def test_fused_attend_refuses_what_the_kernels_cannot_do(kwargs):
  q, k, v = _qkv(lead=(2,), Tq=5, Tk=7)
  params = attn.init_score(kwargs.get("score", "dot"), jax.random.PRNGKey(1), 6, 6)
  with pytest.raises(ValueError, match="fused attention supports"):
    attn.attend(params, q, k, v, fused=True, **kwargs)


# ----------------------------------------------------------------------------- masks and precision

def test_masks_match_numpy_loops_at_the_length_boundary():
  """Lengths strictly inside (0, T): an off-by-one at the padding boundary changes the mask."""
  T, Tq = 7, 5
  lengths, q_lengths = np.array([1, T - 1, T // 2]), np.array([Tq - 1, 1, 2])
  np.testing.assert_array_equal(attn.masks.lengths_to_mask(jnp.asarray(lengths), T),
                                ref.lengths_mask(lengths, T))
  pm = attn.masks.padding_mask(jnp.asarray(lengths), T, query_lengths=jnp.asarray(q_lengths), Tq=Tq)
  expected = (ref.attention_mask(Tq, T, key_lengths=lengths, lead=(3,))
              & ref.lengths_mask(q_lengths, Tq)[..., None])
  np.testing.assert_array_equal(pm, expected)
  np.testing.assert_array_equal(attn.masks.causal_mask(Tq, T), ref.attention_mask(Tq, T, causal=True))
  # attend's own key_lengths path, with causal masking on top.
  q, k, v = _qkv(lead=(3,), Tq=Tq, Tk=T)
  _, w = attn.attend(None, q, k, v, key_lengths=jnp.asarray(lengths), causal=True)
  np.testing.assert_array_equal(
      np.asarray(w) > 0, ref.attention_mask(Tq, T, key_lengths=lengths, causal=True, lead=(3,)))


def test_window_mask_and_gaussian_are_float64_accurate_at_the_window_edge():
  """Centres 5 +- 1e-9 with D = 2 put keys 3 and 7 within 1e-9 of the window edge: in float32
  both centres round to 5.0 and both keys land inside."""
  with jax.enable_x64(True):
    centers = np.array([[5.0 + 1e-9, 5.0 - 1e-9, np.e, 7.25]])  # [1, Tq = 4]
    Tk, D = 11, 2.0
    m = np.asarray(attn.masks.window_mask(jnp.asarray(centers), Tk, D))
    np.testing.assert_array_equal(m, ref.window_mask(centers, Tk, D))
    assert not m[0, 0, 3] and m[0, 0, 7] and m[0, 1, 3] and not m[0, 1, 7]
    g = attn.masks.gaussian_window(jnp.asarray(centers), Tk, D)
    assert g.dtype == jnp.float64
    np.testing.assert_allclose(g, ref.gaussian_window(centers, Tk, D), rtol=1e-12, atol=0)
    # local-m takes float positions through the same window.
    q, k, v = _qkv(lead=(), Tq=4, Tk=Tk, dtype=jnp.float64)
    _, w = attn.attend(None, q, k, v, scope="local_m", half_width=D, positions=jnp.asarray(centers[0]))
    np.testing.assert_array_equal(np.asarray(w) > 0, ref.window_mask(centers[0], Tk, D))


def test_local_p_in_float64_matches_numpy_including_a_key_at_the_window_edge():
  with jax.enable_x64(True):
    q, k, v = _qkv(lead=(3,), Tq=4, Tk=9, dtype=jnp.float64)
    sp = attn.init_scope("local_p", jax.random.PRNGKey(3), 6, d_attn=5)
    lengths = [1, 8, 4]
    m0 = ref.attention_mask(4, 9, key_lengths=lengths, lead=(3,))
    p, _, _ = ref.local_p(sp, q, m0, 2.0)
    # A half-width that puts valid key j0 of row (1, 0) 1e-10 from the window edge, on the side
    # opposite to where float32 rounding of p_t would move it.
    b, i = 1, 0
    j0 = int(np.round(p[b, i])) + (2 if p[b, i] < 4 else -2)
    d64 = abs(j0 - p[b, i])
    d32 = abs(j0 - np.float64(np.float32(p[b, i])))
    inside = d32 > d64
    D = float(d64 + (1e-10 if inside else -1e-10))
    ctx, w = attn.attend(None, q, k, v, key_lengths=jnp.asarray(lengths), scope="local_p",
                         scope_params=sp, half_width=D)
    _, m, gain = ref.local_p(sp, q, m0, D)
    assert m[b, i, j0] == inside
    ctx_ref, w_ref = ref.attend(ref.dot(None, q, k), v, m, gain=gain)
    assert ctx.dtype == w.dtype == jnp.float64
    np.testing.assert_array_equal(np.asarray(w) > 0, m)
    np.testing.assert_allclose(w, w_ref, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(ctx, ctx_ref, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("fused", [False, True])
def test_additive_attend_with_nonzero_bias_matches_numpy_in_value_and_gradient(fused):
  """init_additive sets b = 0, so only a test with a random b sees how b enters the score."""
  q, k, v = _qkv(lead=(3,), Tq=4, Tk=5, dq=6, dk=6, dv=3)
  params = attn.init_score("additive", jax.random.PRNGKey(1), 6, 6, d_attn=4)
  params["b"] = jax.random.normal(jax.random.PRNGKey(2), (4,))
  lengths = [1, 4, 2]
  m = ref.attention_mask(4, 5, key_lengths=lengths, lead=(3,))
  cot = np.random.default_rng(0).normal(size=(3, 4, 3))

  def loss(p, q, k, v):
    ctx, _ = attn.attend(p, q, k, v, score="additive", key_lengths=jnp.asarray(lengths),
                         temperature=0.7, fused=fused)
    return jnp.sum(ctx * cot), ctx

  def ref_loss(p, q, k, v):
    return np.sum(ref.attend(ref.additive(p, q, k), v, m, temperature=0.7)[0] * cot)

  (_, ctx), grads = jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True)(params, q, k, v)
  ctx_ref, _ = ref.attend(ref.additive(params, q, k), v, m, temperature=0.7)
  np.testing.assert_allclose(ctx, ctx_ref, rtol=1e-5, atol=1e-5)
  ctx_b0, _ = ref.attend(ref.additive(params | {"b": np.zeros(4)}, q, k), v, m, temperature=0.7)
  assert np.abs(ctx_ref - ctx_b0).max() > 1e-2  # the bias matters for this case
  args = [jax.tree.map(np.asarray, params), np.asarray(q), np.asarray(k), np.asarray(v)]
  for name in ("b", "W", "U", "v"):
    fn = lambda x, name=name: ref_loss(args[0] | {name: x}, *args[1:])
    np.testing.assert_allclose(grads[0][name], ref.numeric_grad(fn, args[0][name]),
                               rtol=1e-4, atol=1e-5, err_msg=f"d/d{name}")
  for a, (name, g) in enumerate(zip("qkv", grads[1:]), start=1):
    fn = lambda x, a=a: ref_loss(*args[:a], x, *args[a + 1:])
    np.testing.assert_allclose(g, ref.numeric_grad(fn, args[a]), rtol=1e-4, atol=1e-5,
                               err_msg=f"d/d{name}")


@pytest.mark.parametrize("normalizer", NORMALIZERS)
@pytest.mark.parametrize("scope,opts", [("global", {}), ("window", dict(half_width=1)),
                                        ("topk", dict(top_k=2)), ("global", dict(causal=True))])
def test_returned_scores_are_the_raw_scores_and_renormalize_to_the_weights(normalizer, scope, opts):
  q, k, v = _qkv(lead=(3,), Tq=5, Tk=7)
  params = attn.init_score("general", jax.random.PRNGKey(1), 6, 6)
  lengths = jnp.array([7, 4, 0])
  _, w, e = attn.attend(params, q, k, v, score="general", normalizer=normalizer, scope=scope,
                        temperature=0.6, key_lengths=lengths, return_scores=True, **opts)
  e, w = np.asarray(e), np.asarray(w)
  allowed = np.isfinite(e)
  # The raw scores (no temperature) on what may be attended, -inf elsewhere.
  np.testing.assert_allclose(e[allowed], np.asarray(ref.SCORES["general"](params, q, k))[allowed],
                             rtol=1e-5, atol=1e-5)
  assert not allowed[2].any() and not allowed[1][:, 4:].any()
  if opts.get("causal"):
    assert not np.triu(allowed[0], 1).any()
  # A viewer re-normalizing the scores at the run's temperature gets the weights back.
  again = attn.normalize(jnp.where(allowed, e, 0.0), jnp.asarray(allowed), kind=normalizer,
                         temperature=0.6)
  np.testing.assert_allclose(again, w, atol=1e-6)


def test_variants_that_form_no_scores_return_none():
  q, k, v = _qkv(lead=(2,), Tq=4, Tk=4)
  assert attn.attend(None, q, k, v, scope="linear", return_scores=True)[2] is None
  assert attn.attend(None, q, k, v, fused=True, return_scores=True)[2] is None
