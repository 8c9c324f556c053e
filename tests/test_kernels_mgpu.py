"""The Mosaic GPU forward of the dot-product kernel (target "mosaic_gpu"): cross-lowered for
CUDA on any host, and run in JAX's Mosaic GPU interpreter against the float64 reference.

Lowering: `jax.export` for "cuda" runs the whole Mosaic GPU lowering (layouts, WGMMA operand
checks, the kernel's shared-memory total against the 227 KiB of an H100/H200) without a device.
Each case checks the module holds exactly one `mosaic_gpu_v2` call for the forward (not a silent
fallback to Triton or XLA) and, with the backward, the two Triton launches that consume its
residuals. The shared-memory figure is the one the Mosaic GPU lowering computes for the launch.
Values: interpret mode runs the kernel's copies, barriers, pipeline, masks and softmax in the
Mosaic GPU interpreter (the matrix products as dot_general: see kernels/flash_attention_mgpu.py),
with the tolerance rule of tests/kernel_cases.py; the backward is the Triton kernels'
interpret mode. Each value case takes ~10-15 s on 2 cores: the interpreter runs every kernel
operation through a host callback, and the cases need four key tiles (pipeline refills, masked
and unmasked tiles) to cover the kernel.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.mosaic.gpu import core as mosaic_gpu_core

import kernel_cases as kc
import kernels
from kernel_cases import Case
from kernels import flash_attention as fa
from kernels import flash_attention_mgpu as fm

MOSAIC_CALL = "mosaic_gpu_v2"
TRITON_CALL = "__gpu$xla.gpu.triton"
CALL_RE = re.compile(r"stablehlo\.custom_call @(\S+?)\(")
SMEM_LIMIT = 232448  # H100/H200: 227 KiB of shared memory per thread block
B, H, T = 2, 2, 200  # odd length, several query tiles and key tiles

# dtype, head dim, causal and padded (both only change in-kernel masks and loop bounds).
CASES = [(dt, d, masked) for dt in (jnp.bfloat16, jnp.float16) for d in (64, 128)
         for masked in (True, False)]


def _attend(masked, **kw):
  kw = dict(causal=masked, implementation="pallas", interpret=False, target="mosaic_gpu", **kw)
  return lambda q, k, v, kl, ql: kernels.attention(q, k, v, key_lengths=kl, query_lengths=ql,
                                                   **kw)


def _export(dtype, d, masked, backward=False, **kw):
  x = lambda *shape, dt=dtype: jax.ShapeDtypeStruct(shape, dt)
  lens = x(B, dt=jnp.int32) if masked else None
  f = attend = _attend(masked, **kw)
  if backward:  # the Mosaic GPU forward, then the Triton dq and dk/dv kernels
    f = jax.grad(lambda *a: jnp.sum(attend(*a).astype(jnp.float32)), argnums=(0, 1, 2))
  checks = [jax.export.DisabledSafetyCheck.custom_call(c) for c in (TRITON_CALL, MOSAIC_CALL)]
  return jax.export.export(jax.jit(f), platforms=["cuda"], disabled_checks=checks)(
      x(B, T, H, d), x(B, T, H, d), x(B, T, H, d), lens, lens).mlir_module()


@pytest.fixture
def smem_figures(monkeypatch):
  """The shared-memory bytes the Mosaic GPU lowering computes for each launch, as it lowers."""
  figures, real = [], mosaic_gpu_core._smem_tree_size
  monkeypatch.setattr(mosaic_gpu_core, "_smem_tree_size",
                      lambda tree: figures.append(real(tree)) or figures[-1])
  return figures


@pytest.mark.parametrize("dtype,d,masked", CASES, ids=[
    f"{jnp.dtype(t).name}-d{d}-{'causal_padded' if m else 'full'}" for t, d, m in CASES])
def test_forward_lowers_to_mosaic_gpu(dtype, d, masked, smem_figures):
  calls = CALL_RE.findall(_export(dtype, d, masked))
  assert calls == [MOSAIC_CALL], calls
  assert len(smem_figures) == 1
  assert fm.smem_bytes(d, d, 64, dtype) <= smem_figures[0] <= SMEM_LIMIT, smem_figures


@pytest.mark.parametrize("dtype,d", [(jnp.bfloat16, 128), (jnp.float16, 64)])
def test_forward_and_backward_lower_mosaic_then_triton(dtype, d):
  text = _export(dtype, d, True, backward=True)
  assert sorted(CALL_RE.findall(text)) == sorted([MOSAIC_CALL] + [TRITON_CALL] * 2)
  names = re.findall(r'name = "(\w+)", num_stages', text)
  assert sorted(names) == ["flash_attention_dkdv", "flash_attention_dq"]


def test_float32_keeps_the_triton_forward():
  """WGMMA would take float32 as tf32 (10 mantissa bits): float32 stays on Triton."""
  assert CALL_RE.findall(_export(jnp.float32, 64, True)) == [TRITON_CALL]


def test_a_key_tile_too_large_for_shared_memory_is_halved(smem_figures):
  """d = 256 with block_k = 128 would need 320 KiB; the forward takes 64-key tiles instead."""
  assert fm.smem_bytes(256, 256, 128, jnp.bfloat16) > SMEM_LIMIT
  assert CALL_RE.findall(_export(jnp.bfloat16, 256, True, block_k=128)) == [MOSAIC_CALL]
  assert fm.smem_bytes(256, 256, 64, jnp.bfloat16) <= smem_figures[0] <= SMEM_LIMIT


def test_other_platforms_get_their_own_target():
  """The target names what runs: "mosaic_gpu" is compiled for CUDA only, so lowering it for a
  TPU is refused, while target "auto" lowers the Mosaic TPU kernels there."""
  x = jax.ShapeDtypeStruct((1, 64, 1, 64), jnp.bfloat16)
  with pytest.raises(Exception, match="tpu"):
    jax.export.export(jax.jit(_attend(False)), platforms=["tpu"])(x, x, x, None, None)
  auto = lambda q, k, v: kernels.attention(q, k, v, implementation="pallas", interpret=False)
  text = jax.export.export(jax.jit(auto), platforms=["tpu"])(x, x, x)
  assert CALL_RE.findall(text.mlir_module()) == ["tpu_custom_call"]


def test_smem_estimate_figures():
  """The largest tiles the defaults use, pinned so a tile change shows up here."""
  assert fm.smem_bytes(128, 128, 64, jnp.bfloat16) == 98560
  assert fm.smem_bytes(256, 256, 64, jnp.bfloat16) == 196864 <= SMEM_LIMIT


def test_unknown_target_is_refused():
  q = jnp.zeros((1, 8, 1, 16), jnp.bfloat16)
  with pytest.raises(ValueError, match=r"^unknown target 'cutlass'; known: auto, triton, "):
    kernels.attention(q, q, q, implementation="pallas", target="cutlass")


def test_the_additive_kernel_has_no_mosaic_gpu_target():
  q, w = jnp.zeros((1, 8, 1, 16), jnp.bfloat16), jnp.zeros((1, 16), jnp.bfloat16)
  with pytest.raises(ValueError, match=r"^target 'mosaic_gpu' does not run the additive_attention"):
    kernels.additive_attention(q, q, w, q, target="mosaic_gpu", interpret=False)


# ----------------------------------------------------------------------------------------------
# Values in the Mosaic GPU interpreter.

VALUE_CASES = [
    # Odd lengths over one 64-row tile, Tq < Tk, a batch row with no keys; four key tiles, so
    # both pipeline slots are refilled, three of them unmasked for the first query tile.
    (Case("cross_padded", B=2, Tq=70, Tk=201, H=1, d=64, dv=64, causal=False,
          key_lengths=(201, 0)), jnp.bfloat16),
    # Causal, padded queries, head dim 128 and a value dim that is not (padded to 64 multiples
    # inside); the second query tile sees its first key tile whole (unmasked).
    (Case("causal_d128", B=1, Tq=150, Tk=150, H=1, d=128, dv=80, causal=True,
          key_lengths=(150,), query_lengths=(140,)), jnp.float16),
]


def _run(case, q, k, v, kl, ql, target, implementation="pallas"):
  return fa.attention_with_lse(q, k, v, key_lengths=kl, query_lengths=ql, causal=case.causal,
                               implementation=implementation, interpret=True,
                               target=target)


@pytest.mark.parametrize("case,dtype", VALUE_CASES, ids=kc.ids(VALUE_CASES))
def test_interpreted_forward_and_gradients_match_float64(case, dtype):
  """out, lse and every gradient (Triton backward on the Mosaic forward's residuals)."""
  q, k, v, kl, ql = kc.dot_inputs(case, dtype)
  cts = kc.cotangents(case)
  ref = kc.np_attention(q, k, v, kl, ql, case.causal, case.d ** -0.5, *cts)
  got_fn = lambda q, k, v: _run(case, q, k, v, kl, ql, "mosaic_gpu")
  naive_fn = lambda q, k, v: _run(case, q, k, v, kl, ql, "auto", implementation="xla")
  got = (*got_fn(q, k, v), *kc.loss_and_grads(got_fn, (q, k, v), *cts))
  naive = (*naive_fn(q, k, v), *kc.loss_and_grads(naive_fn, (q, k, v), *cts))
  for name, g, n, r in zip(("out", "lse", "dq", "dk", "dv"), got, naive, ref):
    kc.assert_as_close_as_naive(g, n, r, dtype, name)
  empty = np.isneginf(ref[1])  # rows with no visible key: exactly zero, lse -inf
  assert empty.any()
  np.testing.assert_array_equal(np.asarray(got[0], np.float32)[empty], 0.0)
  assert np.all(np.isneginf(np.asarray(got[1])[empty]))


def test_interpreted_kernel_is_the_mosaic_one(monkeypatch):
  """target="mosaic_gpu" in interpret mode runs the Mosaic GPU kernel, not the Triton one."""
  calls = []
  real = fm.mosaic_forward
  monkeypatch.setattr(fm, "mosaic_forward", lambda *a, **kw: calls.append(kw) or real(*a, **kw))
  q = jnp.ones((1, 20, 1, 64), jnp.bfloat16)
  fa.attention(q, q, q, implementation="pallas", interpret=True, target="mosaic_gpu")
  assert [c["interpret"] for c in calls] == [True]
