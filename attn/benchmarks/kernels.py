"""Benchmark of the attention kernels against the alternatives (entry point:
experiments/bench_kernel.py; the implementations and each kernel's facts: kernel_impls.py).

For each implementation x sequence length x head dim x causal x mode it (1) checks correctness
on the device against the float32 dense reference at a small size, (2) compiles once and reads
the peak temporary memory from the executable's memory analysis, (3) skips the run when that
exceeds the memory budget (recorded as such), (4) times the compiled executable: warm-up, then
the median over repeats cycling through several input sets, with block_until_ready (the timing
and memory figures come from attn.benchmarks.harness).
FLOPs: dot forward 4·B·H·Tq·Tk·d; additive forward B·H·Tq·Tk·(2·d_attn + 2·dv) (tanh stage plus
the dot stages); both halved when causal; backward 2.5x forward, so fwd_bwd is 3.5x forward.
The matmul peak is a square matmul in the benchmark's dtype timed in the same run.
Imports nothing beyond jax, numpy and the kernels (and, lazily for the plot, matplotlib through
`attn.common.plots`, which needs no data extras), so it runs on the GPU machine.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import itertools
import os
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from attn.benchmarks import harness
from attn.benchmarks.kernel_impls import KERNELS, BenchImpl, Unavailable
from attn.common.files import atomic_path, write_text
from attn.common.tables import markdown_table as _markdown_table
from attn.config.configurable import option
from attn.errors import ConfigError
from attn.common import plots
from kernels import BlockSizes

MODES = ("fwd", "fwd_bwd")
# Relative tolerance against the float32 reference, per input dtype (the keys: the dtypes run).
TOLERANCE = {"float32": 1e-4, "bfloat16": 3e-2, "float16": 5e-3}


@dataclasses.dataclass(frozen=True)
class BenchConfig:
  """A kernel benchmark sweep (experiments/bench_kernel.py's flags, one for one)."""
  kernel: str = option("dot", "dot: kernels.attention; additive: kernels.additive_attention.")
  batch: int = option(1, "Batch size B.")
  heads: int = option(4, "Heads H.")
  seq_lens: tuple[int, ...] = option((1024, 2048), "Sequence lengths T (Tq = Tk).")
  head_dims: tuple[int, ...] = option((64,), "Head dims d (dot) or d_attn (additive).")
  value_dim: int | None = option(None, "dv; default d (dot) or 64 (additive).")
  dtype: str = option("float32", f"Input dtype: {', '.join(TOLERANCE)}.")
  causal: tuple[bool, ...] = option((False,), "Causal settings to sweep (true/false).")
  modes: tuple[str, ...] = option(("fwd",), "fwd and/or fwd_bwd.")
  impls: tuple[str, ...] = option(("blocked", "naive"),
                                  "dot: pallas, pallas_mosaic, pallas_mosaic_ws, blocked, "
                                  "naive, xla, cudnn, jax_triton, jax_mgpu, tokamax; additive: "
                                  "pallas, blocked, naive.")
  repeats: int = option(5, "Timed calls (median reported).")
  repeats_per_len: tuple[int, ...] = option((), "Timed calls per --seq_lens entry, in its order "
                                            "(fewer where one call is long); default --repeats.")
  warmup: int = option(1, "Untimed calls first.")
  num_inputs: int = option(2, "Distinct input sets cycled through.")
  memory_budget_gib: float | None = option(None, "Skip runs whose compiled temporaries exceed "
                                           "this (default: half the free host memory, 90% of a "
                                           "GPU's).")
  check: bool = option(True, "Check each implementation against the dense reference first.")
  block_q: int | None = option(None, "Query tile (default: the kernel's).")
  block_k: int | None = option(None, "Key tile.")
  block_d: int | None = option(None, "d_attn slice of the additive tanh tile.")
  outdir: str = option("bench_out", "Output directory.")
  name: str | None = option(None, "File stem (default <kernel>_<backend>).")
  plot: bool = option(True, "Write the TFLOP/s-vs-T plot.")

  def __post_init__(self):
    if self.kernel not in KERNELS:
      raise ConfigError(f"--kernel={self.kernel}: unknown; known: {', '.join(KERNELS.names())}")
    spec = KERNELS.get(self.kernel)
    unknown = [i for i in self.impls if i not in spec.impls]
    if unknown:
      raise ConfigError(f"--impls: unknown implementations {unknown}; known for {self.kernel}: "
                        f"{', '.join(spec.impls)}")
    bad_modes = sorted(set(self.modes) - set(MODES))
    if bad_modes:
      raise ConfigError(f"--modes takes fwd and/or fwd_bwd, got {bad_modes}")
    if self.dtype not in TOLERANCE:
      raise ConfigError(f"--dtype={self.dtype}: expects one of {', '.join(TOLERANCE)}")
    if self.repeats_per_len and len(self.repeats_per_len) != len(self.seq_lens):
      raise ConfigError(f"--repeats_per_len has {len(self.repeats_per_len)} values for "
                        f"{len(self.seq_lens)} --seq_lens")
    if not (self.seq_lens and self.head_dims and self.causal and self.modes):
      raise ConfigError("--seq_lens, --head_dims, --causal and --modes need a value each")
    try:
      self.blocks  # pylint: disable=pointless-statement  # BlockSizes checks the tiles itself
    except ValueError as e:  # its message names the field: say the flag
      raise ConfigError(str(e).replace("BlockSizes.", "--")) from None

  def repeats_at(self, T: int) -> int:
    """Timed calls at sequence length T."""
    if not self.repeats_per_len:
      return self.repeats
    return self.repeats_per_len[self.seq_lens.index(T)]

  @property
  def spec(self) -> BenchImpl:
    return KERNELS.get(self.kernel)

  @property
  def blocks(self) -> BlockSizes | None:
    """The tiles the flags ask for, or None: each kernel's own."""
    if self.block_q is None and self.block_k is None and self.block_d is None:
      return None
    default = lambda v: 64 if v is None else v  # (0 is a tile size to refuse, not the default)
    return BlockSizes(block_q=default(self.block_q), block_k=default(self.block_k),
                      block_d=self.block_d)


def _value_dim(cfg: BenchConfig, d: int) -> int:
  return cfg.value_dim or cfg.spec.value_dim(d)


def _inputs(cfg: BenchConfig, T: int, d: int, seed: int, B=None, H=None):
  keys = jax.random.split(jax.random.PRNGKey(seed), 4)
  return cfg.spec.inputs(keys, B or cfg.batch, T, H or cfg.heads, d, _value_dim(cfg, d),
                         jnp.dtype(cfg.dtype))


def _flops(cfg: BenchConfig, T: int, d: int, causal: bool, mode: str) -> float:
  fwd = cfg.batch * cfg.heads * T * T * cfg.spec.pair_flops(d, _value_dim(cfg, d))
  fwd /= 2 if causal else 1
  return fwd * (3.5 if mode == "fwd_bwd" else 1.0)


def _with_mode(fn, mode: str):
  """fwd: fn itself; fwd_bwd: forward plus the vjp of every input (cotangent passed in)."""
  if mode == "fwd":
    return lambda args, ct: fn(*args)

  def fwd_bwd(args, ct):
    out, vjp = jax.vjp(fn, *args)
    return out, vjp(ct.astype(out.dtype))
  return fwd_bwd


def _cotangent(inputs, fn):
  shape = jax.eval_shape(fn, *inputs)
  return jax.random.normal(jax.random.PRNGKey(7), shape.shape, jnp.float32)


# ----------------------------------------------------------------------------------------------
# Measurements.


def matmul_peak_tflops(dtype: str, repeats: int = 5) -> float:
  """TFLOP/s of a square matmul in `dtype` (8192 on accelerators, 2048 on CPU)."""
  n = 2048 if jax.default_backend() == "cpu" else 8192
  return harness.matmul_flops_per_second(n, jnp.dtype(dtype), warmup=2, repeats=repeats) / 1e12


def _poison_and_mask_check(cfg: BenchConfig, causal: bool, blocks) -> str:
  """Our Pallas kernels on this device with odd lengths, padding, an empty batch row and
  NaN-poisoned output buffers: every output element written, values equal to the reference."""
  T, B, H, d = 200, 2, 2, cfg.head_dims[0]
  inputs = _inputs(cfg, T, d, seed=5, B=B, H=H)
  kl, ql = jnp.array([T - 3, 0], jnp.int32), jnp.array([150, T], jnp.int32)
  padded_fn, ref_fn = cfg.spec.padded, cfg.spec.reference
  # block_sizes=None: the kernel's own GPU tiles.
  padded = lambda *a: padded_fn(*a, key_lengths=kl, query_lengths=ql, causal=causal,
                                block_sizes=blocks, interpret=False, poison=True)
  ref = ref_fn(*inputs, key_lengths=kl, query_lengths=ql, causal=causal)
  (out, lse), vjp = jax.vjp(padded, *inputs)
  grads = vjp((jnp.ones_like(out), jnp.zeros_like(lse)))
  for name, x in [("out", out), ("lse", lse)] + [(f"grad{n}", g) for n, g in enumerate(grads)]:
    if bool(jnp.any(jnp.isnan(x.astype(jnp.float32)))):
      return f"FAIL (unwritten elements in {name})"
  got = np.asarray(out[:, :T, :, :ref.shape[-1]], np.float32)
  err = float(np.max(np.abs(got - np.asarray(ref, np.float32))))
  if err > TOLERANCE[cfg.dtype] * max(1.0, float(np.max(np.abs(got)))):
    return f"FAIL (masked err {err:.2g})"
  return "ok"


def _error(e: Exception) -> str:
  return f"error: {type(e).__name__}: {str(e).splitlines()[0][:100]}"


def _check(cfg: BenchConfig, impl: str, build, causal: bool, blocks, modes) -> str:
  """Compares with the float32 dense reference at T=256 on this device: 'ok' or the error.
  For our Pallas kernels, also the masked, poisoned-buffer check above."""
  try:
    fn = build(causal, blocks)
  except Unavailable as e:
    return f"unavailable: {e}"
  if impl == "pallas":
    try:
      status = _poison_and_mask_check(cfg, causal, blocks)
    except Exception as e:  # noqa: BLE001
      status = _error(e)
    if status != "ok":
      return status
  ref_fn = cfg.spec.impls["naive"](causal, None)
  inputs = _inputs(cfg, 256, cfg.head_dims[0], seed=11, B=1, H=2)
  inputs32 = tuple(x.astype(jnp.float32) for x in inputs)
  tol = TOLERANCE[cfg.dtype]
  try:
    for mode in modes:
      ct = _cotangent(inputs, fn)
      got = jax.jit(_with_mode(fn, mode))(inputs, ct)
      want = jax.jit(_with_mode(ref_fn, mode))(inputs32, ct)
      for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
        err = float(np.max(np.abs(g - w))) / max(1.0, float(np.max(np.abs(w))))
        if not np.isfinite(err) or err > tol:
          return f"FAIL ({mode}: rel err {err:.2g} > {tol})"
  except Exception as e:  # noqa: BLE001  (a failing competitor is recorded, not fatal)
    return _error(e)
  return "ok"


def _unavailable_row(cfg: BenchConfig, impl: str, why: Unavailable) -> dict:
  """One row saying an implementation does not exist here, instead of a sweep of empty rows."""
  return dict(kernel=cfg.kernel, impl=impl, mode="-", causal="-", B=cfg.batch, H=cfg.heads,
              T="-", d="-", dtype=cfg.dtype, check="-", time_ms=None, tflops=None,
              pct_peak=None, temp_mib=None, status=f"unavailable: {why}")


def run_benchmark(cfg: BenchConfig) -> dict:
  """Runs the sweep; returns {"rows": [...], "meta": {...}} and prints a table as it goes."""
  impls, blocks = cfg.spec.impls, cfg.blocks
  peak = matmul_peak_tflops(cfg.dtype)
  budget = harness.memory_budget_bytes(cfg.memory_budget_gib)
  meta = dict(harness.machine(), peak_tflops=peak, budget_gib=budget / 2 ** 30,
              config=dataclasses.asdict(cfg))
  print(f"# {meta['device']} ({meta['backend']}), jax {meta['jax']}, {cfg.dtype} matmul peak "
        f"{peak:.3f} TFLOP/s, memory budget {budget / 2 ** 30:.1f} GiB", flush=True)
  print(f"# {harness.cpu_line(meta['cpu'])}", flush=True)
  checks, rows, available = {}, [], []
  for impl in cfg.impls:
    try:
      impls[impl](cfg.causal[0], blocks)
    except Unavailable as e:
      rows.append(_unavailable_row(cfg, impl, e))
      print(_format_row(rows[-1]), flush=True)
      continue
    available.append(impl)
    for causal in cfg.causal:
      if cfg.check:
        checks[impl, causal] = _check(cfg, impl, impls[impl], causal, blocks, cfg.modes)
        print(f"check {impl:<10} causal={causal!s:<5} {checks[impl, causal]}", flush=True)
  # Implementations innermost: on a shared machine, neighbours in time see the same load.
  for causal, d, T, mode in itertools.product(cfg.causal, cfg.head_dims, cfg.seq_lens,
                                              cfg.modes):
    for impl in available:
      row = dict(kernel=cfg.kernel, impl=impl, mode=mode, causal=causal, B=cfg.batch,
                 H=cfg.heads, T=T, d=d, dtype=cfg.dtype,
                 check=checks.get((impl, causal), "not run"))
      try:
        row.update(_measure(cfg, impls[impl], causal, blocks, T, d, mode, peak, budget))
      except Exception as e:  # noqa: BLE001  (e.g. out of memory at run time: a row, not a crash)
        row.update(time_ms=None, tflops=None, pct_peak=None, temp_mib=None, status=_error(e))
      rows.append(row)
      print(_format_row(row), flush=True)
  _add_ratios(rows)
  return {"rows": rows, "meta": meta}


def _measure(cfg, build, causal, blocks, T, d, mode, peak, budget) -> dict:
  out = dict(time_ms=None, tflops=None, pct_peak=None, temp_mib=None, status="")
  try:
    fn = build(causal, blocks)
  except Unavailable as e:
    out["status"] = f"unavailable: {e}"
    return out
  arg_sets = [_inputs(cfg, T, d, seed=s) for s in range(max(1, cfg.num_inputs))]
  ct = _cotangent(arg_sets[0], fn)
  arg_sets = [(args, ct) for args in arg_sets]
  try:
    compiled = harness.compile(_with_mode(fn, mode), *arg_sets[0])
  except Exception as e:  # noqa: BLE001
    out["status"] = _error(e)
    return out
  mem = harness.memory(compiled)
  temp = None if mem is None else mem.temp
  out["temp_mib"] = None if temp is None else temp / harness.MIB
  if temp is not None and temp > budget:
    out["status"] = f"not run: needs {temp / 2 ** 30:.1f} GiB > budget {budget / 2 ** 30:.1f} GiB"
    return out
  t = harness.median_seconds(compiled, arg_sets, warmup=cfg.warmup, repeats=cfg.repeats_at(T))
  tflops = _flops(cfg, T, d, causal, mode) / t / 1e12
  out.update(time_ms=t * 1e3, tflops=tflops, pct_peak=100 * tflops / peak, status="ran")
  return out


def _add_ratios(rows):
  """time and memory relative to "naive" at the same point (where both exist)."""
  key = lambda r: (r["mode"], r["causal"], r["T"], r["d"])
  naive = {key(r): r for r in rows if r["impl"] == "naive"}
  for r in rows:
    n = naive.get(key(r))
    r["time_vs_naive"] = (r["time_ms"] / n["time_ms"]
                          if n and r["time_ms"] and n["time_ms"] else None)
    r["naive_mem_ratio"] = (n["temp_mib"] / r["temp_mib"]
                            if n and r["temp_mib"] and n["temp_mib"] is not None else None)


# ----------------------------------------------------------------------------------------------
# Output.

COLUMNS = ("impl", "mode", "causal", "T", "d", "time_ms", "tflops", "pct_peak", "temp_mib",
           "time_vs_naive", "naive_mem_ratio", "check", "status")
HEADER = ("impl", "mode", "causal", "T", "d", "time ms", "TFLOP/s", "% peak", "temp MiB",
          "time / naive", "naive mem / mem", "check", "status")


def _fmt(value) -> str:
  if value is None:
    return "-"
  if isinstance(value, float):
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
  return str(value)


def _format_row(row) -> str:
  return " | ".join(_fmt(row.get(c)) for c in COLUMNS)


def markdown_table(rows) -> str:
  """The results as a markdown table (attn.common.tables), three significant digits."""
  return _markdown_table(HEADER, [[row.get(c) for c in COLUMNS] for row in rows], fmt=_fmt)


def _csv(rows) -> str:
  buf = io.StringIO()
  writer = csv.DictWriter(buf, fieldnames=list(rows[0]) if rows else list(COLUMNS))
  writer.writeheader()
  writer.writerows(rows)
  return buf.getvalue()


def _plot(rows, cfg: BenchConfig, meta: dict, path: str) -> bool:
  """TFLOP/s against T, one line per implementation, mode, d and causality; False without
  matplotlib (the CSV and markdown still stand)."""
  try:
    plt = plots.pyplot()
  except ImportError:
    return False
  fig, ax = plt.subplots(figsize=(7, 4.5))
  series = {}
  for r in rows:
    if r["tflops"]:
      label = f"{r['impl']} {r['mode']} d={r['d']}" + (" causal" if r["causal"] else "")
      series.setdefault(label, []).append((r["T"], r["tflops"]))
  for label, pts in sorted(series.items()):
    pts.sort()
    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
  ax.set_xscale("log", base=2)
  ax.set_xlabel("sequence length T")
  ax.set_ylabel("TFLOP/s")
  ax.set_title(f"{cfg.kernel} attention, {cfg.dtype}, {meta['device']}")
  ax.grid(True, alpha=0.3)
  ax.legend(fontsize=7)
  fig.tight_layout()
  with atomic_path(path, suffix=".png") as tmp:
    fig.savefig(tmp, dpi=120, format="png")
  plt.close(fig)
  return True


def write_outputs(result: dict, cfg: BenchConfig, command: str = "") -> list[str]:
  """CSV, markdown (with the command and machine) and a TFLOP/s-vs-T plot under cfg.outdir,
  each written atomically."""
  os.makedirs(cfg.outdir, exist_ok=True)
  meta, rows = result["meta"], result["rows"]
  stem = os.path.join(cfg.outdir, cfg.name or f"{cfg.kernel}_{meta['backend']}")
  write_text(stem + ".csv", _csv(rows))
  write_text(stem + ".md",
             f"Command: `{command}`\n\n"
             f"Machine: {meta['device']} ({meta['backend']}, {meta['cpu_count']} CPU cores), "
             f"{harness.cpu_line(meta['cpu'])}, "
             f"jax {meta['jax']}, Python {meta['python']}, XLA_FLAGS=`{meta['xla_flags']}`, "
             f"{meta['date']}. {cfg.dtype} matmul peak {meta['peak_tflops']:.3f} TFLOP/s; "
             f"B={cfg.batch}, H={cfg.heads}.\n\n{markdown_table(rows)}\n")
  written = [stem + ".csv", stem + ".md"]
  if cfg.plot and any(r["tflops"] for r in rows) and _plot(rows, cfg, meta, stem + ".png"):
    written.append(stem + ".png")
  return written
