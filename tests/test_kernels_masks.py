"""Masks only where needed in the dot-product kernel: tiles every row sees whole run without the
mask and its `where`s, in the loop bodies (Triton, the interpreter) and the grid bodies (Mosaic
TPU, its interpreter).

Checked from the kernel bodies' jaxprs (what Pallas lowers to Triton or Mosaic): a tile is a loop
body or `cond` branch that computes `exp`; each kernel must have a whole tile free of select,
comparisons and iota next to its masked ones. Values run in interpret mode on cases where the
forward and dq loops have whole and masked key blocks and the dk/dv loop has all three query
ranges (masked diagonal, whole, masked length tail), against the float64 reference.
"""

from __future__ import annotations

import collections
import itertools

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

import kernels
from kernels import _common, _loop_steps
from kernels import flash_attention as fa
from tests import kernel_cases as kc
from tests.test_kernels_tpu import pallas_calls

_CONTROL = ("while", "cond")
_MASK_OPS = ("select_n", "lt", "le", "gt", "ge", "iota")
# (target, interpret): the loop launch and the grid launch, each on its interpreter.
_TARGETS = {"loop": True, "grid": pltpu.InterpretParams()}
# Tiles per kernel: (whole, masked). dk/dv's loop has a masked range either side of the whole one.
_EXPECTED = {
    "loop": {"flash_attention_fwd": (1, 1), "flash_attention_dq": (1, 1),
             "flash_attention_dkdv": (1, 2)},
    "grid": {"flash_attention_fwd": (1, 1), "flash_attention_dq": (1, 1),
             "flash_attention_dkdv": (1, 1)},
}


def _ops(jaxpr) -> collections.Counter:
  """Primitive counts of jaxpr, through nested calls but not into loops or branches."""
  counts = collections.Counter()
  for eqn in jaxpr.eqns:
    counts[eqn.primitive.name] += 1
    if eqn.primitive.name not in _CONTROL:
      for sub in jax.extend.core.jaxprs_in_params(eqn.params):
        counts += _ops(getattr(sub, "jaxpr", sub))
  return counts


def _tiles(jaxpr, found):
  """The op counts of every loop body / branch of jaxpr (itself included) that computes exp."""
  counts = _ops(jaxpr)
  if counts["exp"]:
    found.append(counts)
  for eqn in jaxpr.eqns:
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      _tiles(getattr(sub, "jaxpr", sub), found)
  return found


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("launch", ["loop", "grid"])
def test_whole_tiles_have_no_mask(launch, causal):
  x = jnp.ones((1, 64, 1, 16), jnp.float32)
  f = lambda q: fa.attention(q, q, q, causal=causal, implementation="pallas",
                             interpret=_TARGETS[launch], block_q=16, block_k=16)
  jaxpr = jax.make_jaxpr(jax.grad(lambda q: f(q).sum()))(x).jaxpr
  seen = {}
  for eqn in pallas_calls(jaxpr, "cpu"):
    tiles = _tiles(eqn.params["jaxpr"].jaxpr if hasattr(eqn.params["jaxpr"], "jaxpr")
                   else eqn.params["jaxpr"], [])
    whole = [t for t in tiles if not any(t[op] for op in _MASK_OPS)]
    masked = [t for t in tiles if t["select_n"] and t["iota"]]
    seen[str(eqn.params["name"])] = (len(whole), len(masked))
    assert len(whole) + len(masked) == len(tiles), tiles
  assert seen == _EXPECTED[launch]


# ----------------------------------------------------------------------------------------------
# The loop bodies' ranges: consecutive, covering the visited blocks, whole only where unmasked.


def _tile_is_whole(i, j, bq, bk, kl, ql, causal):
  return bool(np.all(np.asarray(_common.valid_mask(
      _common.positions(i, bq), _common.positions(j, bk), kl, ql, causal))))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("bq,bk", [(16, 16), (32, 16), (16, 32)])
