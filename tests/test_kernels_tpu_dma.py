"""The TPU launch's index maps (kernels/targets/tpu.py) against a brute-force list of visible steps.

A grid step (r, c) of one (b, h) is *visible* when the kernel body computes it: for the forward
and dq kernels (r a query block) c < `num_key_blocks`, for dk/dv (r a key block) c in
`query_block_range`. The properties checked, over lengths, tiles and causality:
- every step with a visible mask entry (`valid_mask`, brute force) is visible;
- a visible step reads its own block: the read block is c, the written-sequence inputs row r;
- a skipped step reads the block of the next visible step of its (b, h) (so that copy starts
  during the last visible step before it), or of the previous one when none follows, or block 0
  when the (b, h) has none: so the blocks read change, in grid order, exactly where the visible
  steps' blocks change (no copy for a skipped step);
- written-sequence inputs of a row with no visible step keep the previous row's block.
Values through these maps, with lengths, run on JAX's TPU interpreter; the lowering for TPU
carries the two prefetched length vectors.
"""

from __future__ import annotations

import itertools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

import kernels
from kernels import _common, launch
from kernels import flash_attention as fa
from kernels.targets import tpu

T = 64  # 4 blocks of 16, or 2 of 32: every kind of row (whole, diagonal, partly, not visible)
LENGTHS = [0, 1, 15, 16, 17, 40, 63, 64]


def _call(writes, bq, bk, causal):
  """A Call with the roles of a backward kernel (bodies unused: only its BlockSpecs are read)."""
  ins = ((launch.ROW, launch.OTHER, launch.LENGTHS, launch.LENGTHS) if writes == "q" else
         (launch.OTHER, launch.ROW, launch.LENGTHS, launch.LENGTHS))
  return launch.Call("probe", writes=writes, block_q=bq, block_k=bk, causal=causal, inputs=ins,
                     outputs=(launch.ROW,), out_shapes=(), loop_body=None, grid_body=None,
                     head_dim=16)


