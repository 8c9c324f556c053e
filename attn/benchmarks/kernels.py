"""Benchmark of the attention kernels against the alternatives (entry point:
experiments/bench_kernel.py).

For each implementation x sequence length x head dim x causal x mode it (1) checks correctness
on the device against the float32 dense reference at a small size, (2) compiles once and reads
the peak temporary memory from the executable's memory analysis, (3) skips the run when that
exceeds the memory budget (recorded as such), (4) times the compiled executable: warm-up, then
the median over repeats cycling through several input sets, with block_until_ready.
FLOPs: dot forward 4·B·H·Tq·Tk·d; additive forward B·H·Tq·Tk·(2·d_attn + 2·dv) (tanh stage plus
the dot stages); both halved when causal; backward 2.5x forward, so fwd_bwd is 3.5x forward.
The matmul peak is a square matmul in the benchmark's dtype timed in the same run.
Imports nothing beyond jax, numpy and the kernels (and, lazily for the plot, matplotlib through
`attn.inspection.plots`, which needs no data extras), so it runs on the GPU machine.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime
import itertools
import math
import os
import platform
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from attn.inspection import plots
from kernels import BlockSizes
from kernels import additive as _additive
from kernels import flash_attention as _flash


@dataclasses.dataclass(frozen=True)
class BenchConfig:
  kernel: str = "dot"  # "dot" (kernels.attention) or "additive" (kernels.additive_attention)
  batch: int = 1
  heads: int = 4
  seq_lens: tuple[int, ...] = (1024, 2048)  # Tq = Tk = T
  head_dims: tuple[int, ...] = (64,)  # d for dot; d_attn for additive
  value_dim: int | None = None  # dv; default: d (dot), 64 (additive)
  dtype: str = "float32"
  causal: tuple[bool, ...] = (False,)
  modes: tuple[str, ...] = ("fwd",)  # "fwd" and/or "fwd_bwd"
  impls: tuple[str, ...] = ("blocked", "naive")
  repeats: int = 5
  warmup: int = 1
  num_inputs: int = 2
  memory_budget_gib: float | None = None  # None: half the free host memory / 90% of the GPU's
  check: bool = True
  block_q: int | None = None
  block_k: int | None = None
  block_d: int | None = None
  outdir: str = "bench_out"
  name: str | None = None  # file stem; default "<kernel>_<backend>"
  plot: bool = True


class Unavailable(Exception):
  """This implementation does not exist on this machine (recorded, not fatal)."""


# ----------------------------------------------------------------------------------------------
# Implementations: build(causal, blocks) -> fn(*inputs) -> out [B, T, H, dv].


def _ours(fn, implementation):
  def build(causal, blocks):
    if implementation == "pallas" and jax.default_backend() == "cpu":
      raise Unavailable("Pallas has only interpret mode on CPU (not a timing)")
    kw = {} if blocks is None else {"block_sizes": blocks}
    return lambda *a: fn(*a, causal=causal, implementation=implementation, **kw)
  return build


def _jax_nn(implementation):
  def build(causal, blocks):
    del blocks
    if implementation == "cudnn" and jax.default_backend() != "gpu":
      raise Unavailable("cuDNN needs a GPU")
    return lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal,
                                                        implementation=implementation)
  return build


def _jax_pallas_triton(causal, blocks):
  del blocks
  if jax.default_backend() != "gpu":
    raise Unavailable("GPU only")
  from jax.experimental.pallas.ops.gpu import attention as jattn  # deprecated for tokamax
  return lambda q, k, v: jattn.mha(q, k, v, None, sm_scale=1 / math.sqrt(q.shape[-1]),
                                   causal=causal)


def _jax_mosaic_gpu(causal, blocks):
  del blocks
  if jax.default_backend() != "gpu":
    raise Unavailable("GPU only (Hopper)")
  from jax.experimental.pallas.ops.gpu import attention_mgpu as mgpu
  config = mgpu.TuningConfig(block_q=64, block_kv=128, max_concurrent_steps=2, causal=causal,
                             block_q_dkv=64, block_kv_dkv=64, block_q_dq=64, block_kv_dq=64)
  return lambda q, k, v: mgpu.attention(q, k, v, config)


def _tokamax(causal, blocks):
  del blocks
  try:
    import tokamax  # pylint: disable=import-outside-toplevel
  except ImportError:
    raise Unavailable("tokamax is not installed") from None
  return lambda q, k, v: tokamax.dot_product_attention(q, k, v, is_causal=causal)


DOT_IMPLS: dict[str, Callable] = {
    "pallas": _ours(_flash.attention, "pallas"),
    "blocked": _ours(_flash.attention, "blocked"),
    "naive": _ours(_flash.attention, "xla"),
    "xla": _jax_nn("xla"),  # jax.nn.dot_product_attention(implementation="xla")
    "cudnn": _jax_nn("cudnn"),
    "jax_triton": _jax_pallas_triton,  # jax.experimental.pallas.ops.gpu.attention.mha
    "jax_mgpu": _jax_mosaic_gpu,  # jax.experimental.pallas.ops.gpu.attention_mgpu
    "tokamax": _tokamax,
}
ADDITIVE_IMPLS: dict[str, Callable] = {
    "pallas": _ours(_additive.additive_attention, "pallas"),
    "blocked": _ours(_additive.additive_attention, "blocked"),
    "naive": _ours(_additive.additive_attention, "xla"),
}
KERNELS = {"dot": DOT_IMPLS, "additive": ADDITIVE_IMPLS}
# The padded Pallas entry (NaN-poisoned outputs) and the dense reference of each kernel.
PALLAS_PADDED = {"dot": _flash.pallas_attention_padded,
                 "additive": _additive.pallas_additive_attention_padded}
REFERENCES = {"dot": _flash.attention_reference, "additive": _additive.additive_attention_reference}


def _inputs(cfg: BenchConfig, T: int, d: int, seed: int, B=None, H=None):
  B, H = B or cfg.batch, H or cfg.heads
  dtype = jnp.dtype(cfg.dtype)
  keys = jax.random.split(jax.random.PRNGKey(seed), 4)
  if cfg.kernel == "dot":
    dv = cfg.value_dim or d
    return (jax.random.normal(keys[0], (B, T, H, d), dtype),
            jax.random.normal(keys[1], (B, T, H, d), dtype),
            jax.random.normal(keys[2], (B, T, H, dv), dtype))
  dv = cfg.value_dim or 64
  return (jax.random.normal(keys[0], (B, T, H, d), dtype),
          jax.random.normal(keys[1], (B, T, H, d), dtype),
          jax.random.normal(keys[2], (H, d), jnp.float32) / math.sqrt(d),
          jax.random.normal(keys[3], (B, T, H, dv), dtype))


def _flops(cfg: BenchConfig, T: int, d: int, causal: bool, mode: str) -> float:
  dv = cfg.value_dim or (d if cfg.kernel == "dot" else 64)
  per_pair = 4 * d if cfg.kernel == "dot" else 2 * d + 2 * dv
  fwd = cfg.batch * cfg.heads * T * T * per_pair / (2 if causal else 1)
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


def _timeit(compiled, arg_sets, *, warmup: int, repeats: int) -> float:
  """Median seconds per call, cycling over the input sets."""
  for n in range(warmup):
    jax.block_until_ready(compiled(*arg_sets[n % len(arg_sets)]))
  times = []
  for n in range(repeats):
    args = arg_sets[n % len(arg_sets)]
    t0 = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    times.append(time.perf_counter() - t0)
  return float(np.median(times))


def matmul_peak_tflops(dtype: str, repeats: int = 5) -> float:
  """TFLOP/s of a square matmul in `dtype` (8192 on accelerators, 2048 on CPU)."""
  n = 2048 if jax.default_backend() == "cpu" else 8192
  a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.dtype(dtype))
  b = jax.random.normal(jax.random.PRNGKey(1), (n, n), jnp.dtype(dtype))
  compiled = jax.jit(lambda a, b: a @ b).lower(a, b).compile()
  t = _timeit(compiled, [(a, b), (b, a)], warmup=2, repeats=repeats)
  return 2 * n ** 3 / t / 1e12


def memory_budget_bytes(cfg: BenchConfig) -> int:
  if cfg.memory_budget_gib is not None:
    return int(cfg.memory_budget_gib * 2 ** 30)
  device = jax.devices()[0]
  if device.platform != "cpu":
    stats = device.memory_stats() or {}
    if "bytes_limit" in stats:
      return int(0.9 * stats["bytes_limit"])
  with open("/proc/meminfo") as f:
    info = dict(line.split(":", 1) for line in f)
  return int(0.5 * int(info["MemAvailable"].split()[0]) * 1024)


def _poison_and_mask_check(cfg: BenchConfig, causal: bool, blocks) -> str:
  """Our Pallas kernels on this device with odd lengths, padding, an empty batch row and
  NaN-poisoned output buffers: every output element written, values equal to the reference."""
  T, B, H, d = 200, 2, 2, cfg.head_dims[0]
  inputs = _inputs(cfg, T, d, seed=5, B=B, H=H)
  kl, ql = jnp.array([T - 3, 0], jnp.int32), jnp.array([150, T], jnp.int32)
  padded_fn, ref_fn = PALLAS_PADDED[cfg.kernel], REFERENCES[cfg.kernel]
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
  tol = {"float32": 1e-4, "bfloat16": 3e-2, "float16": 5e-3}[cfg.dtype]
  if err > tol * max(1.0, float(np.max(np.abs(got)))):
    return f"FAIL (masked err {err:.2g})"
  return "ok"


def _check(cfg: BenchConfig, impl: str, build, causal: bool, blocks, modes) -> str:
  """Compares with the float32 dense reference at T=256 on this device: 'ok' or the error.
  For our Pallas kernels, also the masked, poisoned-buffer check above."""
  impls = KERNELS[cfg.kernel]
  try:
    fn = build(causal, blocks)
  except Unavailable as e:
    return f"unavailable: {e}"
  if impl == "pallas":
    try:
      status = _poison_and_mask_check(cfg, causal, blocks)
    except Exception as e:  # noqa: BLE001
      status = f"error: {type(e).__name__}: {str(e).splitlines()[0][:100]}"
    if status != "ok":
      return status
  ref_fn = impls["naive"](causal, None)
  inputs = _inputs(cfg, 256, cfg.head_dims[0], seed=11, B=1, H=2)
  inputs32 = tuple(x.astype(jnp.float32) for x in inputs)
  tol = {"float32": 1e-4, "bfloat16": 3e-2, "float16": 5e-3}[cfg.dtype]
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
    return f"error: {type(e).__name__}: {str(e).splitlines()[0][:100]}"
  return "ok"


def run_benchmark(cfg: BenchConfig) -> dict:
  """Runs the sweep; returns {"rows": [...], "meta": {...}} and prints a table as it goes."""
  if cfg.kernel not in KERNELS:
    raise ValueError(f"unknown kernel {cfg.kernel!r}; known: {', '.join(KERNELS)}")
  impls = KERNELS[cfg.kernel]
  unknown = [i for i in cfg.impls if i not in impls]
  if unknown:
    raise ValueError(f"unknown implementations {unknown}; known for {cfg.kernel}: "
                     f"{', '.join(impls)}")
  blocks = None
  if cfg.block_q or cfg.block_k or cfg.block_d:
    blocks = BlockSizes(block_q=cfg.block_q or 64, block_k=cfg.block_k or 64,
                        block_d=cfg.block_d)
  peak = matmul_peak_tflops(cfg.dtype)
  budget = memory_budget_bytes(cfg)
  meta = dict(date=datetime.date.today().isoformat(), backend=jax.default_backend(),
              device=str(jax.devices()[0].device_kind), cpu_count=os.cpu_count(),
              jax=jax.__version__, python=platform.python_version(),
              xla_flags=os.environ.get("XLA_FLAGS", ""), peak_tflops=peak,
              budget_gib=budget / 2 ** 30, config=dataclasses.asdict(cfg))
  print(f"# {meta['device']} ({meta['backend']}), jax {meta['jax']}, {cfg.dtype} matmul peak "
        f"{peak:.3f} TFLOP/s, memory budget {budget / 2 ** 30:.1f} GiB", flush=True)
  checks, rows, available = {}, [], []
  for impl in cfg.impls:
    try:
      impls[impl](cfg.causal[0], blocks)
    except Unavailable as e:  # one row says so, instead of a sweep of empty rows
      rows.append(dict(kernel=cfg.kernel, impl=impl, mode="-", causal="-", B=cfg.batch,
                       H=cfg.heads, T="-", d="-", dtype=cfg.dtype, check="-", time_ms=None,
                       tflops=None, pct_peak=None, temp_mib=None, status=f"unavailable: {e}"))
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
      row.update(_measure(cfg, impls[impl], causal, blocks, T, d, mode, peak, budget))
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
    compiled = jax.jit(_with_mode(fn, mode)).lower(*arg_sets[0]).compile()
  except Exception as e:  # noqa: BLE001
    out["status"] = f"error: {type(e).__name__}: {str(e).splitlines()[0][:100]}"
    return out
  analysis = compiled.memory_analysis()
  temp = None if analysis is None else analysis.temp_size_in_bytes
  out["temp_mib"] = None if temp is None else temp / 2 ** 20
  if temp is not None and temp > budget:
    out["status"] = f"not run: needs {temp / 2 ** 30:.1f} GiB > budget {budget / 2 ** 30:.1f} GiB"
    return out
  t = _timeit(compiled, arg_sets, warmup=cfg.warmup, repeats=cfg.repeats)
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


def _fmt(value) -> str:
  if value is None:
    return "-"
  if isinstance(value, float):
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
  return str(value)


def _format_row(row) -> str:
  return " | ".join(_fmt(row.get(c)) for c in COLUMNS)


def markdown_table(rows) -> str:
  header = ("| impl | mode | causal | T | d | time ms | TFLOP/s | % peak | temp MiB | time / naive "
            "| naive mem / mem | check | status |")
  lines = [header, "|" + "---|" * len(COLUMNS)]
  lines += ["| " + _format_row(r) + " |" for r in rows]
  return "\n".join(lines)


def write_outputs(result: dict, cfg: BenchConfig, command: str = "") -> list[str]:
  """CSV, markdown (with the command and machine) and a TFLOP/s-vs-T plot under cfg.outdir."""
  os.makedirs(cfg.outdir, exist_ok=True)
  meta, rows = result["meta"], result["rows"]
  stem = os.path.join(cfg.outdir, cfg.name or f"{cfg.kernel}_{meta['backend']}")
  with open(stem + ".csv", "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else list(COLUMNS))
    writer.writeheader()
    writer.writerows(rows)
  with open(stem + ".md", "w") as f:
    f.write(f"Command: `{command}`\n\n"
            f"Machine: {meta['device']} ({meta['backend']}, {meta['cpu_count']} CPU cores), "
            f"jax {meta['jax']}, Python {meta['python']}, XLA_FLAGS=`{meta['xla_flags']}`, "
            f"{meta['date']}. {cfg.dtype} matmul peak {meta['peak_tflops']:.3f} TFLOP/s; "
            f"B={cfg.batch}, H={cfg.heads}.\n\n{markdown_table(rows)}\n")
  written = [stem + ".csv", stem + ".md"]
  if cfg.plot and any(r["tflops"] for r in rows):
    try:
      plt = plots.pyplot()
    except ImportError:  # matplotlib absent: the CSV and markdown still stand
      return written
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
    fig.savefig(stem + ".png", dpi=120)
    plt.close(fig)
    written.append(stem + ".png")
  return written