def test_loop_ranges_split_the_visited_blocks(bq, bk, causal):
  T, i32 = 64, np.int32
  for kl, ql in itertools.product([0, 1, 16, 31, 33, 64], [0, 15, 16, 47, 64]):
    lengths = (i32(kl), i32(ql))
    for i in range(T // bq):
      ranges = [tuple(map(int, r[:2])) + (r[2],)
                for r in _loop_steps.key_ranges(i32(i), bq, bk, lengths, causal)]
      n = int(_common.num_key_blocks(i32(i), bq, bk, *lengths, causal))
      _check_ranges(ranges, 0, n, lambda j: _tile_is_whole(i, j, bq, bk, kl, ql, causal))
    for j in range(T // bk):
      ranges = [tuple(map(int, r[:2])) + (r[2],)
                for r in _loop_steps.query_ranges(i32(j), bq, bk, lengths, causal)]
      lo, hi = map(int, _common.query_block_range(i32(j), bq, bk, *lengths, causal))
      hi = max(lo, hi)  # hi < lo: none visited, as in a fori_loop
      _check_ranges(ranges, lo, hi, lambda i: _tile_is_whole(i, j, bq, bk, kl, ql, causal))


def _check_ranges(ranges, lo, hi, is_whole):
  """ranges: (start, stop, masked) run back to back from lo to hi (each possibly empty); the
  unmasked ones hold only whole tiles."""
  starts = [lo] + [stop for _, stop, _ in ranges[:-1]]
  assert [start for start, _, _ in ranges] == starts and ranges[-1][1] == hi, (ranges, lo, hi)
  assert all(start <= stop for start, stop, _ in ranges), ranges
  for start, stop, masked in ranges:
    assert masked or all(is_whole(b) for b in range(start, stop)), (ranges, lo, hi)


# ----------------------------------------------------------------------------------------------
# Values through every range.

CASES = [
    # Self attention: diagonal (masked), whole blocks below it, query/key length tails.
    kc.Case("causal_lengths", B=2, Tq=70, Tk=70, H=1, d=16, dv=24, causal=True,
            key_lengths=(70, 45), query_lengths=(61, 70)),
    # Tq > Tk: rows past the last key see every key whole; one batch row has few keys.
    kc.Case("causal_tall", B=2, Tq=75, Tk=40, H=1, d=32, dv=16, causal=True,
            key_lengths=(40, 9)),
    # Non-causal: whole blocks up to the lengths, masked tails.
    kc.Case("cross_lengths", B=2, Tq=45, Tk=70, H=2, d=16, dv=16, causal=False,
            key_lengths=(70, 33), query_lengths=(45, 20)),
]
# Forward tiles (16, 32), backward (32, 16): whole/masked splits at unequal block sizes.
BLOCKS = kernels.BlockSizes(block_q=16, block_k=32, block_q_bwd=32, block_k_bwd=16)


@pytest.mark.parametrize("launch", ["loop", "grid"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_split_loops_match_float64(case, launch):
  q, k, v, kl, ql = kc.dot_inputs(case, jnp.float32)
  cts = kc.cotangents(case)
  ref = kc.np_attention(q, k, v, kl, ql, case.causal, case.d ** -0.5, *cts)

  def run(implementation, **kw):
    return lambda q, k, v: fa.attention_with_lse(
        q, k, v, key_lengths=kl, query_lengths=ql, causal=case.causal,
        implementation=implementation, **kw)
  pallas = run("pallas", interpret=_TARGETS[launch], block_sizes=BLOCKS)
  naive = run("xla")
  got = (*pallas(q, k, v), *kc.loss_and_grads(pallas, (q, k, v), *cts))
  dense = (*naive(q, k, v), *kc.loss_and_grads(naive, (q, k, v), *cts))
  for what, g, n, r in zip(("out", "lse", "dq", "dk", "dv"), got, dense, ref):
    kc.assert_as_close_as_naive(g, n, r, jnp.float32, what)
