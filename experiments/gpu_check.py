r"""The device check for the day a GPU is lent: correctness of both fused kernels on the device,
then the speed table against cuDNN, XLA and JAX's own Pallas GPU attention.

    python -m experiments.gpu_check --out=$OUT        # on a GPU: under 8 minutes on an H200
    python -m experiments.gpu_check --dry_run          # on CPU: the same flow, tiny, interpret mode

(a) Correctness: kernels.attention and kernels.additive_attention (implementation="pallas",
compiled; interpret mode in the dry run), bf16 and f32, d 64 and 128, odd lengths, padded keys
and queries, a batch row with no keys, causal, forward (out, lse) and every gradient; on Hopper
also kernels.attention with target="mosaic_gpu" (its Mosaic GPU forward, bf16; in the dry run
through the Mosaic GPU interpreter) and, on Hopper only, the warp-specialized "mosaic_gpu_ws"
with key tiles 128, 64 and 256 (MOSAIC_VARIANTS; timed as pallas_mosaic_ws); all against the
float64 NumPy references with the kernel tests' tolerance rule (tests/kernel_cases.py: at most
twice the dense "xla" implementation's error on the same device, plus a floor). One line per case;
any failure makes the exit status 1 (after the table is still written).
(b) Speed: attn.benchmarks.kernels at B=4, H=16, d=128, bf16, T = 1k..16k, fwd and fwd_bwd, one
sweep with fewer repeats at large T; a peer that fails is a row with a one-line status. Writes
<out>/gpu_check.md (the table for docs/benchmarks.md), .csv and correctness.txt.
Imports jax, numpy, absl and this repository only (no flax, tfds, grain or pytest).
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from attn.benchmarks import kernels as bench
from attn.common.files import write_text
from attn.config.configurable import option
from attn.errors import ConfigError
from attn.launching import cli
from kernels import additive as aa
from kernels import flash_attention as fa
from tests import kernel_cases as kc  # jax and numpy only: the tests' references and tolerances

# (T, repeats): fewer timed calls where one call is long, to fit the 8-minute budget.
GPU_SWEEP = ((1024, 10), (2048, 10), (4096, 5), (8192, 3), (16384, 2))
DRY_SWEEP = ((64, 1), (128, 1))
PEERS = ("pallas", "pallas_mosaic", "cudnn", "xla", "jax_triton")
# Part (a)'s kernels: (the kernel whose inputs and reference apply, options of its pallas run).
# dot_mosaic is the dot kernel's Mosaic GPU forward (Hopper) with its Triton backward;
# MOSAIC_VARIANTS its other schedule and key tiles (on Hopper only; the dry run keeps dot_mosaic).
MOSAIC_VARIANTS = {"dot_mosaic_ws": ("dot", {"target": "mosaic_gpu_ws"}),
                   "dot_mosaic_ws_k64": ("dot", {"target": "mosaic_gpu_ws", "block_k": 64}),
                   "dot_mosaic_ws_k256": ("dot", {"target": "mosaic_gpu_ws", "block_k": 256})}
KERNEL_RUNS = {"dot": ("dot", {}), "dot_mosaic": ("dot", {"target": "mosaic_gpu"}),
               **MOSAIC_VARIANTS, "additive": ("additive", {})}
HOPPER_PEERS = ("pallas_mosaic_ws",)  # timed too on Hopper


@dataclasses.dataclass(frozen=True)
class GpuCheckConfig:
  """experiments/gpu_check.py's flags."""
  out: str = option("gpu_check_out", "Output directory.")
  dry_run: bool = option(False, "Tiny sizes and Pallas interpret mode: the whole flow on CPU in "
                         "seconds.")
  correctness: bool = option(True, "Run part (a), the kernels against the float64 references.")
  speed: bool = option(True, "Run part (b), the speed table.")

  def __post_init__(self):
    # Compiled Pallas has no CPU lowering: without a GPU every case would fail, after minutes.
    if not self.dry_run and jax.default_backend() == "cpu":
      raise ConfigError("no GPU here (jax backend: cpu); --dry_run runs the same flow on CPU "
                        "in interpret mode")


def _cases(dry_run: bool):
  """(kernel, Case, dtype) for part (a): lengths odd and over one GPU tile, an empty key row."""
  dims = (16,) if dry_run else (64, 128)
  dtypes = (jnp.float32,) if dry_run else (jnp.float32, jnp.bfloat16)
  tq, tk, tc = (13, 21, 11) if dry_run else (131, 201, 177)
  out = []
  for kernel in ("dot", "additive"):
    for d in dims:
      dv = d if kernel == "dot" else 64
      padded = kc.Case(f"padded_d{d}", B=2, Tq=tq, Tk=tk, H=2, d=d, dv=dv, causal=False,
                       key_lengths=(tk, 0), query_lengths=(tq - 4, tq))
      causal = kc.Case(f"causal_d{d}", B=2, Tq=tc, Tk=tc, H=2, d=d, dv=dv, causal=True,
                       key_lengths=(tc, 1), query_lengths=(tc, tc - 6))
      # The dry run keeps one case per kernel: it checks the flow, the kernel tests the values.
      pair = ((padded,) if kernel == "dot" else (causal,)) if dry_run else (padded, causal)
      out += [(kernel, c, dt) for c in pair for dt in dtypes]
      if kernel == "dot" and (dry_run or _hopper()):  # Mosaic GPU: 16-bit inputs, WGMMA
        names = ("dot_mosaic",) if dry_run else ("dot_mosaic", *MOSAIC_VARIANTS)
        out += [(name, c, jnp.bfloat16) for name in names for c in pair]
  return out


