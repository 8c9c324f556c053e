"""Primitive parameters inside NNX modules: the attn/ primitives take plain pytrees of arrays
(`attn.init_score(...)`), the modules hold them as nnx.Param leaves."""

from __future__ import annotations

import jax
from flax import nnx


def as_params(tree):
  """A pytree of arrays as nnx.Param leaves, to store on a module (None stays None)."""
  return None if tree is None else nnx.data(jax.tree.map(nnx.Param, tree))


def values(tree):
  """The raw arrays of a pytree of nnx.Param, to pass to a primitive (None stays None)."""
  return jax.tree.map(lambda p: p[...], tree, is_leaf=lambda x: isinstance(x, nnx.Variable))
