"""Top-k attention over the kept keys (attn/topk_sparse.py), the `topk` scope's own path, against
the dense form it replaces (scores -> top-k mask -> softmax over every key -> weighted sum), in
float64 NumPy: context and the gradients of q, k, v and the temperature, with masks, causal rows,
rows with fewer valid keys than k or none, and ties at the k-th score (where the call falls back
to the dense form); and what it saves: no [Tq, Tk] weights kept for the backward pass."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attn
from attn import registry, topk_sparse


@pytest.fixture
def topk_dense():
  """The `topk` scope without its own path, registered for one test as `topk_dense`: the
  narrowed mask and then the dense softmax over every key."""
  variant = dataclasses.replace(registry.get("topk", "scope"), name="topk_dense", kept_keys=None)
  registry.VARIANTS["scope"].add("topk_dense", variant)
  yield "topk_dense"
  registry.VARIANTS["scope"].remove("topk_dense")


def np_topk_attention(q, k, v, mask, top_k, scale, tau):
  """float64 NumPy: keep each row's valid keys scoring at least its k-th valid score, softmax of
  e / tau over them (a row with none: zeros), weighted sum of v. q: [N, Tq, d], mask [N, Tq, Tk]."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  e = scale * np.einsum("nqd,nkd->nqk", q, k)
  em = np.where(mask, e, -np.inf)
  kth = -np.sort(-em, axis=-1)[..., min(top_k, e.shape[-1]) - 1:][..., :1]
  keep = mask & (em >= kth)
  s = np.where(keep, e / tau, -np.inf)
  top = np.max(np.where(keep, s, -1e300), axis=-1, keepdims=True)
  ex = np.where(keep, np.exp(s - top), 0.0)
  den = ex.sum(-1, keepdims=True)
  w = ex / np.where(den > 0, den, 1.0)
  return np.einsum("nqk,nkd->nqd", w, v), keep


def _inputs(N, Tq, Tk, d, seed, dtype, ties=False):
  kq, kk, kv, kr = jax.random.split(jax.random.PRNGKey(seed), 4)
  q = jax.random.normal(kq, (N, Tq, d))
  k = jax.random.normal(kk, (N, Tk, d))
  if ties:  # integer q and k: few distinct scores a row, so many tie at the k-th
    q, k = jnp.round(q), jnp.round(k)
  v = jax.random.normal(kv, (N, Tk, d))
  r = jax.random.normal(kr, (N, Tq, d))  # the loss's cotangent
  return q.astype(dtype), k.astype(dtype), v.astype(dtype), r


def _grads_fd(f, args, eps=1e-6):
  """Central differences of the float64 NumPy loss f(*args) w.r.t. every entry of every arg."""
  out = []
  for i, a in enumerate(args):
    a = np.array(a, np.float64)
    g = np.zeros_like(a)
    for idx in np.ndindex(a.shape):
      hi, lo = a.copy(), a.copy()
      hi[idx] += eps
      lo[idx] -= eps
      g[idx] = (f(*args[:i], hi, *args[i + 1:]) - f(*args[:i], lo, *args[i + 1:])) / (2 * eps)
    out.append(g)
  return out


@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 2e-5), (jnp.bfloat16, 3e-2)])
@pytest.mark.parametrize("top_k", [1, 3, 16])
@pytest.mark.parametrize("tau", [1.0, 0.7])
@pytest.mark.parametrize("causal", [False, True])
def test_attend_topk_matches_float64_numpy(dtype, tol, top_k, tau, causal):
  """attend(scope="topk", score="scaled_dot") on continuous scores (no ties: the kept-keys path
  runs), key lengths giving a row fewer valid keys than k and, causal, rows with one."""
  N, Tq, Tk, d = 3, 8, 12, 4
  # k = 1, 3 gather (k (d + dv) <= 2 Tk); k = 16 > Tk keeps the dense form: both must match.
  q, k, v, r = _inputs(N, Tq, Tk, d, seed=top_k, dtype=dtype)
  lengths = jnp.array([Tk, 5, 2])
  mask = np.broadcast_to(np.arange(Tk) < np.asarray(lengths)[:, None, None], (N, Tq, Tk))
  if causal:
    mask = mask & np.tril(np.ones((Tq, Tk), bool))

  def ours(q, k, v, tau):
    return attn.attend(None, q, k, v, score="scaled_dot", scope="topk", top_k=top_k,
                       key_lengths=lengths, causal=causal, temperature=tau)

  ctx, w = jax.jit(ours)(q, k, v, jnp.float32(tau))
  want, keep = np_topk_attention(q, k, v, mask, top_k, d ** -0.5, tau)
  assert ctx.dtype == dtype and ctx.shape == (N, Tq, d)
  np.testing.assert_allclose(np.float64(ctx), want, rtol=tol, atol=tol)
  np.testing.assert_array_equal(np.asarray(w) > 0, keep)  # the weights the caller may read

  # Gradients of sum(ctx * r) w.r.t. q, k, v and tau against central differences in float64.
  loss = lambda q, k, v, tau: jnp.sum(ours(q, k, v, tau)[0].astype(jnp.float32) * r)
  got = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(q, k, v, jnp.float32(tau))
  rn = np.asarray(r, np.float64)
  np_loss = lambda q, k, v, t: np.sum(np_topk_attention(q, k, v, mask, top_k, d ** -0.5,
                                                        float(t))[0] * rn)
  want = _grads_fd(np_loss, [np.float64(q), np.float64(k), np.float64(v), np.float64(tau)])
  for g, g_ref in zip(got, want):
    np.testing.assert_allclose(np.float64(g), g_ref, rtol=tol, atol=tol)


