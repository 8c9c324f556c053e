"""Attention mechanisms as pure JAX functions (see README.md for the API)."""

from attn import masks
from attn.registry import VARIANTS, Variant, get, names, register
