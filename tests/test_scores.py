"""Scores against float64 NumPy definitions, in float32, bfloat16 and float64 (gradients)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import attn
import np_reference as ref

SCORES = attn.canonical_names("score")
SAME_DIM = {"dot", "scaled_dot"}  # scores that need dq == dk
TOL = {jnp.float32: 2e-5, jnp.bfloat16: 3e-2}


def _inputs(name, lead, Tq, Tk, dtype=jnp.float32, seed=0):
  dq, dk = (6, 6) if name in SAME_DIM else (5, 7)  # different sizes catch axis mix-ups
  kq, kk, kp = jax.random.split(jax.random.PRNGKey(seed), 3)
  q = jax.random.normal(kq, lead + (Tq, dq)).astype(dtype)
  k = jax.random.normal(kk, lead + (Tk, dk)).astype(dtype)
  params = attn.init_score(name, kp, dq, dk, d_attn=3, max_len=11)
  return params, q, k


@pytest.mark.parametrize("name", SCORES)
@pytest.mark.parametrize("lead,Tq,Tk", [((), 5, 7), ((3,), 1, 9), ((2, 3), 4, 3)])
def test_score_matches_numpy(name, lead, Tq, Tk):
  params, q, k = _inputs(name, lead, Tq, Tk)
  e = attn.score(name, params, q, k)
  assert e.shape == lead + (Tq, Tk) and e.dtype == jnp.float32
  np.testing.assert_allclose(e, ref.SCORES[name](params, q, k), rtol=TOL[jnp.float32],
                             atol=TOL[jnp.float32])


@pytest.mark.parametrize("name", SCORES)
def test_score_bfloat16_accumulates_in_float32(name):
  params, q, k = _inputs(name, (2,), 5, 6, dtype=jnp.bfloat16)
  e = attn.score(name, params, q, k)
  assert e.dtype == jnp.float32
  # Reference on the same bf16-rounded inputs; the slack covers bf16 rounding of the params.
  expected = ref.SCORES[name](params, q.astype(jnp.float32), k.astype(jnp.float32))
  np.testing.assert_allclose(e, expected, rtol=TOL[jnp.bfloat16], atol=TOL[jnp.bfloat16])


@pytest.mark.parametrize("name", SCORES)
def test_score_gradients(name):
  with jax.enable_x64(True):
    params, q, k = _inputs(name, (2,), 3, 4, dtype=jnp.float64)
    params = jax.tree.map(lambda p: p.astype(jnp.float64), params)
    f = lambda p, q, k: attn.score(name, p, q, k)
    check_grads(f, (params, q, k), order=2, modes=("fwd", "rev"), atol=1e-6, rtol=1e-6)


def test_additive_with_nonzero_bias_matches_numpy_in_value_and_gradient():
  """init_additive sets b = 0: only a random b shows where (and whether) it enters the score."""
  params, q, k = _inputs("additive", (2,), 4, 3)
  params["b"] = jax.random.normal(jax.random.PRNGKey(5), (3,))
  cot = np.random.default_rng(1).normal(size=(2, 4, 3))
  e = attn.score("additive", params, q, k)
  e_ref = ref.additive(params, q, k)
  np.testing.assert_allclose(e, e_ref, rtol=TOL[jnp.float32], atol=TOL[jnp.float32])
  assert np.abs(e_ref - ref.additive(params | {"b": np.zeros(3)}, q, k)).max() > 1e-2
  grads = jax.grad(lambda p, q, k: jnp.sum(attn.score("additive", p, q, k) * cot),
                   argnums=(0, 1, 2))(params, q, k)
  args = [jax.tree.map(np.asarray, params), np.asarray(q), np.asarray(k)]
  loss = lambda p, q, k: np.sum(ref.additive(p, q, k) * cot)
  for name in ("b", "W", "U", "v"):
    expected = ref.numeric_grad(lambda x: loss(args[0] | {name: x}, *args[1:]), args[0][name])
    np.testing.assert_allclose(grads[0][name], expected, rtol=1e-4, atol=1e-5, err_msg=name)
  np.testing.assert_allclose(grads[1], ref.numeric_grad(lambda x: loss(args[0], x, args[2]), args[1]),
                             rtol=1e-4, atol=1e-5, err_msg="q")
  np.testing.assert_allclose(grads[2], ref.numeric_grad(lambda x: loss(args[0], args[1], x), args[2]),
                             rtol=1e-4, atol=1e-5, err_msg="k")


@pytest.mark.parametrize("alias,name", [("concat", "additive"), ("bilinear", "general")])
def test_aliases_compute_the_same_score(alias, name):
  params, q, k = _inputs(name, (), 4, 5)
  np.testing.assert_array_equal(attn.score(alias, params, q, k), attn.score(name, params, q, k))


@pytest.mark.parametrize("name", SCORES)
def test_prepared_keys_give_the_same_attention(name):
  params, q, k = _inputs(name, (2,), 4, 5)
  v = jax.random.normal(jax.random.PRNGKey(9), (2, 5, 3))
  kp = attn.prepare_keys(name, params, k)
  a = attn.attend(params, q, k, v, score=name)
  b = attn.attend(params, q, kp, v, score=name, keys_prepared=True)
  for x, y in zip(a, b):
    np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6)


def test_location_scores_positions_from_the_query_only():
  params, q, k = _inputs("location", (), 4, 5)
  e1 = attn.score("location", params, q, k)
  e2 = attn.score("location", params, q, k + 100.0)
  np.testing.assert_array_equal(e1, e2)


@pytest.mark.parametrize("call,match", [
    (lambda: attn.score("dot", None, jnp.ones((3, 4)), jnp.ones((5, 6))), "dq=4 and dk=6"),
    (lambda: attn.init_score("additive", jax.random.PRNGKey(0), 4, 4), "d_attn"),
    (lambda: attn.init_score("location", jax.random.PRNGKey(0), 4, 4), "max_len"),
    (lambda: attn.score("location", attn.init_score("location", jax.random.PRNGKey(0), 4, 4,
                                                    max_len=3), jnp.ones((2, 4)), jnp.ones((5, 4))),
     "max_len=3, got Tk=5"),
    (lambda: attn.score("cosine", None, jnp.ones((3, 4)), jnp.ones((5, 4))), "Known"),
])
def test_bad_input_errors_name_the_problem(call, match):
  with pytest.raises((ValueError, KeyError), match=match):
    call()