def _hopper() -> bool:
  """Whether the device has WGMMA (sm_90), which the Mosaic GPU forward needs."""
  return getattr(jax.devices()[0], "compute_capability", None) == "9.0"


def _runner(kernel: str, case, implementation: str, interpret):
  """fn(*inputs) -> (out, lse) with the case's masks, for kc.loss_and_grads."""
  kernel, options = KERNEL_RUNS[kernel]
  kw = dict(causal=case.causal, implementation=implementation)
  if implementation == "pallas":
    kw.update(interpret=interpret, **options)
  if kernel == "dot":
    return lambda kl, ql: (lambda q, k, v: fa.attention_with_lse(
        q, k, v, key_lengths=kl, query_lengths=ql, **kw))
  return lambda kl, ql: (lambda qp, kp, w, val: aa.additive_attention_with_lse(
      qp, kp, w, val, key_lengths=kl, query_lengths=ql, **kw))


def check_case(kernel: str, case, dtype, interpret: bool) -> str:
  """'ok' or what failed: out, lse and every gradient of the compiled kernel against float64."""
  if KERNEL_RUNS[kernel][0] == "dot":
    *args, kl, ql = kc.dot_inputs(case, dtype)
    ref = kc.np_attention(*args, kl, ql, case.causal, case.d ** -0.5, *kc.cotangents(case))
    names = ("out", "lse", "dq", "dk", "dv")
  else:
    *args, kl, ql = kc.additive_inputs(case, dtype)
    ref = kc.np_additive(*args, kl, ql, case.causal, *kc.cotangents(case))
    names = ("out", "lse", "dq_proj", "dk_proj", "dv_vec", "dvalues")
  got_fn = _runner(kernel, case, "pallas", interpret)(kl, ql)
  naive_fn = _runner(kernel, case, "xla", interpret)(kl, ql)
  got = (*jax.jit(got_fn)(*args), *kc.loss_and_grads(got_fn, args, *kc.cotangents(case)))
  naive = (*jax.jit(naive_fn)(*args), *kc.loss_and_grads(naive_fn, args, *kc.cotangents(case)))
  try:
    for name, g, n, r in zip(names, got, naive, ref):
      kc.assert_as_close_as_naive(g, n, r, dtype, name)
    empty = np.isneginf(ref[1])  # rows with no visible key: exactly zero output
    if not np.all(np.asarray(got[0], np.float32)[empty] == 0.0):
      return "FAIL (out: an empty row is not zero)"
  except AssertionError as e:
    return f"FAIL ({e})"
  return "ok"


def correctness(cfg: GpuCheckConfig) -> list[str]:
  """Part (a): one 'PASS|FAIL kernel case dtype: detail' line per case, printed as it goes."""
  lines = []
  for kernel, case, dtype in _cases(cfg.dry_run):
    try:
      status = check_case(kernel, case, dtype, interpret=cfg.dry_run)
    except Exception as e:  # noqa: BLE001  (a kernel that does not compile is a failure line)
      status = f"FAIL ({type(e).__name__}: {str(e).splitlines()[0][:150]})"
    word = "PASS" if status == "ok" else "FAIL"
    lines.append(f"{word} {kernel} {case.name} T={case.Tq}x{case.Tk} "
                 f"{jnp.dtype(dtype).name}: {status}")
    print(lines[-1], flush=True)
  return lines


def speed(cfg: GpuCheckConfig):
  """Part (b): bench_kernel's sweep (attn.benchmarks.kernels), bf16, not causal; returns its
  (result, BenchConfig)."""
  sweep = DRY_SWEEP if cfg.dry_run else GPU_SWEEP
  batch, heads, d = (1, 2, 16) if cfg.dry_run else (4, 16, 128)
  bc = bench.BenchConfig(kernel="dot", batch=batch, heads=heads,
                         seq_lens=tuple(t for t, _ in sweep),
                         repeats_per_len=tuple(r for _, r in sweep), head_dims=(d,),
                         dtype="bfloat16", causal=(False,), modes=bench.MODES,
                         impls=PEERS + (HOPPER_PEERS if _hopper() else ()),
                         num_inputs=1 if cfg.dry_run else 2, outdir=cfg.out, name="gpu_check",
                         plot=False)
  return bench.run_benchmark(bc), bc


def _write(cfg: GpuCheckConfig, lines, table, command: str) -> list[str]:
  """correctness.txt, and bench_kernel's gpu_check.csv and .md (the command, the machine)."""
  os.makedirs(cfg.out, exist_ok=True)
  written = []
  if lines is not None:
    written.append(os.path.join(cfg.out, "correctness.txt"))
    write_text(written[-1], "\n".join(lines) + "\n")
  if table is not None:
    written += bench.write_outputs(*table, command)
  return written


def main(argv):
  del argv
  cfg = cli.settings_from_flags(GpuCheckConfig)
  start = time.time()
  print(f"# jax {jax.__version__} on {jax.devices()}", flush=True)
  lines = correctness(cfg) if cfg.correctness else None
  t_correct = time.time() - start
  table = speed(cfg) if cfg.speed else None
  command = "python -m experiments.gpu_check " + " ".join(shlex.quote(a) for a in sys.argv[1:])
  for path in _write(cfg, lines, table, command):
    print("wrote", path)
  failed = [l for l in lines or () if not l.startswith("PASS")]
  print(f"correctness {t_correct:.0f} s, speed {time.time() - start - t_correct:.0f} s; "
        f"{len(failed)} of {len(lines or ())} correctness cases failed", flush=True)
  if failed:
    sys.exit(1)


if __name__ == "__main__":
  cli.define_settings_flags(GpuCheckConfig)
  cli.run(main)
