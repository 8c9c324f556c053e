"""Attention mechanisms as pure JAX functions.

    e = attn.score("additive", params, q, k)            # [..., Tq, Tk]
    w = attn.normalize(e, mask, kind="sparsemax")        # [..., Tq, Tk], rows sum to 1 (or 0)
    ctx, w = attn.attend(params, q, k, v, score="general", mask=mask)

Every score, normalizer and scope is registered by name in `attn.VARIANTS` (see attn.get).
The data pipeline is `attn.data` (imported on demand: it needs the data extras).
"""

from attn import masks
from attn.core import attend, init_scope, init_score, normalize, prepare_keys, score
from attn.linear import linear_attention
from attn.multihead import init_multihead, multihead
from attn.registry import VARIANTS, Variant, canonical_names, get, names, register

__all__ = [
    "VARIANTS", "Variant", "attend", "canonical_names", "get", "init_multihead", "init_scope",
    "init_score", "linear_attention", "masks", "multihead", "names", "normalize", "prepare_keys",
    "register",
    "score",
]
