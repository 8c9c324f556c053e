"""Normalizers against float64 NumPy (bisection for sparsemax/entmax), known answers, masks, limits."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import attn
import np_reference as ref

NORMALIZERS = attn.canonical_names("normalizer")


def _scores_and_mask(shape, seed=0, scale=2.0):
  ke, km = jax.random.split(jax.random.PRNGKey(seed))
  e = scale * jax.random.normal(ke, shape)
  mask = jax.random.bernoulli(km, 0.7, shape)
  if len(shape) > 1:
    mask = mask.at[..., 0, :].set(False)  # one fully masked row per matrix
  return e, mask


@pytest.mark.parametrize("kind", NORMALIZERS)
@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 4, 9), (2, 1, 3, 6)])
def test_matches_numpy(kind, shape):
  e, mask = _scores_and_mask(shape)
  w = attn.normalize(e, mask, kind=kind)
  np.testing.assert_allclose(w, ref.NORMALIZERS[kind](e, mask), rtol=1e-5, atol=1e-6)


def test_sparsemax_known_answer():
  w = attn.normalize(jnp.array([1.0, 0.5, -1.0]), kind="sparsemax")
  np.testing.assert_allclose(w, [0.75, 0.25, 0.0], atol=1e-7)


@pytest.mark.parametrize("z,expected", [
    ([0.0, 0.0, 0.0], [1 / 3, 1 / 3, 1 / 3]),
    # tau solves (1/2 - tau)^2 + tau^2 = 1: tau = (1 - sqrt 7)/4, p = ((4 +- sqrt 7)/8, 0).
    ([1.0, 0.0, -1.0], [(4 + np.sqrt(7)) / 8, (4 - np.sqrt(7)) / 8, 0.0]),
    ([5.0, 0.0, 1.0, -3.0], [1.0, 0.0, 0.0, 0.0]),
])
def test_entmax15_known_answers(z, expected):
  np.testing.assert_allclose(attn.normalize(jnp.array(z), kind="entmax15"), expected, atol=1e-6)


@pytest.mark.parametrize("kind", NORMALIZERS)
def test_rows_sum_to_one_and_masked_entries_are_exactly_zero(kind):
  e, mask = _scores_and_mask((4, 6, 8), seed=1)
  w = np.asarray(attn.normalize(e, mask, kind=kind))
  valid_rows = np.asarray(mask).any(-1)
  np.testing.assert_allclose(w.sum(-1)[valid_rows], 1.0, atol=1e-6)
  assert (w[~np.asarray(mask)] == 0.0).all()
  assert (w >= 0).all()


def test_sparse_normalizers_produce_exact_zeros_and_softmax_does_not():
  e = 3.0 * jax.random.normal(jax.random.PRNGKey(2), (8, 16))
  zeros = {k: int((attn.normalize(e, kind=k) == 0).sum()) for k in NORMALIZERS}
  assert zeros["softmax"] == 0
  assert zeros["sparsemax"] > 8 * 8 and zeros["entmax15"] > 8 * 4
  assert zeros["sparsemax"] >= zeros["entmax15"]  # sparsemax (alpha=2) is the sparser


@pytest.mark.parametrize("kind", NORMALIZERS)
def test_fully_masked_rows_give_zeros_and_zero_finite_gradients_under_jit(kind):
  e, mask = _scores_and_mask((3, 5, 7), seed=3)
  mask = mask.at[1].set(False)  # a whole matrix masked too
  cot = jax.random.normal(jax.random.PRNGKey(4), e.shape)
  f = jax.jit(lambda e: jnp.sum(attn.normalize(e, mask, kind=kind) * cot))
  w = jax.jit(lambda e: attn.normalize(e, mask, kind=kind))(e)
  g = jax.grad(f)(e)
  assert np.isfinite(w).all() and np.isfinite(g).all()
  dead = ~np.asarray(mask).any(-1)
  assert dead.sum() >= 5 + 2
  assert (np.asarray(w)[dead] == 0).all() and (np.asarray(g)[dead] == 0).all()
  assert (np.asarray(g)[~np.asarray(mask)] == 0).all()


@pytest.mark.parametrize("kind", NORMALIZERS)
def test_gradients_match_finite_differences(kind):
  with jax.enable_x64(True):
    e, mask = _scores_and_mask((2, 3, 6), seed=5)
    e = e.astype(jnp.float64)
    check_grads(lambda e: attn.normalize(e, mask, kind=kind), (e,), order=1,
                modes=("fwd", "rev"), atol=1e-5, rtol=1e-5, eps=1e-6)


@pytest.mark.parametrize("kind", NORMALIZERS)
def test_low_temperature_approaches_argmax(kind):
  e, mask = _scores_and_mask((6, 9), seed=6)
  w = attn.normalize(e, mask, kind=kind, temperature=1e-3)
  em = np.where(mask, e, -np.inf)
  valid = np.asarray(mask).any(-1)
  hard = np.eye(9)[em.argmax(-1)]
  np.testing.assert_allclose(np.asarray(w)[valid], hard[valid], atol=1e-3)


@pytest.mark.parametrize("kind", NORMALIZERS)
def test_high_temperature_approaches_uniform_over_valid_keys(kind):
  e, mask = _scores_and_mask((6, 9), seed=7)
  w = np.asarray(attn.normalize(e, mask, kind=kind, temperature=1e4))
  m = np.asarray(mask)
  n = m.sum(-1, keepdims=True)
  uniform = np.where(m, 1.0 / np.maximum(n, 1), 0.0)
  np.testing.assert_allclose(w, uniform, atol=1e-3)


@pytest.mark.parametrize("kind", NORMALIZERS)
def test_temperature_divides_scores(kind):
  e, mask = _scores_and_mask((4, 7), seed=8)
  np.testing.assert_allclose(attn.normalize(e, mask, kind=kind, temperature=2.5),
                             attn.normalize(e / 2.5, mask, kind=kind), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kind", NORMALIZERS)
def test_bfloat16_scores_normalize_in_float32(kind):
  e, mask = _scores_and_mask((4, 7), seed=9)
  e = e.astype(jnp.bfloat16)
  w = attn.normalize(e, mask, kind=kind)
  assert w.dtype == jnp.float32
  np.testing.assert_allclose(w, ref.NORMALIZERS[kind](e.astype(jnp.float32), mask), atol=1e-6)


@pytest.mark.parametrize("kind", NORMALIZERS)
def test_vmap_and_eager_agree_with_batched_jit(kind):
  e, mask = _scores_and_mask((3, 4, 6), seed=10)
  batched = attn.normalize(e, mask, kind=kind)
  mapped = jax.vmap(lambda e, m: attn.normalize(e, m, kind=kind))(e, mask)
  with jax.disable_jit():
    eager = attn.normalize(e, mask, kind=kind)
  np.testing.assert_allclose(mapped, batched, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(eager, batched, rtol=1e-6, atol=1e-7)


def test_bad_mask_errors():
  with pytest.raises(ValueError, match="boolean"):
    attn.normalize(jnp.ones((2, 3)), jnp.ones((2, 3)))
  with pytest.raises(ValueError, match="does not broadcast"):
    attn.normalize(jnp.ones((2, 3)), jnp.ones((2, 4), bool))
  with pytest.raises(KeyError, match="softmax"):
    attn.normalize(jnp.ones((2, 3)), kind="softermax")


@pytest.mark.parametrize("kind", NORMALIZERS)
def test_float64_scores_are_float64_accurate(kind):
  with jax.enable_x64(True):
    e, mask = _scores_and_mask((3, 4, 7), seed=11)
    e = e.astype(jnp.float64)
    w = attn.normalize(e, mask, kind=kind, temperature=0.3)
    assert w.dtype == jnp.float64
    np.testing.assert_allclose(w, ref.NORMALIZERS[kind](e / 0.3, mask), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("kind", NORMALIZERS)
def test_float64_tiny_temperature_with_masked_keys_gives_the_argmax(kind):
  """float64 scores divided by a tiny temperature fall below float32's most negative value: the
  filler for masked keys must be float64's, else it wins the row max and the row comes out zero."""
  with jax.enable_x64(True):
    e = jnp.array([[-1.0, -2.0, -0.5, -3.0], [-2.0, 7.0, -1.0, -4.0]], jnp.float64)
    mask = jnp.array([[True, True, False, True], [True, False, True, True]])
    w = attn.normalize(e, mask, kind=kind, temperature=1e-40)
    np.testing.assert_array_equal(w, [[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]])
