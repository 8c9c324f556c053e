"""The Triton tiles fit the GPU's shared memory (`kernels/targets/smem.py`): the estimate per
launch, the budget per GPU class (ATTN_TRITON_SMEM, else this host's GPU, else H100/H200), the
tiles `Target.tiles` chooses from them, and the one-line refusal when even 16 x 16 tiles do not
fit. Estimates only: Triton's own figure needs a GPU.
"""

from __future__ import annotations

import re
import types

import jax
import jax.numpy as jnp
import pytest

import kernels
from kernels.targets import TARGETS, smem, triton
from tests.test_kernels_precision import export_for_cuda, forward_and_backward, triton_dots
from tests.test_kernels_tpu import pallas_calls

NAMES = {"dot": "flash_attention", "additive": "additive_attention"}
DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)


@pytest.fixture(autouse=True)
def budget_env(monkeypatch):
  """No budget from the caller's environment: each test sets its own."""
  monkeypatch.delenv(smem.ENV, raising=False)
  return monkeypatch


def _tiles(kernel, dtype, d, dv):
  return TARGETS.get("triton").tiles(NAMES[kernel], dtype=dtype, d=d, dv=dv)


def _estimates(kernel, blocks, dtype, d, dv):
  return [smem.launch_bytes(l, blocks, dtype, d, dv) for l in smem.LAUNCHES]


def test_the_estimate_pins_the_float32_d256_figure_that_did_not_fit():
  """393,216 bytes for every float32 launch at d = 256 with the default tiles (bf16: half)."""
  dot = triton.BLOCKS["flash_attention"]
  assert _estimates("dot", dot, jnp.float32, 256, 256) == [393_216, 393_216, 393_216]
  assert _estimates("dot", dot, jnp.bfloat16, 256, 256) == [196_608, 196_608, 196_608]


@pytest.mark.parametrize("budget", list(smem.BUDGETS))
@pytest.mark.parametrize("kernel", ["dot", "additive"])
def test_chosen_tiles_fit_the_budget(kernel, budget, budget_env):
  """Every dtype and head dim up to 256 on every GPU class: each launch's estimate fits; tiles
  that fit already are kept as they are."""
  budget_env.setenv(smem.ENV, budget)
  limit = smem.BUDGETS[budget][0]
  defaults = triton.BLOCKS[NAMES[kernel]]
  for dtype in DTYPES:
    for d, dv in [(64, 64), (128, 128), (256, 256), (256, 64), (40, 100)]:
      blocks = _tiles(kernel, dtype, d, dv)
      assert max(_estimates(kernel, blocks, dtype, d, dv)) <= limit, (dtype, d, dv, blocks)
      if max(_estimates(kernel, defaults, dtype, d, dv)) <= limit:
        assert blocks is defaults


@pytest.mark.parametrize("budget,dtype,forward,backward", [
    ("hopper", jnp.float32, (64, 32), (32, 32)),  # the defaults would need 393,216 bytes
    ("hopper", jnp.bfloat16, (128, 64), (64, 64)),  # the defaults: 196,608 bytes
    ("ampere", jnp.bfloat16, (64, 64), (64, 32)),
    ("ampere", jnp.float32, (32, 32), (32, 16)),
])
def test_tiles_at_d256(budget, dtype, forward, backward, budget_env):
  """The larger of block_q, block_k is halved first (block_k on a tie), forward and backward
  tiles each on their own launches."""
  budget_env.setenv(smem.ENV, budget)
  blocks = _tiles("dot", dtype, 256, 256)
  assert (blocks.block_q, blocks.block_k) == forward
  assert (blocks.bwd_q, blocks.bwd_k) == backward
  assert TARGETS.get("mosaic_gpu").tiles("flash_attention", dtype=dtype, d=256, dv=256) == blocks


def test_tiles_without_inputs_or_on_other_targets_are_the_defaults():
  for target in TARGETS.values():
    for name in target.blocks:
      assert target.tiles(name) is target.blocks[name]
  for name in ("interpret", "tpu", "cpu_blocked"):
    target = TARGETS.get(name)
    assert target.tiles("flash_attention", dtype=jnp.float32, d=256, dv=256) is (
        target.blocks["flash_attention"])


REFUSAL = re.compile(
    r"^the additive_attention Triton kernels need ~835584 bytes of shared memory even with "
    r"16 x 16 tiles for float32, d=4096, dv=256, over the hopper budget of 232448 bytes; use "
    r"implementation='blocked' or bfloat16 inputs")


