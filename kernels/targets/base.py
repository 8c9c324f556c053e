"""`Target`, what runs a fused kernel on one platform, and `TARGETS`, the registry of them.

A target holds everything that differs between platforms, so a kernel (`kernels/_skeleton.py`
`FusedKernel`) holds only what differs between kernels: its launch builder (grid, BlockSpecs and
compiler params of every pallas_call a kernel describes as a `kernels.launch.Call`), its default
tiles per kernel, the platforms it is lowered for, and what it can run (kernels, dtypes, head
dims: anything else is a one-line ValueError before tracing).

Tiles and launch come from the same entry: a compiled call with target "auto" switches between
the targets of each platform with `lax.platform_dependent` around the whole padded run, so a
`jax.export` for "tpu" from a CPU host gets the TPU tiles and the TPU launch together.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from kernels._common import MAX_HEAD_DIM, SUPPORTED_DTYPES, BlockSizes

AUTO = "auto"


@dataclasses.dataclass(frozen=True, eq=False)  # eq=False: hashed by identity (a static argument)
class Target:
  """One way to run the fused kernels.

  name: the registry name (`kernels.attention(..., target=name)`).
  implementation: "pallas" (the Pallas kernels) or "blocked" (the pure-JAX blocked path).
  blocks: kernel name (`FusedKernel.name`) -> default tiles; a kernel missing here is refused.
  launch: launch(call, inputs, cfg) -> outputs, the Pallas launch builder (None for "blocked").
  platforms: the platforms it is compiled for ("cuda", "tpu", ...); () runs wherever it is
    traced (interpreters, the blocked path).
  auto: target "auto" picks it for its platforms (one per platform).
  interpret: pallas_call's `interpret` (False compiled; True or interpreter params).
  interpreted: the target that runs this launch in an interpreter (chosen with interpret=True,
    or interpret=None on a CPU host), or None.
  forwards: kernel name -> forward replacing the kernel's own Pallas forward, with its
    signature plus `fallback=` (the kernel's forward); e.g. Mosaic GPU's.
  dtypes: input dtypes it runs. max_head_dim: widest head dim (None: any).
  fit: fit(kernel, blocks, dtype, d, dv) -> the tiles `blocks` shrunk to fit the platform's
    on-chip memory for these inputs (ValueError when none do), or None: the tiles as they are.
  summary: one line for the docs' table of targets.
  """
  name: str
  implementation: str
  blocks: Mapping[str, BlockSizes]
  launch: Callable | None = None
  platforms: tuple[str, ...] = ()
  auto: bool = False
  interpret: Any = False
  interpreted: str | None = None
  forwards: Mapping[str, Callable] = dataclasses.field(default_factory=dict)
  dtypes: tuple = SUPPORTED_DTYPES
  max_head_dim: int | None = MAX_HEAD_DIM
  fit: Callable | None = None
  summary: str = ""

  def tiles(self, kernel: str, *, dtype=None, d: int | None = None,
            dv: int | None = None) -> BlockSizes:
    """The default tiles of `kernel` on this target; given the input dtype and the q/k and v
    head dims (d, dv), those of them that fit its on-chip memory (`fit`; a one-line ValueError
    when none do)."""
    blocks = self.blocks[kernel]
    if self.fit is None or dtype is None:
      return blocks
    return self.fit(kernel, blocks, dtype, d, dv)

  def check(self, kernel, q, v) -> None:
    """Raises a one-line ValueError unless this target runs `kernel` (a `FusedKernel`) on
    q [B, Tq, H, d] and v [B, Tk, H, dv]."""
    if kernel.name not in self.blocks:
      runs = [t.name for t in TARGETS.values() if kernel.name in t.blocks]
      raise ValueError(f"target {self.name!r} does not run the {kernel.name} kernel; targets "
                       f"that do: {', '.join(runs)}")
    if q.dtype not in self.dtypes:
      raise ValueError(f"target {self.name!r} runs {', '.join(str(d) for d in self.dtypes)}, "
                       f"got {q.dtype}")
    d, dv = q.shape[-1], v.shape[-1]
    limit = self.max_head_dim
    if limit is not None and (dv > limit or (kernel.limits_qk_width and d > limit)):
      what = "head dims" if kernel.limits_qk_width else "value head dims"
      raise ValueError(f"the {kernel.name} Pallas kernel supports {what} up to {limit}, got "
                       f"d={d}, dv={dv}; use implementation='blocked'")


class Registry:
  """Targets by name: a name registers once, an unknown name fails with the known ones."""

  def __init__(self):
    self._entries: dict[str, Target] = {}

  def add(self, target: Target) -> Target:
    if target.name in self._entries or target.name == AUTO:
      raise ValueError(f"target {target.name!r} is already registered")
    self._entries[target.name] = target
    return target

  def remove(self, name: str) -> None:
    """Forgets `name` (tests that register a throwaway target clean up with it)."""
    self._entries.pop(name, None)

  def get(self, name: str) -> Target:
    if name not in self._entries:
      raise ValueError(f"unknown target {name!r}; known: {', '.join((AUTO, *self.names()))}")
    return self._entries[name]

  def names(self) -> list[str]:
    return list(self._entries)

  def values(self) -> list[Target]:
    return list(self._entries.values())

  def auto(self, implementation: str) -> dict[str, Target]:
    """platform -> the target "auto" compiles for it, for this implementation."""
    return {p: t for t in self.values() if t.auto and t.implementation == implementation
            for p in t.platforms}


TARGETS = Registry()
