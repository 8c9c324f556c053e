"""attn.models.recurrence: the scan whose weight gradients are formed after the loop, against
jax.lax.scan of the same step differentiated by JAX (the reference), and the decoders' teacher
forcing through it against their plain scan of `recur`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attn import precision
from attn.models import build_model, recurrence
from model_configs import model_config, random_batch

T, B, D, H = 6, 3, 4, 5
LENGTHS = jnp.array([6, 2, 4])


def _gru_body(products, operands, h, inputs):
  """A GRU step whose input mixes the scanned input and the state (as the decoder's does), with
  its sequences ending at `lengths`."""
  x, t = inputs
  xi = products("input", jnp.concatenate([x, jnp.tanh(h)], -1)) + operands["bias"]
  xr, xz, xn = jnp.split(xi, 3, -1)
  hr, hz, hn = jnp.split(products("recurrent", h), 3, -1)
  r, z = jax.nn.sigmoid(xr + hr), jax.nn.sigmoid(xz + hz)
  new = (1 - z) * jnp.tanh(xn + r * hn) + z * h
  new = jnp.where((t < operands["lengths"])[:, None], new, h)
  return new, new * operands["scale"]


def _lstm_body(products, operands, carry, inputs):
  c, h = carry
  x, _ = inputs
  y = products("input", x) + products("recurrent", h) + operands["bias"]
  i, f, g, o = jnp.split(y, 4, -1)
  c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
  h = jax.nn.sigmoid(o) * jnp.tanh(c)
  return (c, h), h * operands["scale"]


def _problem(kind):
  k = jax.random.split(jax.random.PRNGKey(7), 6)
  gates, d_in = (3, D + H) if kind == "gru" else (4, D)
  weights = {"input": 0.5 * jax.random.normal(k[0], (d_in, gates * H)),
             "recurrent": 0.5 * jax.random.normal(k[1], (H, gates * H))}
  operands = {"bias": jax.random.normal(k[2], (gates * H,)), "lengths": LENGTHS,
              "scale": jax.random.normal(k[3], (H,))}
  h0 = jax.random.normal(k[4], (B, H))
  carry = h0 if kind == "gru" else (0.5 * h0, h0)
  xs = jax.random.normal(k[5], (T, B, D))
  return (_gru_body if kind == "gru" else _lstm_body), weights, operands, carry, xs


def _plain_scan(body, weights, operands, carry, xs, *, dtype, reverse):
  """The reference: jax.lax.scan, every product through attn.precision.matmul, differentiated
  by JAX (per-step weight gradients summed by the loop's transpose)."""
  products = lambda name, x: precision.matmul(x, weights[name], dtype)
  return jax.lax.scan(lambda c, x: body(products, operands, c, x), carry, xs, reverse=reverse)


def _loss_and_grads(scan, body, weights, operands, carry, xs, *, dtype, reverse):
  g_ys = jax.random.normal(jax.random.PRNGKey(3), (T, B, H))

  def loss(weights, operands, carry, xs):
    final, ys = scan(body, weights, operands, carry, (xs, jnp.arange(T)), dtype=dtype,
                     reverse=reverse)
    return jnp.sum(ys * g_ys) + sum(jnp.sum(jnp.sin(c)) for c in jax.tree.leaves(final))

  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3), allow_int=True))(
      weights, operands, carry, xs)


@pytest.mark.parametrize("dtype,rtol", [(jnp.float32, 2e-5), (jnp.bfloat16, 2e-2)])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_values_and_gradients_equal_the_plain_scan(kind, reverse, dtype, rtol):
  body, weights, operands, carry, xs = _problem(kind)
  got = _loss_and_grads(recurrence.scan, body, weights, operands, carry, xs, dtype=dtype,
                        reverse=reverse)
  want = _loss_and_grads(_plain_scan, body, weights, operands, carry, xs, dtype=dtype,
                         reverse=reverse)
  leaves = lambda t: [a for a in jax.tree.leaves(t) if a.dtype != jax.dtypes.float0]
  assert len(leaves(got)) == len(leaves(want)) == 1 + 2 + 2 + len(jax.tree.leaves(carry)) + 1
  for g, w in zip(leaves(got), leaves(want)):
    scale = float(jnp.max(jnp.abs(w)))
    np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * scale)


