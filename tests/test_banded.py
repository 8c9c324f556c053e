"""Banded window attention (attn.banded) against core.attend's masked window, in value and
gradient; its refusals; its memory against the masked path; the Transformer's routing."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import attn
from attn import banded, core
from attn.models import ModelConfig, transformer_attention
from attn.models.config import AttentionRole, TransformerConfig

SCORES = [s for s in attn.canonical_names("score") if banded.banded_unsupported(s) is None]
NORMALIZERS = attn.canonical_names("normalizer")
D, DV, D_ATTN = 6, 3, 4  # different sizes, so an axis mix-up fails


def _inputs(score, lead, T, seed=0):
  """Score parameters, q, k, v and a cotangent r, drawn with NumPy (jax.random would compile
  for every new shape, most of these tests' time)."""
  rng = np.random.default_rng(seed)
  draw = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)
  shapes = jax.eval_shape(lambda: attn.init_score(score, jax.random.PRNGKey(0), D, D,
                                                  d_attn=D_ATTN, max_len=T))
  params = jax.tree.map(lambda p: draw(*p.shape) / np.sqrt(D), shapes)
  return (params, draw(*lead, T, D), draw(*lead, T, D), draw(*lead, T, DV), draw(*lead, T, DV))


def _masked(params, q, kp, v, *, half_width, **kw):
  """core.attend's masked window; its window scope needs half_width >= 1, so 0 is the same
  sliding-window mask passed explicitly."""
  if half_width == 0:
    T = q.shape[-2]
    return core.attend(params, q, kp, v, mask=attn.masks.sliding_window_mask(T, T, 0),
                       keys_prepared=True, **kw)[0]
  return core.attend(params, q, kp, v, scope="window", half_width=half_width,
                     keys_prepared=True, **kw)[0]


def _value_and_grads(attend, score, params, q, k, v, r, **kw):
  """The context and the gradients of <context, r> w.r.t. the score's parameters, q, k (through
  the score's key-side `prepare`) and v."""

  def loss(params, q, k, v, kw):
    ctx = attend(params, q, core.prepare_keys(score, params, k), v, score=score, **static, **kw)
    return jnp.sum(ctx * r), ctx

  # One compilation of the forward and backward pass; arrays and floats as arguments.
  static = {n: kw.pop(n) for n in ("half_width", "causal", "normalizer", "block") if n in kw}
  grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True))
  (_, ctx), grads = grad(params, q, k, v, kw)
  return ctx, grads


# Every banded score and every normalizer; each case another window (0 included), length,
# block (1, none dividing T, longer than T), causality, temperature and padding: not the full
# product, each case costs two compilations. Sequences with no key, and queries farther than the
# window past their sequence's last key, have no valid key.
CASES = [
    ("dot", "softmax", dict(T=13, half_width=1, causal=False, temperature=1.0,
                            key_lengths=(13, 6, 0), block=4)),
    ("scaled_dot", "softmax", dict(T=10, half_width=3, causal=True, temperature=0.6,
                                   key_lengths=None, block=None)),
    ("general", "sparsemax", dict(T=7, half_width=2, causal=False, temperature=1.7,
                                  key_lengths=(7, 1, 4), block=3)),
    ("additive", "entmax15", dict(T=13, half_width=5, causal=True, temperature=1.0,
                                  key_lengths=(9, 13, 2), block=None)),
    ("additive", "softmax", dict(T=7, half_width=0, causal=False, temperature=0.6,
                                 key_lengths=(7, 3, 5), block=None)),
    ("dot", "sparsemax", dict(T=10, half_width=2, causal=True, temperature=1.0,
                              key_lengths=(10, 4, 0), block=1)),
    ("general", "entmax15", dict(T=10, half_width=3, causal=False, temperature=0.8,
                                 key_lengths=(10, 7, 1), block=16)),
    ("scaled_dot", "entmax15", dict(T=9, half_width=0, causal=True, temperature=1.0,
                                    key_lengths=(9, 0, 5), block=2)),
]


def test_the_cases_cover_every_banded_score_and_normalizer():
  assert {"dot", "scaled_dot", "general", "additive"} <= set(SCORES)
  assert {s for s, _, _ in CASES} == set(SCORES)
  assert {n for _, n, _ in CASES} == set(NORMALIZERS)


