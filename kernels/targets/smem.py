"""Shared memory of the Triton launches: the estimate per launch, the budget per GPU class, and
the tiles that fit it (`fit`, the "triton" target's `Target.fit`).

The estimate. Triton knows a kernel's shared memory only when it compiles, on a GPU (`jax.export`
from a CPU host stops at Triton IR), so tiles are chosen from an estimate counted like
FlashAttention's tile budget: a loop launch (`kernels/targets/triton.py`) keeps the tiles of its
written block for the whole loop (forward: q [bq, d]; dq: q and dO; dk/dv: k and v) and streams
the read sequence's tiles through the loop once per pipeline stage (forward and dq: k [bk, d],
v [bk, dv]; dk/dv: q and dO), all in the input dtype, at the widths the kernels pad to (powers of
two >= 16). Not counted: Triton's layout-conversion scratch and the float32 accumulators (in
registers). Both kernels are counted alike (the additive kernel's d is d_attn). The figure has not
been compared with Triton's own on a GPU.

The budget: the shared memory one thread block may use (CUDA's opt-in maximum per block), by GPU
class (`BUDGETS`: kernels._common.SMEM_BUDGETS). The environment variable ATTN_TRITON_SMEM
chooses it: a class name ("hopper", "ampere", "sm86"; also "h100", "h200", "a100") or a number
of bytes. Unset, the class of this host's GPU (by compute capability), and "hopper" on a host
without one (a `jax.export` for CUDA from a CPU host) or with a GPU outside the table. It is read
when a call is traced: set it before the first call.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp

from kernels._common import MIN_BLOCK, SMEM_BUDGETS as BUDGETS, BlockSizes, next_pow2

ENV = "ATTN_TRITON_SMEM"
DEFAULT = "hopper"
ALIASES = {"h100": "hopper", "h200": "hopper", "a100": "ampere"}
LAUNCHES = ("fwd", "dq", "dkdv")  # the forward, dq and dk/dv launches of either kernel


def launch_bytes(launch: str, blocks: BlockSizes, dtype, d: int, dv: int) -> int:
  """Estimated shared memory of one thread block of `launch` ("fwd", "dq" or "dkdv") with tiles
  `blocks` (the forward's or the backward's), inputs of `dtype`, q/k width d, v width dv."""
  d, dv = max(MIN_BLOCK, next_pow2(d)), max(MIN_BLOCK, next_pow2(dv))
  if launch == "fwd":  # resident q [bq, d]; streamed k [bk, d], v [bk, dv]
    resident, streamed = blocks.block_q * d, blocks.block_k * (d + dv)
  elif launch == "dq":  # resident q [bq, d], dO [bq, dv]; streamed k, v
    resident, streamed = blocks.bwd_q * (d + dv), blocks.bwd_k * (d + dv)
  elif launch == "dkdv":  # resident k [bk, d], v [bk, dv]; streamed q [bq, d], dO [bq, dv]
    resident, streamed = blocks.bwd_k * (d + dv), blocks.bwd_q * (d + dv)
  else:
    raise ValueError(f"unknown launch {launch!r}; known: {', '.join(LAUNCHES)}")
  return (resident + blocks.num_stages * streamed) * jnp.dtype(dtype).itemsize


def _local_gpu_class() -> str | None:
  """The budget class of this host's first GPU (by compute capability), None without one or for
  a GPU outside the table."""
  try:
    device = jax.local_devices(backend="gpu")[0]
  except RuntimeError:  # no GPU backend on this host
    return None
  capability = str(getattr(device, "compute_capability", ""))
  return next((name for name, (_, ccs) in BUDGETS.items() if capability in ccs), None)


def budget(environ=None) -> tuple[str, int]:
  """(name, bytes) of the shared-memory budget tiles are chosen for (see the module docstring).
  An unknown class name raises ValueError with the known ones."""
  value = (os.environ if environ is None else environ).get(ENV, "").strip()
  if value.isdigit():
    return f"{ENV}={value}", int(value)
  name = ALIASES.get(value.lower(), value.lower()) or _local_gpu_class() or DEFAULT
  if name not in BUDGETS:
    raise ValueError(f"{ENV}={value!r} is not a GPU class ({', '.join(BUDGETS)}) or a number "
                     f"of bytes")
  return name, BUDGETS[name][0]


def _shrink(blocks: BlockSizes, q: str, k: str, fits) -> BlockSizes | None:
  """Halves the larger of the tiles named q and k (k on a tie) until fits(blocks); None when
  both are at MIN_BLOCK and it still does not fit."""
  while not fits(blocks):
    bq, bk = getattr(blocks, q), getattr(blocks, k)
    if max(bq, bk) <= MIN_BLOCK:
      return None
    name = q if bq > bk else k
    blocks = dataclasses.replace(blocks, **{name: getattr(blocks, name) // 2})
  return blocks


def fit(kernel: str, blocks: BlockSizes, dtype, d: int, dv: int, environ=None) -> BlockSizes:
  """`blocks` with the forward and the backward tiles each shrunk until every launch's estimate
  fits the budget; `blocks` itself when it fits. Raises a one-line ValueError when even 16 x 16
  tiles do not fit."""
  name, limit = budget(environ)
  estimate = lambda b, launches: max(launch_bytes(l, b, dtype, d, dv) for l in launches)
  if estimate(blocks, LAUNCHES) <= limit:
    return blocks
  # The backward's tiles default to the forward's: pin them before the forward shrinks.
  fitted = dataclasses.replace(blocks, block_q_bwd=blocks.bwd_q, block_k_bwd=blocks.bwd_k)
  fitted = _shrink(fitted, "block_q", "block_k", lambda b: estimate(b, ["fwd"]) <= limit)
  if fitted is not None:
    fitted = _shrink(fitted, "block_q_bwd", "block_k_bwd",
                     lambda b: estimate(b, ["dq", "dkdv"]) <= limit)
  if fitted is None:
    smallest = BlockSizes(block_q=MIN_BLOCK, block_k=MIN_BLOCK, num_stages=blocks.num_stages)
    suggest = "implementation='blocked'" + (
        " or bfloat16 inputs" if jnp.dtype(dtype).itemsize > 2 else "")
    raise ValueError(
        f"the {kernel} Triton kernels need ~{estimate(smallest, LAUNCHES)} bytes of shared "
        f"memory even with 16 x 16 tiles for {jnp.dtype(dtype).name}, d={d}, dv={dv}, over the "
        f"{name} budget of {limit} bytes; use {suggest}")
  return fitted