def _kept(q, k, top_k, mask):
  e = attn.score("dot", None, q, k)
  vals, idx = jax.lax.top_k(jnp.where(mask, e, -jnp.inf), top_k)
  keep = mask & (e >= vals[..., -1:])
  return e, vals, idx, keep


@pytest.mark.parametrize("block_scores", [1 << 16, 40])
def test_ties_at_the_kth_fall_back_to_the_dense_form(block_scores, monkeypatch):
  """With ties the k slots alone give another answer than the dense form (which keeps every key
  tied with the k-th); the call notices and answers with the dense form, values and gradients,
  in one block of queries or (block_scores = 40: 2 rows a block) in four, the last padded."""
  monkeypatch.setattr(topk_sparse, "_BLOCK_SCORES", block_scores)
  N, Tq, Tk, d, top_k = 2, 7, 20, 3, 4
  q, k, v, r = _inputs(N, Tq, Tk, d, seed=0, dtype=jnp.float32, ties=True)
  mask = jnp.ones((N, Tq, Tk), bool)
  e, vals, idx, keep = _kept(q, k, top_k, mask)
  assert (keep.sum(-1) > top_k).any()  # the case does tie at the k-th
  tau = jnp.float32(1.0)
  bits = attn.masks.pack_bits(keep)
  dot = registry.get("dot", "score").fn
  slots = topk_sparse._context(dot, 1.0, q, k, v, tau, idx, vals, bits, jnp.bool_(False))
  want, _ = np_topk_attention(q, k, v, np.asarray(mask), top_k, 1.0, 1.0)
  assert np.abs(np.float64(slots) - want).max() > 1e-2  # k slots alone: wrong here

  f = lambda q, k, v: topk_sparse.kept_keys_attention(dot, 1.0, q, k, v,
                                                       attn.score("dot", None, q, k), mask,
                                                       top_k=top_k, temperature=1.0)[0]
  np.testing.assert_allclose(np.float64(jax.jit(f)(q, k, v)), want, rtol=1e-5, atol=1e-5)
  loss = lambda q, k, v: jnp.sum(f(q, k, v) * r)
  dense_loss = lambda q, k, v: jnp.sum(
      attn.attend(None, q, k, v, score="dot", mask=keep)[0] * r)
  got = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
  ref = jax.jit(jax.grad(dense_loss, argnums=(0, 1, 2)))(q, k, v)
  for g, g_ref in zip(got, ref):
    np.testing.assert_allclose(g, g_ref, rtol=1e-5, atol=1e-5)


