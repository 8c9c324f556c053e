"""The one benchmark harness: timing (warm-up, then the median over timed calls, each ended by
block_until_ready), memory from XLA's compiled memory analysis, the bare-matmul rate measured in
the same run, and the machine a figure was taken on. Needs jax alone (no flax, no data
libraries), so the kernel benchmark runs on an accelerator machine with nothing else installed.

    compiled = harness.compile(step, state, batch)        # nothing is timed while compiling
    mem = harness.memory(compiled)                        # Memory(temp, arguments, outputs)
    seconds = harness.median_seconds(compiled, [(state, batch)], warmup=1, repeats=5)

XLA CPU's YNNPACK fusion reports no temporaries for attention above T~2.9k: memory figures on CPU
need `disable_cpu_ynn_fusion()` before the backend starts (the first computation).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp

from attn.common import cpu

MIB = 2.0 ** 20
GIB = 2.0 ** 30
# Without it XLA CPU's YNNPACK fusion hides attention temporaries from the memory analysis.
NO_YNN_FUSION = "--xla_cpu_experimental_ynn_fusion_type="


def disable_cpu_ynn_fusion() -> None:
  """Adds NO_YNN_FUSION to XLA_FLAGS; takes effect if the backend has not started yet."""
  flags_ = os.environ.get("XLA_FLAGS", "")
  if NO_YNN_FUSION not in flags_.split():
    os.environ["XLA_FLAGS"] = (flags_ + " " + NO_YNN_FUSION).strip()


# ----------------------------------------------------------------------------------------------
# Timing.


class TooSlow(Exception):
  """The first call alone took longer than the limit: the rest is not timed."""

  def __init__(self, seconds: float, limit: float):
    super().__init__(f"first call took {seconds:.0f} s > {limit:g} s")
    self.seconds, self.limit = seconds, limit


def timed_call(fn: Callable, *args, clock: Callable[[], float] = time.perf_counter):
  """(fn(*args), seconds until its outputs are ready)."""
  t0 = clock()
  out = jax.block_until_ready(fn(*args))
  return out, clock() - t0


def call_times(fn: Callable, arg_sets: Sequence[tuple], *, warmup: int = 1, repeats: int = 5,
               first_limit: float | None = None,
               clock: Callable[[], float] = time.perf_counter) -> list[float]:
  """Seconds of each of `repeats` calls of fn, after `warmup` untimed ones, cycling through
  `arg_sets` (several input sets: no call sees the inputs of the one before in cache). TooSlow
  when the first warm-up call alone exceeds `first_limit` seconds."""
  if not arg_sets:
    raise ValueError("call_times needs at least one argument set")
  for n in range(warmup):
    _, seconds = timed_call(fn, *arg_sets[n % len(arg_sets)], clock=clock)
    if n == 0 and first_limit is not None and seconds > first_limit:
      raise TooSlow(seconds, first_limit)
  return [timed_call(fn, *arg_sets[n % len(arg_sets)], clock=clock)[1] for n in range(repeats)]


def median_seconds(fn: Callable, arg_sets: Sequence[tuple], **kw) -> float:
  """The median of `call_times(fn, arg_sets, **kw)`: seconds per call."""
  return float(statistics.median(call_times(fn, arg_sets, **kw)))


# ----------------------------------------------------------------------------------------------
# Memory.


@dataclasses.dataclass(frozen=True)
class Memory:
  """Bytes of a compiled executable, from XLA's memory analysis: temporaries (activations,
  intermediates), arguments and outputs."""
  temp: int
  arguments: int
  outputs: int

  @property
  def peak(self) -> int:
    """Temporaries + arguments + outputs: what the call needs at once, at most."""
    return self.temp + self.arguments + self.outputs


def compile(fn: Callable, *args):  # pylint: disable=redefined-builtin
  """fn (jitted unless it is already) lowered for `args` (arrays or ShapeDtypeStructs) and
  compiled: nothing runs."""
  jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
  return jitted.lower(*args).compile()


def memory(compiled) -> Memory | None:
  """The compiled executable's Memory, or None where the backend gives no analysis."""
  m = compiled.memory_analysis()
  if m is None:
    return None
  return Memory(int(m.temp_size_in_bytes), int(m.argument_size_in_bytes),
                int(m.output_size_in_bytes))


