"""Fused attention kernels (Pallas) with an exact blocked CPU path and dense references.

Layout `[B, T, H, d]`; masks and fully-masked-row behaviour as in `attn/masks.py`.
- `attention` / `attention_with_lse`: scaled dot-product (flash) attention.
- `additive_attention` / `additive_attention_with_lse`: fused Bahdanau attention.
"""

from kernels._common import BlockSizes
from kernels.additive import (additive_attention, additive_attention_reference,
                                        additive_attention_with_lse)
from kernels.flash_attention import attention, attention_reference, attention_with_lse

__all__ = ["BlockSizes", "additive_attention", "additive_attention_reference",
           "additive_attention_with_lse", "attention", "attention_reference", "attention_with_lse"]
