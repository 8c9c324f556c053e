"""Targets "mosaic_gpu" (CUDA, Hopper) and "mosaic_gpu_interpret" (JAX's Mosaic GPU interpreter):
the dot-product kernel's Mosaic GPU forward (TMA + WGMMA, `kernels/flash_attention_mgpu.py`),
with the Triton target's loop launch for its backward and for what that forward does not take
(float32: WGMMA would round to tf32; head dims above 256), head-major: that forward's TMA
copies take [b, h, rows] slabs. Only the dot-product kernel has such a forward. Lowered for
CUDA from a CPU host (tests/test_kernels_mgpu.py); never run on a GPU.
"""

from __future__ import annotations

from kernels.targets import smem, triton
from kernels.targets.base import TARGETS, Target


def _dot_forward(q, k, v, theta, kl, ql, cfg, *, fallback):
  """The Mosaic GPU forward of the dot-product kernel (imported when traced: ~0.4 s)."""
  from kernels import flash_attention_mgpu  # pylint: disable=import-outside-toplevel
  return flash_attention_mgpu.forward(q, k, v, theta, kl, ql, cfg, fallback=fallback)


_FORWARDS = {"flash_attention": _dot_forward}

TARGETS.add(Target(
    name="mosaic_gpu", implementation="pallas",
    blocks={"flash_attention": triton.BLOCKS["flash_attention"]},
    launch=triton.loop_launch_head_major, platforms=("cuda",),
    interpreted="mosaic_gpu_interpret", forwards=_FORWARDS, fit=smem.fit,
    summary="dot-product forward in Mosaic GPU for Hopper (bf16/f16), Triton backward"))
TARGETS.add(Target(
    name="mosaic_gpu_interpret", implementation="pallas",
    blocks={"flash_attention": triton.INTERPRET_BLOCKS["flash_attention"]},
    launch=triton.loop_launch_head_major, interpret=True, forwards=_FORWARDS,
    summary="the same in JAX's Mosaic GPU interpreter (any host; tests)"))
