"""attn.common.jitting: blocks of draws dispatched one block ahead of their reading."""

import numpy as np
import pytest

from attn.common import jitting


@pytest.mark.parametrize("first,size", [(0, 4), (8, 4), (3, 1)])
def test_blocks_ahead_yields_each_block_in_order_after_dispatching_the_next(first, size):
  calls = []

  def draw(start):
    calls.append(start)
    return {"rows": np.arange(start, start + size), "key": np.full(2, start)}

  blocks = jitting.blocks_ahead(draw, first, size)
  for n in range(4):
    start, block = next(blocks)
    assert start == first + n * size
    np.testing.assert_array_equal(block["rows"], np.arange(start, start + size))
    np.testing.assert_array_equal(block["key"], [start, start])
    # the next block was dispatched before this one was read, and no further one
    assert calls == [first + k * size for k in range(n + 2)]


def test_quick_compile_draws_the_same_bits_as_the_default_level():
  import jax  # pylint: disable=import-outside-toplevel

  def draws(seed):
    keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.PRNGKey(seed), i))(np.arange(50))
    return jax.vmap(lambda k: jax.random.randint(k, (7,), 0, 1000))(keys), keys

  quick = jax.jit(draws, compiler_options=jitting.QUICK_COMPILE)(3)
  default = jax.jit(draws)(3)
  for a, b in zip(quick, default):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