@pytest.mark.parametrize("score,normalizer,setting", CASES,
                         ids=[f"{s}-{n}-w{c['half_width']}" for s, n, c in CASES])
def test_equals_the_masked_window_in_value_and_gradient(score, normalizer, setting):
  kw = dict(setting)
  T, lengths, block = kw.pop("T"), kw.pop("key_lengths"), kw.pop("block")
  kw.update(normalizer=normalizer, key_lengths=None if lengths is None else jnp.array(lengths))
  params, q, k, v, r = _inputs(score, (3,), T)
  ctx, grads = _value_and_grads(banded.banded_attend, score, params, q, k, v, r, block=block,
                                **kw)
  ctx_m, grads_m = _value_and_grads(_masked, score, params, q, k, v, r, **kw)
  np.testing.assert_allclose(ctx, ctx_m, rtol=1e-5, atol=1e-6)
  for g, gm in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_m)):
    np.testing.assert_allclose(g, gm, rtol=1e-4, atol=1e-5)
  if lengths is not None:  # a query with no valid key: zero context, zero gradient
    first_key = np.arange(T) - kw["half_width"]  # [T]
    keyless = first_key[None, :] >= np.array(lengths)[:, None]  # [3, T]
    assert keyless.any()
    assert (np.asarray(ctx)[keyless] == 0).all() and (np.asarray(grads[1])[keyless] == 0).all()


