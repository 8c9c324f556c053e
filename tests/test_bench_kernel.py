"""The kernel benchmark's library (attn.benchmarks.kernels): settings validation, the analytic
FLOP counts each kernel's spec carries, and a tiny sweep end to end (checks pass, rows carry
times and memory, files written)."""

import os
import subprocess
import sys

import pytest

from attn.benchmarks import kernels as bench
from attn.errors import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("bad, match", [
    (dict(kernel="dott"), "--kernel=dott: unknown; known: additive, dot"),
    (dict(kernel="additive", impls=("cudnn",)), "unknown implementations \\['cudnn'\\]"),
    (dict(modes=("bwd",)), "--modes takes fwd and/or fwd_bwd"),
    (dict(dtype="int8"), "--dtype=int8"),
    (dict(seq_lens=(64, 128), repeats_per_len=(3,)), "--repeats_per_len has 1 values for 2"),
])
def test_bad_settings_are_config_errors(bad, match):
  with pytest.raises(ConfigError, match=match):
    bench.BenchConfig(**bad)


@pytest.mark.parametrize("flag, value, says", [
    ("block_q", 3, "--block_q must be a power of two >= 16, got 3"),
    ("block_k", 0, "--block_k must be a power of two >= 16, got 0"),
    ("block_k", 8, "--block_k must be a power of two >= 16, got 8"),
    ("block_d", 3, "--block_d must be a power of two, got 3"),
])
def test_a_bad_tile_flag_is_one_error_line_naming_it(flag, value, says):
  """The tiles are checked where the other flags are (by BlockSizes, the kernels' own check),
  so a bad one is one `error:` line with exit status 2, before anything runs."""
  with pytest.raises(ConfigError, match=f"^{says}$"):
    bench.BenchConfig(**{flag: value})
  assert bench.BenchConfig(**{flag: 16}).blocks is not None
  done = subprocess.run([sys.executable, "-m", "experiments.bench_kernel", f"--{flag}={value}",
                         "--outdir=/nonexistent/never_written"], cwd=REPO, capture_output=True,
                        text=True, check=False, timeout=120)
  assert done.returncode == 2, done.stderr[-2000:]
  assert done.stderr.strip().splitlines() == [f"error: {says}"]


def test_repeats_per_length_default_to_repeats():
  assert bench.BenchConfig(seq_lens=(64, 128), repeats=4).repeats_at(128) == 4
  cfg = bench.BenchConfig(seq_lens=(64, 128), repeats=4, repeats_per_len=(9, 2))
  assert (cfg.repeats_at(64), cfg.repeats_at(128)) == (9, 2)


def test_flop_counts_follow_each_kernels_formula():
  B, H, T, d = 2, 3, 10, 8
  dot = bench.BenchConfig(batch=B, heads=H)
  assert bench._flops(dot, T, d, False, "fwd") == 4 * B * H * T * T * d
  assert bench._flops(dot, T, d, True, "fwd_bwd") == 3.5 * 4 * B * H * T * T * d / 2
  add = bench.BenchConfig(kernel="additive", batch=B, heads=H)  # dv defaults to 64
  assert bench._flops(add, T, d, False, "fwd") == B * H * T * T * (2 * d + 2 * 64)
  add = bench.BenchConfig(kernel="additive", batch=B, heads=H, value_dim=5)
  assert bench._flops(add, T, d, False, "fwd") == B * H * T * T * (2 * d + 2 * 5)


def test_inputs_have_each_kernels_shapes():
  q, k, v = bench._inputs(bench.BenchConfig(value_dim=6), 16, 8, seed=0, B=2, H=3)
  assert q.shape == k.shape == (2, 16, 3, 8) and v.shape == (2, 16, 3, 6)
  q, k, w, v = bench._inputs(bench.BenchConfig(kernel="additive"), 16, 8, seed=0, B=2, H=3)
  assert q.shape == k.shape == (2, 16, 3, 8) and w.shape == (3, 8) and v.shape == (2, 16, 3, 64)


def test_a_tiny_sweep_checks_times_and_writes_its_files(tmp_path, capsys):
  cfg = bench.BenchConfig(seq_lens=(64,), head_dims=(16,), heads=2, repeats=1, num_inputs=1,
                          modes=("fwd", "fwd_bwd"), outdir=str(tmp_path), plot=False)
  result = bench.run_benchmark(cfg)
  rows = result["rows"]
  assert [(r["impl"], r["mode"]) for r in rows] == [("blocked", "fwd"), ("naive", "fwd"),
                                                    ("blocked", "fwd_bwd"), ("naive", "fwd_bwd")]
  for r in rows:
    assert r["check"] == "ok" and r["status"] == "ran" and r["time_ms"] > 0, r
    assert r["temp_mib"] is not None
  naive = [r for r in rows if r["impl"] == "naive"]
  assert all(r["time_vs_naive"] == 1.0 for r in naive)
  paths = bench.write_outputs(result, cfg, "pytest")
  assert [p.rsplit(".", 1)[1] for p in paths] == ["csv", "md"]
  md = open(paths[1]).read()
  assert "Command: `pytest`" in md and bench.markdown_table(rows) in md
  assert md.count("\n| blocked |") == 2
  capsys.readouterr()


def test_a_peer_failing_at_run_time_is_a_row_not_a_crash(tmp_path, monkeypatch, capsys):
  real = bench.harness.median_seconds
  calls = []

  def flaky(*a, **kw):  # after the matmul peak, the first timing (blocked) fails as OOM would
    calls.append(1)
    if len(calls) == 2:
      raise RuntimeError("RESOURCE_EXHAUSTED: out of memory\nsecond line")
    return real(*a, **kw)
  monkeypatch.setattr(bench.harness, "median_seconds", flaky)
  cfg = bench.BenchConfig(seq_lens=(32,), head_dims=(8,), heads=1, repeats=1, num_inputs=1,
                          check=False, outdir=str(tmp_path), plot=False)
  rows = bench.run_benchmark(cfg)["rows"]
  assert [(r["impl"], r["status"]) for r in rows] == [
      ("blocked", "error: RuntimeError: RESOURCE_EXHAUSTED: out of memory"), ("naive", "ran")]
  capsys.readouterr()
