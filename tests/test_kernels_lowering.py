"""Cross-lowering of the Pallas kernels for the accelerators they are written for, on any host.

`jax.export` with an explicit platform runs the whole Pallas lowering (Triton IR for CUDA, with its
shape checks) without a device. Each case checks that the exported module holds one Pallas custom
call per kernel launch (not a silent fallback to XLA, nor the Mosaic GPU lowering), with the
Triton launch parameters the kernel asked for, and that the GPU tiles fit the H100/H200 shared
memory.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernels
from kernels import additive, flash_attention
from kernels.targets import smem

# The Triton lowering for CUDA; the Mosaic TPU lowering is pinned in tests/test_kernels_tpu.py,
# the dot kernel's Mosaic GPU forward (target="mosaic_gpu") in tests/test_kernels_mgpu.py.
PLATFORMS = ("cuda",)
TRITON_CALL = "__gpu$xla.gpu.triton"
CALL_RE = re.compile(r"stablehlo\.custom_call @(\S+?)\(")
SMEM_LIMIT = smem.BUDGETS["hopper"][0]  # H100/H200: 227 KiB per thread block
B, H, T = 2, 2, 200  # T above the largest GPU block, so no block is clamped

# kernel, dtype, qk width (head dim or d_attn), value width, causal and padded. Causality and
# padding share cases: both only change the in-kernel masks and loop bounds.
CASES = [
    ("dot", jnp.float32, 64, 64, True),
    ("dot", jnp.bfloat16, 128, 128, True),
    ("dot", jnp.bfloat16, 64, 64, False),
    ("dot", jnp.float32, 128, 128, False),
    ("additive", jnp.float32, 64, 64, True),
    ("additive", jnp.bfloat16, 128, 128, False),
    ("additive", jnp.bfloat16, 512, 128, True),  # the larger attention width of Bahdanau models
    ("additive", jnp.float32, 256, 64, False),
]
# The kernels each pass launches, by name (forward; forward + backward).
LAUNCHES = {
    "dot": (["flash_attention_fwd"],
            ["flash_attention_fwd", "flash_attention_dq", "flash_attention_dkdv"]),
    "additive": (["additive_attention_fwd"],
                 ["additive_attention_fwd", "additive_attention_dq", "additive_attention_dkv"]),
}


def _loss_and_args(kernel, dtype, d, dv, masked):
  """(f(*args) -> out [B, T, H, dv], args as ShapeDtypeStructs, indices of differentiable args)."""
  x = lambda *shape, dt=dtype: jax.ShapeDtypeStruct(shape, dt)
  lens = x(B, dt=jnp.int32) if masked else None
  kw = dict(causal=masked, implementation="pallas", interpret=False)
  if kernel == "dot":
    f = lambda q, k, v, kl, ql: kernels.attention(q, k, v, key_lengths=kl, query_lengths=ql, **kw)
    return f, (x(B, T, H, d), x(B, T, H, d), x(B, T, H, dv), lens, lens), (0, 1, 2)
  f = lambda qp, kp, w, val, kl, ql: kernels.additive_attention(
      qp, kp, w, val, key_lengths=kl, query_lengths=ql, **kw)
  args = (x(B, T, H, d), x(B, T, H, d), x(H, d, dt=jnp.float32), x(B, T, H, dv), lens, lens)
  return f, args, (0, 1, 2, 3)


def _export(platform, kernel, dtype, d, dv, masked, backward):
  attend, args, diff = _loss_and_args(kernel, dtype, d, dv, masked)
  f = attend
  if backward:  # through the custom_vjp: the forward kernel and both backward kernels
    f = jax.grad(lambda *a: jnp.sum(attend(*a).astype(jnp.float32)), argnums=diff)
  # Triton custom calls carry no serialization-compatibility guarantee; lowering is all we check.
  checks = [jax.export.DisabledSafetyCheck.custom_call(TRITON_CALL)]
  return jax.export.export(jax.jit(f), platforms=[platform], disabled_checks=checks)(*args)


def _triton_tiles(kernel):
  """The tiles the "triton" target gives the kernel ("dot" or "additive")."""
  name = (flash_attention if kernel == "dot" else additive).KERNEL.name
  return kernels.targets.get("triton").tiles(name)


def _smem_estimate(kernel, launch, dtype, d, dv):
  """Estimated shared-memory bytes of one thread block of a launch (`kernels.targets.smem`;
  Triton reports the real figure only when it compiles, which needs a GPU)."""
  part = {"fwd": "fwd", "dq": "dq", "dkdv": "dkdv", "dkv": "dkdv"}[launch.rsplit("_", 1)[-1]]
  return smem.launch_bytes(part, _triton_tiles(kernel), dtype, d, dv)


@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "fwd_bwd"])
@pytest.mark.parametrize("kernel,dtype,d,dv,masked", CASES, ids=[
    f"{k}-{jnp.dtype(t).name}-d{d}-dv{dv}-{'causal_padded' if m else 'full'}"
    for k, t, d, dv, m in CASES])
@pytest.mark.parametrize("platform", PLATFORMS)
def test_kernels_lower_to_triton(platform, kernel, dtype, d, dv, masked, backward):
  text = _export(platform, kernel, dtype, d, dv, masked, backward).mlir_module()
  calls = CALL_RE.findall(text)
  assert calls == [TRITON_CALL] * len(calls), calls  # no Mosaic GPU or other custom call
  names = re.findall(r'name = "(\w+)", num_stages = (\d+) : i32, num_warps = (\d+) : i32', text)
  expected = LAUNCHES[kernel][backward]
  assert sorted(n for n, _, _ in names) == sorted(expected)
  blocks = _triton_tiles(kernel)
  warps = blocks.num_warps or (4 if max(d, dv) <= 64 else 8)
  for name, stages, num_warps in names:
    assert (int(stages), int(num_warps)) == (blocks.num_stages, warps), name
    smem = _smem_estimate(kernel, name, dtype, d, dv)
    assert smem <= SMEM_LIMIT, f"{name}: ~{smem} bytes of shared memory > {SMEM_LIMIT}"


def test_smem_estimate_figures():
  """The largest estimates of the cases above, pinned so a block-size change shows up here."""
  worst = {k: max(_smem_estimate(k, n, t, d, dv) for kk, t, d, dv, _ in CASES if kk == k
                  for n in LAUNCHES[k][1])
           for k in LAUNCHES}
  assert worst == {"dot": 196608, "additive": 122880}, worst
  assert np.all(np.array(list(worst.values())) <= SMEM_LIMIT)
