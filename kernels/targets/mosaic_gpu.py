"""Targets "mosaic_gpu" and "mosaic_gpu_ws" (CUDA, Hopper) and their twins in JAX's Mosaic GPU
interpreter ("mosaic_gpu_interpret", "mosaic_gpu_ws_interpret"): the dot-product kernel's Mosaic
GPU forward (TMA + WGMMA, `kernels/flash_attention_mgpu.py`), one target per schedule:
"mosaic_gpu" the pipelined one (one warpgroup per 64 query rows), "mosaic_gpu_ws"
FlashAttention-3's warp-specialized one (two compute warpgroups and a memory warpgroup). Both
use the Triton target's launch for the backward and for what the Mosaic forward does not take
(float32: WGMMA would round to tf32; head dims above 256; causal under a CUDA whose ptxas
miscompiles the mask). Only the dot-product kernel has such a forward. Lowered for CUDA from a
CPU host (tests/test_kernels_mgpu.py); never run on a GPU.

Layout: head-major ([B, H, T, d], the Triton loop launch's head-major form): the forward's TMA
copies take [b, h, rows] slabs. Tiles: the forward's key tile is block_k (default 128, FlashAttention-3's for d <= 128; the
forward takes the largest of 64/128/256 that fits shared memory at most that), the backward
keeps the Triton tiles (64/64); the Triton forward, where it runs instead, gets at most the
Triton target's own forward tiles (the padded lengths are multiples of both).
"""

from __future__ import annotations

import dataclasses
import functools

from kernels.targets import smem, triton
from kernels.targets.base import TARGETS, Target

_TRITON = triton.BLOCKS["flash_attention"]
BLOCKS = dataclasses.replace(_TRITON, block_q=128, block_k=128, block_q_bwd=_TRITON.bwd_q,
                             block_k_bwd=_TRITON.bwd_k)


def _triton_tiles(fallback):
  """The kernel's forward with forward tiles at most the Triton target's (the Mosaic targets'
  block_k = 128 is the Mosaic forward's; float32 at d = 256 would not fit Triton's)."""
  def run(q, k, v, theta, kl, ql, cfg):
    blocks = dataclasses.replace(cfg.blocks, block_q=min(cfg.blocks.block_q, _TRITON.block_q),
                                 block_k=min(cfg.blocks.block_k, _TRITON.block_k))
    return fallback(q, k, v, theta, kl, ql, dataclasses.replace(cfg, blocks=blocks))
  return run


def _dot_forward(q, k, v, theta, kl, ql, cfg, *, fallback, schedule):
  """The Mosaic GPU forward of the dot-product kernel (imported when first traced)."""
  from kernels import flash_attention_mgpu  # pylint: disable=import-outside-toplevel
  return flash_attention_mgpu.forward(q, k, v, theta, kl, ql, cfg, schedule=schedule,
                                      fallback=_triton_tiles(fallback))


def _add(name: str, schedule: str, summary: str):
  forwards = {"flash_attention": functools.partial(_dot_forward, schedule=schedule)}
  TARGETS.add(Target(
      name=name, implementation="pallas", blocks={"flash_attention": BLOCKS},
      launch=triton.loop_launch_head_major, platforms=("cuda",),
      interpreted=f"{name}_interpret", forwards=forwards, fit=smem.fit, summary=summary))
  TARGETS.add(Target(
      name=f"{name}_interpret", implementation="pallas",
      blocks={"flash_attention": triton.INTERPRET_BLOCKS["flash_attention"]},
      launch=triton.loop_launch_head_major, interpret=True, forwards=forwards,
      summary=f"{name} in JAX's Mosaic GPU interpreter (any host; tests)"))


_add("mosaic_gpu", "pipelined",
     "dot-product forward in Mosaic GPU for Hopper (bf16/f16), Triton backward")
_add("mosaic_gpu_ws", "warp_specialized",
     "the same, warp-specialized as FlashAttention-3 (two compute warpgroups, one for TMA)")
