"""The kernels' loop bounds against the mask they stand for: a tile counted whole has every entry
visible, and every tile left out of the whole ranges has some entry masked (or is not visited)."""

import itertools

import numpy as np
import pytest

from kernels import _common


def _visible(i, j, bq, bk, kl, ql, causal):
  """[bq, bk] bool of tile (i, j), from `valid_mask` (the kernels' mask)."""
  return np.asarray(_common.valid_mask(_common.positions(i, bq), _common.positions(j, bk), kl, ql,
                                       causal))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("bq,bk", [(16, 16), (32, 16), (16, 32)])
def test_whole_tiles_are_exactly_the_unmasked_ones(bq, bk, causal):
  T = 64
  for kl, ql in itertools.product([0, 1, 16, 31, 32, 64], [0, 15, 16, 48, 64]):
    for i in range(T // bq):
      n = int(_common.num_key_blocks(np.int32(i), bq, bk, np.int32(kl), np.int32(ql), causal))
      whole = int(_common.whole_key_blocks(np.int32(i), bq, bk, np.int32(kl), np.int32(ql),
                                           causal))
      whole = min(whole, n)
      for j in range(n):
        assert _visible(i, j, bq, bk, kl, ql, causal).all() == (j < whole), (kl, ql, i, j)
    for j in range(T // bk):
      lo, hi = map(int, _common.query_block_range(np.int32(j), bq, bk, np.int32(kl),
                                                  np.int32(ql), causal))
      wlo, whi = map(int, _common.whole_query_blocks(np.int32(j), bq, bk, np.int32(kl),
                                                     np.int32(ql), causal))
      for i in range(lo, hi):
        assert _visible(i, j, bq, bk, kl, ql, causal).all() == (wlo <= i < whi), (kl, ql, i, j)
      # a whole block lies inside the visited range
      assert whi <= wlo or (lo <= wlo and whi <= hi), (kl, ql, j, lo, hi, wlo, whi)
