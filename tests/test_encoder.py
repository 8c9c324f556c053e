"""attn.models.encoder: our scan of each recurrent layer against flax's own nnx.RNN and
nnx.Bidirectional on the same modules (the reference), and its input projections outside it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attn.models import build_model
from model_configs import model_config

B, T, E = 4, 7, 6
LENGTHS = [7, 3, 5, 1]


def _encoder(cell, bidirectional, compute_dtype="float32"):
  cfg = model_config(src_vocab=11, tgt_vocab=11, emb_dim=E, enc_hidden=5, dec_hidden=8,
                     d_attn=8, decoder="bahdanau", enc_layers=2, cell=cell,
                     bidirectional=bidirectional)
  return build_model(cfg, seed=3, compute_dtype=compute_dtype).encoder


def _valid(a):
  """a [B, T, ...] with the positions past each length zeroed (what the encoder keeps)."""
  return jnp.where((jnp.arange(T)[None] < jnp.asarray(LENGTHS)[:, None])[..., None], a, 0.0)


@pytest.mark.parametrize("compute_dtype,tol", [("float32", 1e-6), ("bfloat16", 1e-5)])
@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_run_layer_equals_flax_rnn_in_value_and_gradient(cell, bidirectional, compute_dtype, tol):
  enc = _encoder(cell, bidirectional, compute_dtype)
  layer = enc.layers[0]
  x = jax.random.normal(jax.random.PRNGKey(0), (B, T, E))
  lengths = jnp.asarray(LENGTHS)

  def summary(layer, run):
    carry, out = run(layer)
    return _valid(out), carry

  ours = lambda layer: enc.run_layer(layer, x, lengths)
  flax_rnn = lambda layer: layer(x, seq_lengths=lengths)
  # Under jit: one program each, not one per scan and per op (the test's time is compiling).
  (out, carry), (want_out, want_carry) = (nnx.jit(lambda l: summary(l, ours))(layer),
                                          nnx.jit(lambda l: summary(l, flax_rnn))(layer))
  np.testing.assert_allclose(out, want_out, atol=tol)
  for got, want in zip(jax.tree.leaves(carry), jax.tree.leaves(want_carry)):
    np.testing.assert_allclose(got, want, atol=tol)

  weights = jax.random.normal(jax.random.PRNGKey(1), want_out.shape)
  loss = lambda run: lambda layer: jnp.sum(summary(layer, run)[0] * weights) + sum(
      jnp.sum(c) for c in jax.tree.leaves(summary(layer, run)[1]))
  grads = nnx.jit(nnx.grad(loss(ours)))(layer)
  want_grads = nnx.jit(nnx.grad(loss(flax_rnn)))(layer)
  for got, want in zip(jax.tree.leaves(nnx.state(grads, nnx.Param)),
                       jax.tree.leaves(nnx.state(want_grads, nnx.Param))):
    np.testing.assert_allclose(got, want, atol=10 * tol, rtol=1e-4)


def _dots(jaxpr) -> int:
  return str(jaxpr).count("dot_general")


def _scans(jaxpr) -> list:
  """Every scan equation of `jaxpr`, inside nested jaxprs too (a custom VJP's call)."""
  found = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "scan":
      found.append(eqn)
      continue
    for value in eqn.params.values():
      inner = getattr(value, "jaxpr", value)
      if hasattr(inner, "eqns"):
        found.extend(_scans(inner))
  return found


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_the_input_projection_runs_once_outside_the_scan(cell):
  """Inside the scan only the recurrent product dense_h(h) is left: one matmul a direction."""
  enc = _encoder(cell, bidirectional=True)
  graphdef, state = nnx.split(enc)
  x = jnp.zeros((B, T, E))
  jaxpr = jax.make_jaxpr(lambda state: nnx.merge(graphdef, state).run_layer(
      nnx.merge(graphdef, state).layers[0], x, jnp.asarray(LENGTHS)))(state).jaxpr
  scans = _scans(jaxpr)
  assert len(scans) == 2  # forward and backward
  assert [_dots(s.params["jaxpr"]) for s in scans] == [1, 1]
  assert _dots(jaxpr) == 4  # and dense_i once a direction, outside
