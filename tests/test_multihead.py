"""multihead(): against a per-head float64 NumPy loop; self/cross attention, masks, heads, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attn
import np_reference as ref


@pytest.mark.parametrize("score", ["scaled_dot", "general", "additive"])
@pytest.mark.parametrize("causal", [False, True])
def test_self_attention_matches_per_head_loop(score, causal):
  x = jax.random.normal(jax.random.PRNGKey(0), (3, 5, 12))
  params = attn.init_multihead(jax.random.PRNGKey(1), 12, 3, score=score, d_attn=4)
  lengths = [1, 4, 2]  # strictly inside (0, T): padding off-by-ones show
  mask = attn.masks.padding_mask(jnp.array(lengths), 5)
  out, w = attn.multihead(params, x, num_heads=3, score=score, mask=mask, causal=causal)
  out_ref, w_ref = ref.multihead(params, x, x, 3, score, key_lengths=lengths, causal=causal)
  assert out.shape == (3, 5, 12) and w.shape == (3, 3, 5, 5)
  np.testing.assert_allclose(w, w_ref, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(out, out_ref, rtol=1e-4, atol=1e-5)


def test_cross_attention_with_different_sizes():
  x_q = jax.random.normal(jax.random.PRNGKey(0), (3, 4, 8))
  x_kv = jax.random.normal(jax.random.PRNGKey(1), (3, 7, 10))
  params = attn.init_multihead(jax.random.PRNGKey(2), 8, 2, d_kv=10, d_head=5, d_out=6)
  lengths = [6, 0, 3]
  out, w = attn.multihead(params, x_q, x_kv, num_heads=2, key_lengths=jnp.array(lengths))
  out_ref, w_ref = ref.multihead(params, x_q, x_kv, 2, key_lengths=lengths)
  assert out.shape == (3, 4, 6) and w.shape == (3, 2, 4, 7)
  np.testing.assert_allclose(out, out_ref, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(w, w_ref, rtol=1e-5, atol=1e-6)
  assert (np.asarray(out[1]) == 0).all()


@pytest.mark.parametrize("score,causal", [("scaled_dot", False), ("additive", True)])
def test_float64_inputs_are_float64_accurate(score, causal):
  """float64 in, float64-accurate out: projections and the output projection accumulate in
  float64 (not float32 relabelled as float64). Cross-attention, Tq != Tk, padded keys."""
  with jax.enable_x64(True):
    x_q = jax.random.normal(jax.random.PRNGKey(0), (3, 5, 12), jnp.float64)
    x_kv = jax.random.normal(jax.random.PRNGKey(1), (3, 6, 10), jnp.float64)
    params = attn.init_multihead(jax.random.PRNGKey(2), 12, 3, d_kv=10, score=score, d_attn=4)
    lengths = [1, 5, 3]
    out, w = attn.multihead(params, x_q, x_kv, num_heads=3, score=score, causal=causal,
                            key_lengths=jnp.array(lengths))
    out_ref, w_ref = ref.multihead(params, x_q, x_kv, 3, score, key_lengths=lengths, causal=causal)
    assert out.dtype == w.dtype == jnp.float64
    np.testing.assert_allclose(w, w_ref, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(out, out_ref, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("scope,opts", [("local_p", {"half_width": 2}), ("linear", {}),
                                        ("topk", {"top_k": 2})])
def test_scopes_run_per_head_with_finite_gradients(scope, opts):
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 6, 8))
  params = attn.init_multihead(jax.random.PRNGKey(1), 8, 2, scope=scope, d_attn=4)
  if scope == "local_p":
    assert params["scope"]["W_p"].shape == (2, 4, 4)  # one position predictor per head
  loss = lambda p: jnp.sum(attn.multihead(p, x, num_heads=2, scope=scope, **opts)[0] ** 2)
  grads = jax.grad(loss)(params)
  assert all(np.isfinite(g).all() for g in jax.tree.leaves(grads))


@pytest.mark.parametrize("score", ["scaled_dot", "additive"])
def test_fused_self_attention_equals_unfused(score):
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 9, 16))
  params = attn.init_multihead(jax.random.PRNGKey(1), 16, 2, score=score, d_attn=8)
  lengths = jnp.array([9, 4])
  kw = dict(num_heads=2, score=score, key_lengths=lengths, causal=True)
  a, w = attn.multihead(params, x, **kw)
  b, w_fused = attn.multihead(params, x, fused=True, **kw)
  assert w.shape == (2, 2, 9, 9) and w_fused is None
  np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
  g = lambda fused: jax.grad(lambda p: jnp.sum(attn.multihead(p, x, fused=fused, **kw)[0] ** 2))(params)
  for ga, gb in zip(jax.tree.leaves(g(False)), jax.tree.leaves(g(True))):
    np.testing.assert_allclose(gb, ga, rtol=1e-4, atol=1e-5)


def test_errors_name_the_problem():
  params = attn.init_multihead(jax.random.PRNGKey(0), 8, 2)
  with pytest.raises(ValueError, match="built for 2 heads"):
    attn.multihead(params, jnp.ones((3, 8)), num_heads=4)
  with pytest.raises(ValueError, match="x_q has feature size 6"):
    attn.multihead(params, jnp.ones((3, 6)), num_heads=2)
  with pytest.raises(ValueError, match="not divisible"):
    attn.init_multihead(jax.random.PRNGKey(0), 10, 3)
