"""Fused attention kernels (Pallas) with an exact blocked CPU path and dense references.

Layout `[B, T, H, d]`; masks and fully-masked-row behaviour as in `attn/masks.py`.
- `attention` / `attention_with_lse`: scaled dot-product (flash) attention.
- `additive_attention` / `additive_attention_with_lse`: fused Bahdanau attention.
- `pallas_attention_padded` / `pallas_additive_attention_padded`: the Pallas kernels on padded
  shapes, with NaN-poisoned outputs on request (tests and benchmarks).
Every kernel runs through the shared skeleton in `kernels/_skeleton.py`. On CUDA the Pallas
kernels lower to Triton; `attention(..., gpu_lowering="mosaic")` runs the dot-product kernel's
Mosaic GPU forward for Hopper instead (`kernels/flash_attention_mgpu.py`; Triton backward).
"""

from kernels._common import BlockSizes
from kernels.additive import (additive_attention, additive_attention_reference,
                              additive_attention_with_lse, pallas_additive_attention_padded)
from kernels.flash_attention import (attention, attention_reference, attention_with_lse,
                                     pallas_attention_padded)

__all__ = ["BlockSizes", "additive_attention", "additive_attention_reference",
           "additive_attention_with_lse", "attention", "attention_reference", "attention_with_lse",
           "pallas_additive_attention_padded", "pallas_attention_padded"]
