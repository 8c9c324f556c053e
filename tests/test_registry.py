"""The registry: names, aliases, duplicates, unknown names, and every variant reachable by name."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attn
from attn import registry
from attn.errors import ConfigError, DataError
from attn.registry import Registry


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
    attn.VARIANTS["score"].remove("neg_dot_for_test")


def test_a_registry_names_its_kind_and_raises_its_own_error():
  things = Registry("data.task", error=DataError)
  things.add("reverse", object(), aliases=("rev",))
  with pytest.raises(DataError, match=r"unknown data.task 'revers'; known: rev, reverse"):
    things.get("revers")
  assert things.canonical_names() == ["reverse"] and things.alias_of("rev") == "reverse"
  assert things.get("rev") is things.get("reverse")


def test_a_registry_refuses_a_taken_name_without_registering_half():
  things = Registry("launcher", error=ConfigError)

  @things.register("local")
  class Local:  # pylint: disable=unused-variable
    """Runs on this machine."""

  with pytest.raises(ValueError, match="already registered"):
    things.add("slurm", object(), aliases=("local",))
  assert "slurm" not in things and things.names() == ["local"]
  things.remove("local")
  assert not things


def test_the_package_root_registers_only_the_primitives_kinds():
  assert registry.KINDS == ("score", "normalizer", "scope")
  from attn.models import registries  # pylint: disable=import-outside-toplevel
  assert registries.ARCHS.canonical_names() == ["rnn", "transformer"]
  assert registries.DECODERS.canonical_names() == ["bahdanau", "luong", "none"]


def test_fused_attention_reads_the_entries_flags_not_their_names():
  from attn import core, normalizers  # pylint: disable=import-outside-toplevel
  assert registry.fusable("normalizer") == ["softmax"] and registry.fusable("scope") == ["global"]
  assert core.fused_unsupported("dot", "softmax", "global") is None
  registry.register("normalizer", "softmax_for_test", fusable=True)(normalizers.softmax)
  registry.register("normalizer", "plain_for_test")(normalizers.softmax)
  try:
    assert core.fused_unsupported("dot", "softmax_for_test", "global") is None
    why = core.fused_unsupported("dot", "plain_for_test", "global")
    assert "normalizer='softmax' or 'softmax_for_test'" in why and "'plain_for_test'" in why
    assert "scope='global'" in core.fused_unsupported("dot", "softmax", "window")
  finally:
    attn.VARIANTS["normalizer"].remove("softmax_for_test")
    attn.VARIANTS["normalizer"].remove("plain_for_test")
