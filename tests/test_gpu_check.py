"""experiments/gpu_check.py, the device check: its CPU dry run end to end (with the libraries the
GPU machine lacks made unimportable), and its correctness check catching a wrong kernel."""

import os
import subprocess
import sys

import jax.numpy as jnp

from experiments import gpu_check
from kernels import flash_attention as fa

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The GPU machine has jax, flax, optax, orbax, absl and chex but none of these; flax is blocked
# too, since the check must not need more than jax.
BLOCKED = ("flax", "tensorflow_datasets", "tensorflow", "grain", "pytest")
RUN = ("import runpy, sys\n"
       f"for name in {BLOCKED!r}: sys.modules[name] = None  # import name -> ImportError\n"
       "sys.argv = ['gpu_check', '--dry_run', '--out=' + sys.argv[1]]\n"
       "runpy.run_module('experiments.gpu_check', run_name='__main__')\n")


def test_the_dry_run_passes_and_writes_the_table_without_flax_tfds_grain_or_pytest(tmp_path):
  """~20 s on 2 cores (one interpret-mode kernel per fused kernel and the dot kernel's Mosaic GPU
  forward in the Mosaic GPU interpreter, forward and gradients, and the table's compiles): the
  only run of the GPU flow this machine can make."""
  proc = subprocess.run([sys.executable, "-c", RUN, str(tmp_path)], cwd=REPO,
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  lines = open(tmp_path / "correctness.txt").read().splitlines()
  assert [l.split(":")[0] for l in lines] == [
      "PASS dot padded_d16 T=13x21 float32", "PASS dot_mosaic padded_d16 T=13x21 bfloat16",
      "PASS additive causal_d16 T=11x11 float32"]
  assert "0 of 3 correctness cases failed" in proc.stdout
  md = open(tmp_path / "gpu_check.md").read()
  assert md.startswith("Command: `python -m experiments.gpu_check --dry_run --out=")
  header = "| impl | mode | causal | T | d | time ms | TFLOP/s | % peak | temp MiB |"
  assert header in md
  rows = [l.split(" | ") for l in md.splitlines() if l.startswith("| ") and "---" not in l][1:]
  # On CPU the four GPU peers are one "unavailable" row each; XLA runs at each T and mode.
  assert [(r[0], r[1], r[3]) for r in rows] == [
      ("| pallas", "-", "-"), ("| pallas_mosaic", "-", "-"), ("| cudnn", "-", "-"),
      ("| jax_triton", "-", "-"),
      ("| xla", "fwd", "64"), ("| xla", "fwd_bwd", "64"),
      ("| xla", "fwd", "128"), ("| xla", "fwd_bwd", "128")]
  assert all("unavailable" in r[-1] for r in rows[:4])
  assert all(r[-2] == "ok" and r[-1] == "ran |" for r in rows[4:]), rows


def test_without_a_gpu_and_without_dry_run_it_stops_in_one_line(tmp_path):
  out = tmp_path / "out"
  proc = subprocess.run([sys.executable, "-m", "experiments.gpu_check", f"--out={out}"], cwd=REPO,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert proc.stderr.strip().splitlines()[-1] == (
      "error: no GPU here (jax backend: cpu); --dry_run runs the same flow on CPU in interpret "
      "mode")
  assert not out.exists()


def test_a_kernel_off_by_a_little_fails_its_case(monkeypatch):
  """The tolerance is the kernel tests' rule, so an error far above the dense path's fails."""
  real = fa.attention_with_lse

  def off(*a, implementation, **kw):
    out, lse = real(*a, implementation=implementation, **kw)
    return (out + 1e-3 if implementation == "pallas" else out), lse
  monkeypatch.setattr(fa, "attention_with_lse", off)
  kernel, case, dtype = gpu_check._cases(dry_run=True)[0]
  assert kernel == "dot" and dtype == jnp.float32
  status = gpu_check.check_case(kernel, case, dtype, interpret=True)
  assert status.startswith("FAIL (out: error 0.001 > 2 x naive"), status