@pytest.mark.parametrize("scan,deferred", [(recurrence.scan, True), (_plain_scan, False)])
def test_each_weight_gradient_is_one_product_over_every_step(scan, deferred):
  """Each weight's gradient is one [K, T*B] x [T*B, N] product over all time steps' rows (JAX's
  own scan forms T products of B rows inside its backward loop instead)."""
  body, weights, operands, carry, xs = _problem("gru")
  fn = lambda w: scan(body, w, operands, carry, (xs, jnp.arange(T)), dtype=jnp.float32,
                      reverse=False)[1].sum()
  text = jax.jit(jax.grad(fn)).lower(weights).as_text()
  whole = [f"(tensor<{K}x{T * B}xf32>, tensor<{T * B}x{3 * H}xf32>) -> tensor<{K}x{3 * H}xf32>"
           for K in (D + H, H)]
  found = [any(w in line for line in text.splitlines() if "dot_general" in line) for w in whole]
  assert found == [deferred, deferred]


def test_a_weight_used_twice_or_not_at_all_is_refused():
  body, weights, operands, carry, xs = _problem("gru")
  with pytest.raises(ValueError, match="used twice"):
    recurrence.scan(lambda p, o, c, x: (p("recurrent", c), p("recurrent", c)), weights,
                    operands, carry, (xs, jnp.arange(T)))
  with pytest.raises(ValueError, match=r"did not use weights \['input'\]"):
    recurrence.scan(lambda p, o, c, x: (p("recurrent", c)[:, :H], c), weights, operands,
                    carry, (xs, jnp.arange(T)))


def _plain_teacher_force(decoder, memory, tgt_in, key):
  """Teacher forcing as a plain scan of `recur` (the decoders' own loop before the deferred
  weight gradients), the reference."""
  state = decoder.initial_state_from_memory(memory)
  k_rec, k_out = jax.random.split(key)

  def body(state, inputs):
    y_prev, t = inputs
    state, feats, att = decoder.recur(memory, state, y_prev, t, jax.random.fold_in(k_rec, t))
    return state, feats

  _, feats = jax.lax.scan(body, state, (tgt_in.T, jnp.arange(tgt_in.shape[1])))
  return decoder.project(jnp.swapaxes(feats, 0, 1), k_out)


@pytest.mark.parametrize("decoder,cell,layers", [("bahdanau", "gru", 1), ("luong", "lstm", 2),
                                                 ("none", "gru", 2)])
@pytest.mark.parametrize("compute_dtype,rtol", [("float32", 1e-4), ("bfloat16", 3e-2)])
def test_teacher_forcing_equals_the_plain_scan_of_recur(decoder, cell, layers, compute_dtype,
                                                        rtol):
  cfg = model_config(src_vocab=13, tgt_vocab=11, emb_dim=6, enc_hidden=5, dec_hidden=7,
                     d_attn=8, decoder=decoder, cell=cell, dec_layers=layers, dropout=0.3)
  model = build_model(cfg, seed=2, compute_dtype=compute_dtype)
  batch = random_batch([5, 2, 4], [4, 4, 1], 5, 4, cfg.src_vocab, cfg.tgt_vocab, seed=1)
  key = jax.random.PRNGKey(5)
  weights = jax.random.normal(jax.random.PRNGKey(6), (3, 4, cfg.tgt_vocab))

  def loss(model, force):
    memory = model.memory(batch["src"], batch["src_lengths"])
    tgt_in = jnp.concatenate([jnp.ones_like(batch["tgt"][:, :1]), batch["tgt"][:, :-1]], 1)
    return jnp.sum(force(model.decoder, memory, tgt_in) * weights)

  ours = lambda dec, memory, tgt_in: dec.teacher_force(memory, tgt_in, key)[0]
  theirs = lambda dec, memory, tgt_in: _plain_teacher_force(dec, memory, tgt_in, key)
  (v, g), (v_ref, g_ref) = (nnx.jit(nnx.value_and_grad(lambda m: loss(m, f)))(model)
                            for f in (ours, theirs))
  np.testing.assert_allclose(v, v_ref, rtol=rtol)
  got, want = (jax.tree.leaves(nnx.state(x, nnx.Param)) for x in (g, g_ref))
  assert len(got) == len(want) > 10
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * float(jnp.max(jnp.abs(b))) + 1e-7)