def _visible(writes, bq, bk, kl, ql, causal):
  """[n_rows, n_cols] bool: the steps the kernel bodies compute (their own predicates)."""
  n_w, n_r = (T // bq, T // bk) if writes == "q" else (T // bk, T // bq)
  vis = np.zeros((n_w, n_r), bool)
  for r in range(n_w):
    if writes == "q":
      hi = int(_common.num_key_blocks(np.int32(r), bq, bk, np.int32(kl), np.int32(ql), causal))
      vis[r, :hi] = True
    else:
      lo, hi = map(int, _common.query_block_range(np.int32(r), bq, bk, np.int32(kl),
                                                  np.int32(ql), causal))
      vis[r, lo:max(lo, hi)] = True
  return vis


def _nonempty(writes, bq, bk, kl, ql, causal):
  """[n_rows, n_cols] bool: tiles with at least one visible (query, key) pair, from the mask."""
  full = np.asarray(_common.valid_mask(jnp.arange(T), jnp.arange(T), kl, ql, causal))
  tiles = full.reshape(T // bq, bq, T // bk, bk).any(axis=(1, 3))  # [query block, key block]
  return tiles if writes == "q" else tiles.T


def _maps(writes, bq, bk, causal, kl, ql):
  """(read [rows, cols], row_in [rows, cols], row_out [rows, cols]): the row-block index each
  BlockSpec of the launch gives at every step of (b, h) = (1, 0), batch 1 holding (kl, ql)."""
  call = _call(writes, bq, bk, causal)
  specs = tpu._specs(call)
  n_w, n_r = (T // bq, T // bk) if writes == "q" else (T // bk, T // bq)
  r, c = jnp.meshgrid(jnp.arange(n_w, dtype=jnp.int32), jnp.arange(n_r, dtype=jnp.int32),
                      indexing="ij")
  kls, qls = jnp.array([T, kl], jnp.int32), jnp.array([T, ql], jnp.int32)
  x = jax.ShapeDtypeStruct((2, 1, T, 16), jnp.float32)
  index = lambda s: np.asarray(jnp.broadcast_to(
      s.index_map(jnp.int32(1), jnp.int32(0), r, c, kls, qls)[2], r.shape))
  return (index(specs[launch.OTHER](x, False)), index(specs[launch.ROW](x, False)),
          index(specs[launch.ROW](x, True)))


CONFIGS = [(w, bq, bk, causal) for w in ("q", "k") for bq, bk in ((16, 16), (32, 16), (16, 32))
           for causal in (False, True)]


@pytest.mark.parametrize("writes,bq,bk,causal", CONFIGS,
                         ids=[f"writes_{w}-{bq}x{bk}-{'causal' if c else 'full'}"
                              for w, bq, bk, c in CONFIGS])
def test_skipped_steps_read_a_neighbouring_visible_block(writes, bq, bk, causal):
  for kl, ql in itertools.product(LENGTHS, LENGTHS):
    vis = _visible(writes, bq, bk, kl, ql, causal)
    assert not (_nonempty(writes, bq, bk, kl, ql, causal) & ~vis).any(), (kl, ql)
    read, row_in, row_out = _maps(writes, bq, bk, causal, kl, ql)
    cols = np.broadcast_to(np.arange(vis.shape[1]), vis.shape)
    np.testing.assert_array_equal(read[vis], cols[vis], err_msg=f"{kl=} {ql=}")
    np.testing.assert_array_equal(row_out, np.broadcast_to(np.arange(vis.shape[0])[:, None],
                                                           vis.shape))
    # Grid order within (b, h): rows, then columns. Each skipped step against its neighbours.
    flat_vis, flat_read = vis.ravel(), read.ravel()
    visible_at = np.flatnonzero(flat_vis)
    for n in np.flatnonzero(~flat_vis):
      later, earlier = visible_at[visible_at > n], visible_at[visible_at < n]
      want = (flat_read[later[0]] if later.size else
              flat_read[earlier[-1]] if earlier.size else 0)
      assert flat_read[n] == want, (kl, ql, divmod(n, vis.shape[1]), read)
    # Hence copies (a block index differing from the previous step's) = the visible steps'.
    copies = lambda blocks: 1 + int(np.sum(blocks[1:] != blocks[:-1])) if blocks.size else 0
    assert copies(flat_read) == max(1, copies(flat_read[flat_vis])), (kl, ql, read)
    # Written-sequence inputs: their own row where the row computes, else the row before's.
    rows_vis = vis.any(axis=1)
    for r in range(vis.shape[0]):
      want = r if rows_vis[r] else (row_in[r - 1, 0] if r else 0)
      assert (row_in[r] == want).all(), (kl, ql, r, row_in[:, 0])
    assert not (rows_vis[1:] & ~rows_vis[:-1]).any()  # the rows that compute are a prefix


def test_causal_copies_per_row():
  """Causal, full lengths, 4 x 4 blocks: 9 copies per (b, h) for the 10 visible steps, in both
  directions (a row's first block carries over from the row before when they agree). The forward
  and dq kernels' skipped steps past the diagonal already hold block 0, the next row's first
  (clamping them to the row's last block makes as many copies, but the copy of block 0 then
  starts during a skipped step instead of the last visible one)."""
  for writes in ("q", "k"):
    read, _, _ = _maps(writes, 16, 16, True, T, T)
    flat = read.ravel()
    assert 1 + int(np.sum(flat[1:] != flat[:-1])) == 9, (writes, read)
  read, _, _ = _maps("q", 16, 16, True, T, T)
  np.testing.assert_array_equal(read, [[0, 0, 0, 0], [0, 1, 0, 0], [0, 1, 2, 0], [0, 1, 2, 3]])
  read, _, _ = _maps("k", 16, 16, True, T, T)
  np.testing.assert_array_equal(read, [[0, 1, 2, 3], [1, 1, 2, 3], [2, 2, 2, 3], [3, 3, 3, 3]])


def test_tpu_kernels_prefetch_the_lengths():
  """Every TPU kernel of the dot-product forward and backward takes the key and query lengths as
  its two scalar-prefetch operands (the index maps' inputs after the grid indices), in the
  jaxpr and in the module lowered for TPU."""
  L = jax.ShapeDtypeStruct((2,), jnp.int32)
  q = jax.ShapeDtypeStruct((2, 40, 1, 16), jnp.float32)
  f = lambda q, k, v, kl, ql: fa.attention(q, k, v, key_lengths=kl, query_lengths=ql,
                                           causal=True, implementation="pallas", interpret=False)
  loss = jax.grad(lambda *a: f(*a).sum(), argnums=(0, 1, 2))
  from test_kernels_tpu import pallas_calls  # the TPU branch of the platform switch
  eqns = list(pallas_calls(jax.make_jaxpr(loss)(q, q, q, L, L).jaxpr, "tpu"))
  assert len(eqns) == 3
  for eqn in eqns:
    mapping = eqn.params["grid_mapping"]
    assert mapping.num_index_operands == 2, eqn.params["name"]
    for m in mapping.block_mappings:
      assert len(m.index_map_jaxpr.jaxpr.invars) == 4 + 2
  text = jax.export.export(jax.jit(loss), platforms=["tpu"])(q, q, q, L, L).mlir_module()
  calls = [line for line in text.splitlines() if "stablehlo.custom_call @tpu_custom_call" in line]
  assert len(calls) == 3
  for line in calls:  # operand types: (kl, ql) first, tensor<2xi32> each
    assert re.search(r"\} : \(tensor<2xi32>, tensor<2xi32>, tensor<", line), line[-300:]


@pytest.mark.parametrize("causal", [False, True])
def test_values_with_lengths_on_the_tpu_interpreter(causal):
  """The dot-product kernel through the TPU launch on JAX's TPU interpreter, 16-row tiles over
  4 blocks per axis, lengths that skip key blocks, pad query blocks and empty a batch row:
  forward and gradients against the dense reference."""
  rng = np.random.default_rng(0)
  B, Tq, Tk, H, d = 3, 64, 56, 1, 16
  q, k, v = (jnp.asarray(rng.standard_normal((B, t, H, d)), jnp.float32) for t in (Tq, Tk, Tk))
  kl, ql = jnp.array([56, 20, 0]), jnp.array([64, 33, 64])
  g = jnp.asarray(rng.standard_normal((B, Tq, H, d)), jnp.float32)

  def run(impl, **kw):
    f = lambda q, k, v: fa.attention(q, k, v, key_lengths=kl, query_lengths=ql, causal=causal,
                                     implementation=impl, **kw)
    out, vjp = jax.vjp(f, q, k, v)
    return (out, *vjp(g))

  got = run("pallas", interpret=pltpu.InterpretParams(),
            block_sizes=kernels.BlockSizes(block_q=16, block_k=16))
  want = run("xla")
  for name, x, y in zip(("out", "dq", "dk", "dv"), got, want):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=2e-5, rtol=2e-5, err_msg=name)
