"""attn.models.dropout: every model's dropout masks come from XLA's native generator."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attn.models import build_model
from attn.models.dropout import dropout
from model_configs import model_config, random_batch

V = 11
ARCHS = {
    "rnn": dict(emb_dim=8, enc_hidden=8, dec_hidden=8, d_attn=8, decoder="bahdanau"),
    "rnn_luong_2_layers": dict(emb_dim=8, enc_hidden=8, dec_hidden=8, d_attn=8, decoder="luong",
                               enc_layers=2, dec_layers=2),
    "transformer": dict(arch="transformer", d_model=16, num_heads=2, d_ff=24,
                        max_tgt_len=8),
}


@pytest.mark.parametrize("arch", ARCHS)
def test_a_training_pass_draws_no_threefry_bernoulli(arch):
  """XLA:CPU runs `jax.random.bernoulli`'s threefry as ~20 rounds of elementwise uint32 work per
  element, ~10x the native generator's time; the RNN draws masks inside its scans too."""
  model = build_model(model_config(src_vocab=V, tgt_vocab=V, dropout=0.3, max_src_len=8,
                                   **ARCHS[arch]))
  batch = random_batch([5, 3], [4, 6], 6, 7, V, V)
  graphdef, state = nnx.split(model)
  logits = jax.jit(lambda state, k: nnx.merge(graphdef, state).attention(batch, k)[0])
  jaxpr = str(jax.make_jaxpr(logits)(state, jax.random.PRNGKey(0)))
  assert "rng_bit_generator" in jaxpr and "bernoulli" not in jaxpr
  # ...and dropout is on: two keys give two different passes, no key none.
  a, b = (logits(state, jax.random.PRNGKey(s)) for s in (1, 2))
  assert float(jnp.abs(a - b).max()) > 1e-4


@pytest.mark.parametrize("rate", [0.1, 0.3])
def test_keeps_one_minus_rate_scaled_and_one_mask_per_key(rate):
  """Keep rate 1 - rate, the kept values scaled by 1 / (1 - rate), independent masks for two
  keys, the same mask for the same key, identity without a key or at rate 0."""
  x = jnp.full((256, 1000), 2.0)
  a, b = dropout(x, rate, jax.random.PRNGKey(1)), dropout(x, rate, jax.random.PRNGKey(2))
  keep = 1.0 - rate
  assert abs(float(jnp.mean(a > 0)) - keep) < 0.005
  np.testing.assert_allclose(np.unique(np.asarray(a)), [0.0, 2.0 / keep], rtol=1e-6)
  both = keep ** 2 + rate ** 2  # agreement of two independent masks
  assert abs(float(jnp.mean((a > 0) == (b > 0))) - both) < 0.01
  np.testing.assert_array_equal(a, dropout(x, rate, jax.random.PRNGKey(1)))
  assert dropout(x, rate, None) is x and dropout(x, 0.0, jax.random.PRNGKey(1)) is x


def test_keeps_the_input_dtype():
  x = jnp.ones((64, 64), jnp.bfloat16)
  assert dropout(x, 0.5, jax.random.PRNGKey(0)).dtype == jnp.bfloat16