@pytest.mark.parametrize("causal", [False, True])
def test_a_window_wider_than_the_sequence_is_global_attention(causal):
  params, q, k, v, _ = _inputs("scaled_dot", (2,), 11)
  lengths = jnp.array([11, 5])
  ref, _ = core.attend(params, q, k, v, score="scaled_dot", causal=causal, key_lengths=lengths)
  for half_width in (10, 40):  # T - 1 reaches every key already
    ctx = banded.banded_attend(params, q, k, v, score="scaled_dot", half_width=half_width,
                               causal=causal, key_lengths=lengths)
    np.testing.assert_allclose(ctx, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("score", attn.canonical_names("score"))
def test_the_registry_flags_exactly_the_scores_that_read_key_positions(score):
  """A score is `positional` iff dropping the first query and key changes the others' scores
  (what the band's re-indexed keys would do to it)."""
  kq, kk, kp = jax.random.split(jax.random.PRNGKey(0), 3)
  params = core.init_score(score, kp, 4, 4, d_attn=4, max_len=8)
  q, k = jax.random.normal(kq, (3, 4)), jax.random.normal(kk, (4, 4))
  e = core.score(score, params, q, k)  # [3, 4]
  e_tail = core.score(score, params, q[1:], k[1:])  # [2, 3]
  moved = not np.allclose(e[1:, 1:], e_tail, rtol=1e-5, atol=1e-6)
  assert attn.registry.get(score, "score").positional == moved


def test_refusals_name_the_reason():
  params, q, k, v, _ = _inputs("location", (), 6)
  assert "position" in banded.banded_unsupported("location")
  with pytest.raises(ValueError, match="location.*position"):
    banded.banded_attend(params, q, k, v, score="location", half_width=1)
  with pytest.raises(ValueError, match="self-attention"):
    banded.banded_attend(None, q, k[:4], v[:4], half_width=1)
  with pytest.raises(ValueError, match="half_width"):
    banded.banded_attend(None, q, k, v, half_width=-1)
  with pytest.raises(ValueError, match="block"):
    banded.banded_attend(None, q, k, v, half_width=1, block=0)
  with pytest.raises(KeyError, match="unknown normalizer"):
    banded.banded_unsupported("dot", "softmaxx")


def test_memory_is_far_below_the_masked_window():
  """XLA's temporaries at T=1024, half_width=16, head size 64, forward and backward: the masked
  path holds [T, T] scores and weights, the band [T, b + 2w] and the gathered key/value bands."""
  T, w = 1024, 16
  x = jax.ShapeDtypeStruct((1, T, 64), jnp.float32)
  lengths = jax.ShapeDtypeStruct((1,), jnp.int32)
  variants = {
      "banded": lambda q, k, v, n: banded.banded_attend(None, q, k, v, score="scaled_dot",
                                                        half_width=w, key_lengths=n),
      "masked": lambda q, k, v, n: _masked(None, q, k, v, score="scaled_dot", half_width=w,
                                           key_lengths=n),
  }

  def temp_bytes(f):
    return jax.jit(f).lower(x, x, x, lengths).compile().memory_analysis().temp_size_in_bytes

  for name, f in list(variants.items()):
    variants[name + "_grad"] = jax.grad(lambda q, k, v, n, f=f: jnp.sum(f(q, k, v, n) ** 2),
                                        argnums=(0, 1, 2))
  mem = {name: temp_bytes(f) for name, f in variants.items()}
  assert 0 < mem["banded"] < mem["masked"] / 4, mem
  assert 0 < mem["banded_grad"] < mem["masked_grad"] / 4, mem


def test_the_transformer_routes_window_self_attention_through_the_band(monkeypatch):
  """The Transformer's encoder and (causal) decoder self-attention with scope=window run banded
  and give the masked path's output and gradients; a window cross-attention (whose weights are
  read) stays masked, also when the source and target lengths agree."""
  window = lambda **kw: AttentionRole(scope="window", **kw)
  cfg = ModelConfig(src_vocab=13, tgt_vocab=11, arch="transformer", enc_layers=1, dec_layers=1,
                    dropout=0.0, max_src_len=9, transformer=TransformerConfig(
                        d_model=8, num_heads=2, d_ff=12, max_tgt_len=9,
                        enc_self=window(half_width=2),
                        dec_self=window(half_width=1, normalizer="sparsemax"),
                        cross=window(half_width=3)))
  rng = np.random.default_rng(0)
  x, r = (jnp.asarray(rng.normal(size=(2, 7, 8)), jnp.float32) for _ in range(2))
  positions, lengths = jnp.arange(7)[None], jnp.array([7, 4])
  roles = {"enc_self": False, "dec_self": True, "cross": False}  # field: causal
  attention = lambda f: transformer_attention.Attention(cfg, f, rngs=nnx.Rngs(0),
                                                        compute_dtype="float32")
  layers = {f: nnx.split(attention(f), nnx.Param, ...) for f in roles}

  def loss(field, params):
    """<out, r> and (out, weights) of the role's attention of x over itself, called as its
    layer calls it (the cross-attention's keys carry no positions)."""
    graphdef, _, rest = layers[field]
    a = nnx.merge(graphdef, params, rest)
    k_pos = None if field == "cross" else positions
    out, w = a(a.queries(x, positions), *a.keys_values(x, k_pos), q_pos=positions, k_pos=k_pos,
               key_lengths=None if roles[field] else lengths, causal=roles[field])
    return jnp.sum(out * r), (out, w)

  def run(field):
    grad = jax.jit(jax.value_and_grad(lambda p: loss(field, p), has_aux=True))
    (_, (out, w)), grads = grad(layers[field][1])
    return out, w, jax.tree.leaves(grads)

  calls, attend = [], banded.banded_attend

  def counted(*args, **kw):
    calls.append(kw)
    return attend(*args, **kw)

  monkeypatch.setattr(banded, "banded_attend", counted)
  _, (_, w) = jax.eval_shape(lambda p: loss("cross", p), layers["cross"][1])
  assert w.weights.shape == (2, 2, 7, 7) and not calls  # weights formed: the masked path
  outs = {field: run(field) for field in ("enc_self", "dec_self")}
  assert [kw["causal"] for kw in calls] == [False, True]
  assert outs["enc_self"][1] is None and outs["dec_self"][1] is None
  monkeypatch.setattr(banded, "banded_unsupported", lambda *a: "off")  # the masked path
  for field, (out, _, grads) in outs.items():
    out_m, w_m, grads_m = run(field)
    assert w_m is not None and len(calls) == 2
    np.testing.assert_allclose(out, out_m, rtol=1e-5, atol=1e-5)
    for g, gm in zip(grads, grads_m):
      np.testing.assert_allclose(g, gm, rtol=1e-4, atol=1e-5)