def test_the_kept_keys_path_alone_matches_without_ties():
  """The k-slot branch itself (dense=False), values and gradients, against float64 NumPy: the
  path that runs whenever no row ties at its k-th."""
  N, Tq, Tk, d, top_k = 2, 5, 16, 4, 3
  q, k, v, r = _inputs(N, Tq, Tk, d, seed=1, dtype=jnp.float32)
  mask = jnp.asarray(np.random.default_rng(0).uniform(size=(N, Tq, Tk)) > 0.3)
  mask = mask.at[:, 0, :].set(False).at[:, 1, :].set(False).at[:, 1, 3].set(True)
  _, vals, idx, keep = _kept(q, k, top_k, mask)
  assert (keep.sum(-1) <= top_k).all()
  dot = registry.get("dot", "score").fn
  bits = attn.masks.pack_bits(keep)

  def slots(q, k, v, tau):
    return topk_sparse._context(dot, 1.0, q, k, v, tau, idx, vals, bits, jnp.bool_(False))

  tau = 0.8
  want, _ = np_topk_attention(q, k, v, np.asarray(mask), top_k, 1.0, tau)
  np.testing.assert_allclose(np.float64(slots(q, k, v, jnp.float32(tau))), want,
                             rtol=1e-5, atol=1e-5)
  # Gradients at the fixed selection: the dense form's autodiff over the same kept keys.
  dense = lambda q, k, v, tau: attn.attend(None, q, k, v, score="dot", mask=keep,
                                           temperature=tau)[0]
  for f_ours, f_ref in [(slots, dense)]:
    loss = lambda f: lambda q, k, v, tau: jnp.sum(f(q, k, v, tau) * r)
    got = jax.grad(loss(f_ours), argnums=(0, 1, 2, 3))(q, k, v, jnp.float32(tau))
    ref = jax.grad(loss(f_ref), argnums=(0, 1, 2, 3))(q, k, v, jnp.float32(tau))
    for g, g_ref in zip(got, ref):
      np.testing.assert_allclose(g, g_ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_multihead_topk_matches_the_dense_form(causal, topk_dense):
  """multihead(scope="topk") (the heads as a batch axis, no vmap) against the same scope's dense
  form run head by head, with key lengths; values and gradients."""
  B, T, D, H, top_k = 2, 40, 16, 4, 3
  assert topk_sparse.gathering_pays(top_k, D // H, D // H, T)  # the kept keys' path runs
  x = jax.random.normal(jax.random.PRNGKey(0), (B, T, D))
  params = attn.init_multihead(jax.random.PRNGKey(1), D, num_heads=H)
  lengths = jnp.array([T, 6])

  def ours(params, x):
    return attn.multihead(params, x, num_heads=H, scope="topk", top_k=top_k, causal=causal,
                          key_lengths=lengths)[0]

  def reference(params, x):
    return attn.multihead(params, x, num_heads=H, scope=topk_dense, top_k=top_k,
                          causal=causal, key_lengths=lengths)[0]

  np.testing.assert_allclose(jax.jit(ours)(params, x), jax.jit(reference)(params, x),
                             rtol=1e-5, atol=1e-5)
  loss = lambda f: lambda p, x: jnp.sum(jnp.sin(f(p, x)))
  got = jax.jit(jax.grad(loss(ours), argnums=(0, 1)))(params, x)
  ref = jax.jit(jax.grad(loss(reference), argnums=(0, 1)))(params, x)
  for g, g_ref in zip(jax.tree.leaves(got), jax.tree.leaves(ref)):
    np.testing.assert_allclose(g, g_ref, rtol=1e-4, atol=1e-5)


def test_gathering_pays_where_the_gathered_rows_are_fewer_than_twice_the_scores():
  assert topk_sparse.gathering_pays(32, 16, 16, 1024) and topk_sparse.gathering_pays(32, 16, 16, 512)
  assert not topk_sparse.gathering_pays(32, 16, 16, 256)  # variant_costs at T = 256
  assert not topk_sparse.gathering_pays(32, 64, 64, 1024)
  assert topk_sparse.gathering_pays(32, 64, 64, 2048)


def test_the_backward_pass_keeps_no_dense_weights():
  """What the path saves: the compiled gradient of a top-k (k = 8) self-attention at T = 1024
  needs little more than half the temporary memory of global attention's, which keeps the
  [T, T] weights of every head for the backward pass (compiles only; nothing runs)."""
  B, T, D, H = 1, 1024, 64, 4
  x = jax.ShapeDtypeStruct((B, T, D), jnp.float32)
  params = attn.init_multihead(jax.random.PRNGKey(0), D, num_heads=H)

  def temp_bytes(scope):
    f = jax.grad(lambda p, x: jnp.sum(attn.multihead(p, x, num_heads=H, scope=scope,
                                                     top_k=8)[0] ** 2))
    return jax.jit(f).lower(params, x).compile().memory_analysis().temp_size_in_bytes

  topk, full = temp_bytes("topk"), temp_bytes("global")
  assert topk < 0.6 * full, (topk, full)  # 0.52 on jax 0.10.2
