"""Target "cpu_blocked": the exact pure-JAX blocked path (`_common.blocked_attention`), a
`lax.map` over query chunks of a `lax.scan` over key steps; runs wherever JAX does, any head dim.
Its tiles are the query chunk and key step (see docs/benchmarks.md for the time/memory trade).
"""

from __future__ import annotations

from kernels._common import BlockSizes
from kernels.targets.base import TARGETS, Target

BLOCKS = {
    "flash_attention": BlockSizes(block_q=512, block_k=512),
    # the [block_q, block_k, d_attn] tanh tile is formed by XLA (~8 MiB at d_attn = 256)
    "additive_attention": BlockSizes(block_q=128, block_k=64),
}

TARGETS.add(Target(
    name="cpu_blocked", implementation="blocked", blocks=BLOCKS, max_head_dim=None,
    summary="pure JAX, exact, O(T·block) memory; the default off GPU"))
