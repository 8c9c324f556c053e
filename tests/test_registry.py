"""The registry: names, aliases, duplicates, unknown names, and every variant reachable by name."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attn
from attn import registry


def test_every_kind_lists_the_documented_variants():
  assert set(attn.canonical_names("score")) == {"dot", "scaled_dot", "general", "additive", "location"}
  assert set(attn.canonical_names("normalizer")) == {"softmax", "sparsemax", "entmax15"}
  assert set(attn.canonical_names("scope")) == {"global", "window", "local_m", "local_p", "topk",
                                                "linear"}
  assert attn.get("concat").alias_of == "additive" and attn.get("sparse").alias_of == "topk"


def test_duplicates_are_refused_and_nothing_is_half_registered():
  with pytest.raises(ValueError, match="already registered"):
    registry.register("score", "brand_new", aliases=("dot",))(lambda p, q, k: q)
  assert "brand_new" not in attn.VARIANTS["score"]


def test_unknown_names_list_the_known_ones():
  with pytest.raises(KeyError, match="additive.*dot"):
    attn.get("bahdanau", "score")
  with pytest.raises(ValueError, match="known kinds"):
    attn.get("dot", "scorer")


def test_a_registered_variant_is_usable_by_name_everywhere():
  @registry.register("score", "neg_dot_for_test")
  def neg_dot(params, q, k):
    """Negated dot product (test-only)."""
    return -jnp.einsum("...qd,...kd->...qk", q, k)

  try:
    q = jax.random.normal(jax.random.PRNGKey(0), (3, 4))
    _, w = attn.attend(None, q, q, q, score="neg_dot_for_test")
    _, w_dot = attn.attend(None, -q, q, q, score="dot")
    np.testing.assert_allclose(w, w_dot, rtol=1e-6)
    assert attn.get("neg_dot_for_test").doc.startswith("Negated")
  finally:
    del attn.VARIANTS["score"]["neg_dot_for_test"]