def memory_budget_bytes(gib: float | None = None) -> int:
  """`gib` GiB; by default 90% of an accelerator's memory, or half the free host memory."""
  if gib is not None:
    return int(gib * GIB)
  device = jax.devices()[0]
  if device.platform != "cpu":
    stats = device.memory_stats() or {}
    if "bytes_limit" in stats:
      return int(0.9 * stats["bytes_limit"])
  with open("/proc/meminfo", encoding="utf-8") as f:
    info = dict(line.split(":", 1) for line in f)
  return int(0.5 * int(info["MemAvailable"].split()[0]) * 1024)


# ----------------------------------------------------------------------------------------------
# The ceiling and the machine.


def matmul_flops_per_second(n: int, dtype, *, accumulate=None, warmup: int = 1,
                            repeats: int = 7) -> float:
  """FLOP/s of a jitted n x n matmul with `dtype` operands (2 n^3 per call; the median over two
  input sets, passed as arguments: closed-over arrays would be folded as constants). accumulate:
  the output dtype (e.g. float32 for bfloat16 operands); default the operands'."""
  a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32).astype(dtype)
  b = jax.random.normal(jax.random.PRNGKey(1), (n, n), jnp.float32).astype(dtype)
  matmul = jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=accumulate))
  seconds = median_seconds(compile(matmul, a, b), [(a, b), (b, a)], warmup=warmup,
                           repeats=repeats)
  return 2 * n ** 3 / seconds


def loadavg() -> str:
  """The 1/5/15-minute load averages (on a shared machine every figure goes with them)."""
  try:
    with open("/proc/loadavg", encoding="utf-8") as f:
      return " ".join(f.read().split()[:3])
  except OSError:
    return "n/a"


UNKNOWN = "unknown"
AMX_FLAGS = ("amx_tile", "amx_bf16", "amx_int8")


def cpu_info(cpuinfo: str | None = None) -> dict:
  """{"model": the CPU's model name, "avx512_bf16": bool, "amx": bool}, read from /proc/cpuinfo
  (or from `cpuinfo`, that file's text). Whether the CPU has AVX512_BF16 and AMX decides what a
  bfloat16 figure means. Where the text cannot be read (not Linux) each value is "unknown"; a
  model line that is missing alone reads "unknown", its flags are still read."""
  fields = cpu.cpuinfo_fields(cpuinfo)
  if fields is None:
    return {"model": UNKNOWN, "avx512_bf16": UNKNOWN, "amx": UNKNOWN}
  model = fields.get("model name") or UNKNOWN
  flags = fields.get("flags", fields.get("Features"))  # Features: arm64's name
  if flags is None:
    return {"model": model, "avx512_bf16": UNKNOWN, "amx": UNKNOWN}
  flags = set(flags.split())
  return {"model": model, "avx512_bf16": "avx512_bf16" in flags,
          "amx": any(f in flags for f in AMX_FLAGS)}


def cpu_line(info: dict | None = None) -> str:
  """One line for a benchmark's printed header, e.g. `CPU: Intel(R) Xeon(R) Processor
  (avx512_bf16: yes, amx: yes)`."""
  info = cpu_info() if info is None else info
  said = lambda v: v if isinstance(v, str) else ("yes" if v else "no")
  return f"CPU: {info['model']} (avx512_bf16: {said(info['avx512_bf16'])}, amx: {said(info['amx'])})"


def _cpu_model() -> str:
  """The CPU's model name (Linux /proc/cpuinfo; platform.processor() is often empty there)."""
  model = cpu_info()["model"]
  return model if model != UNKNOWN else (platform.processor() or platform.machine())


def machine() -> dict:
  """Where and when a figure was taken: date, platform, CPU (its model and whether it has
  AVX512_BF16 and AMX: cpu_info()), versions, device, XLA_FLAGS."""
  return {"date": datetime.datetime.now().isoformat(timespec="seconds"),
          "platform": platform.platform(), "processor": _cpu_model(), "cpu": cpu_info(),
          "cpu_count": os.cpu_count(), "python": platform.python_version(),
          "jax": jax.__version__, "backend": jax.default_backend(),
          "device": str(jax.devices()[0].device_kind),
          "xla_flags": os.environ.get("XLA_FLAGS", "")}
