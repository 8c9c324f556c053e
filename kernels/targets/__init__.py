"""The registry of kernel targets: `TARGETS`, one `Target` per way of running the fused kernels.

A new target is one file in this package that builds a `Target` and adds it to `TARGETS`, and
one import line below. See `kernels/targets/base.py` for what an entry holds.
"""

from kernels.targets.base import AUTO, TARGETS, Target

# The entries (each module registers its targets on import).
from kernels.targets import triton  # noqa: E402,F401  "triton", "interpret"
from kernels.targets import tpu  # noqa: E402,F401  "tpu", "tpu_interpret"
from kernels.targets import mosaic_gpu  # noqa: E402,F401  "mosaic_gpu", "mosaic_gpu_ws", twins
from kernels.targets import cpu_blocked  # noqa: E402,F401  "cpu_blocked"

__all__ = ["AUTO", "TARGETS", "Target", "get", "names"]
get = TARGETS.get
names = TARGETS.names