def test_inputs_no_tiles_fit_are_refused_with_one_line():
  """d_attn = 4096 in float32: 16 x 16 tiles would need ~836 KB. Refused by Target.tiles and by
  the public wrapper when lowered for CUDA; the blocked path runs it."""
  with pytest.raises(ValueError) as refused:
    _tiles("additive", jnp.float32, 4096, 256)
  assert REFUSAL.fullmatch(str(refused.value)), refused.value
  x = lambda *shape, dt=jnp.float32: jax.ShapeDtypeStruct(shape, dt)
  f = lambda qp, kp, w, v: kernels.additive_attention(qp, kp, w, v, implementation="pallas",
                                                       interpret=False)
  args = (x(1, 32, 1, 4096), x(1, 32, 1, 4096), x(1, 4096), x(1, 32, 1, 256))
  with pytest.raises(ValueError) as refused:  # jax appends its traceback note on a line of its own
    export_for_cuda(f, *args)
  assert REFUSAL.fullmatch(str(refused.value).splitlines()[0]), refused.value
  blocked = lambda *a: kernels.additive_attention(*a, implementation="blocked")
  assert jax.eval_shape(blocked, *args).shape == (1, 32, 1, 256)
  # Tiles given whole are the caller's: used as given, neither fitted nor refused.
  given = lambda *a: kernels.additive_attention(*a, implementation="pallas", interpret=False,
                                                block_q=16, block_k=16)
  assert jax.eval_shape(given, *args).shape == (1, 32, 1, 256)


def test_the_refusal_suggests_bfloat16_only_to_float32(budget_env):
  budget_env.setenv(smem.ENV, "20000")
  with pytest.raises(ValueError, match=r"~98304 bytes .* float32, d=256, dv=256, over the "
                     r"ATTN_TRITON_SMEM=20000 budget of 20000 bytes; use implementation="
                     r"'blocked' or bfloat16 inputs$"):
    _tiles("dot", jnp.float32, 256, 256)
  with pytest.raises(ValueError, match=r"~49152 bytes .*bfloat16.*use implementation='blocked'$"):
    _tiles("dot", jnp.bfloat16, 256, 256)


def test_the_budget_knob_and_the_local_gpu(budget_env):
  assert smem.budget() == ("hopper", 232_448)  # this host has no GPU
  for value, expected in [("ampere", ("ampere", 166_912)), ("A100", ("ampere", 166_912)),
                          ("sm86", ("sm86", 101_376)), ("h200", ("hopper", 232_448)),
                          ("150000", ("ATTN_TRITON_SMEM=150000", 150_000))]:
    assert smem.budget({smem.ENV: value}) == expected, value
  with pytest.raises(ValueError, match=r"'v100' is not a GPU class \(hopper, ampere, sm86\)"):
    smem.budget({smem.ENV: "v100"})
  a100 = types.SimpleNamespace(compute_capability="8.0")
  budget_env.setattr(jax, "local_devices", lambda backend=None: [a100])
  assert smem.budget() == ("ampere", 166_912)
  assert smem.budget({smem.ENV: "hopper"}) == ("hopper", 232_448)  # the knob wins
  a100.compute_capability = "7.0"  # outside the table: the default
  assert smem.budget() == ("hopper", 232_448)


def test_float32_d256_lowers_for_cuda_with_the_chosen_tiles():
  """Forward and backward of the dot kernel at float32, d = 256: the pallas_calls take the fitted
  tiles (their written blocks), the Triton IR is exported, with IEEE dots."""
  jax.clear_caches()  # tiles are chosen when traced
  f, args = forward_and_backward("dot", jnp.float32, d=256, dv=256)
  blocks = _tiles("dot", jnp.float32, 256, 256)
  written = {}
  for eqn in pallas_calls(jax.make_jaxpr(f)(*args).jaxpr, "cuda"):
    first = eqn.params["grid_mapping"].block_mappings[0 if "dkdv" not in str(eqn.params["name"])
                                                      else 1]
    rows = [b for b in first.block_shape[:-1] if hasattr(b, "block_size")]  # the sequence axis
    written[str(eqn.params["name"])] = rows[0].block_size
  assert written == {"flash_attention_fwd": blocks.block_q, "flash_attention_dq": blocks.bwd_q,
                     "flash_attention_dkdv": blocks.bwd_k}
  dots = triton_dots(export_for_cuda(f, *args))
  assert {p for found in dots.values() for p, _ in found} == {"ieee"}
