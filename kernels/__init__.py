"""Fused attention kernels (Pallas) with an exact blocked CPU path and dense references.

Layout `[B, T, H, d]`; masks and fully-masked-row behaviour as in `attn/masks.py`.
- `attention` / `attention_with_lse`: scaled dot-product (flash) attention.
- `additive_attention` / `additive_attention_with_lse`: fused Bahdanau attention.
- `pallas_attention_padded` / `pallas_additive_attention_padded`: the Pallas kernels on padded
  shapes, with NaN-poisoned outputs on request (tests and benchmarks).
Every kernel runs through the shared skeleton in `kernels/_skeleton.py` on a target from
`kernels.targets` (launch, tiles, what it supports): `target="auto"` is Triton on CUDA/ROCm and
Mosaic TPU on TPU, chosen per platform at lowering; `attention(..., target="mosaic_gpu")` runs
the dot-product kernel's Mosaic GPU forward for Hopper (`kernels/flash_attention_mgpu.py`;
Triton backward).
"""

from kernels import targets
from kernels._common import BlockSizes
from kernels.additive import (additive_attention, additive_attention_reference,
                              additive_attention_with_lse, pallas_additive_attention_padded)
from kernels.flash_attention import (attention, attention_reference, attention_with_lse,
                                     pallas_attention_padded)

__all__ = ["BlockSizes", "additive_attention", "additive_attention_reference",
           "additive_attention_with_lse", "attention", "attention_reference", "attention_with_lse",
           "pallas_additive_attention_padded", "pallas_attention_padded", "targets"]
