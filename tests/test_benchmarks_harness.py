"""The benchmark harness (attn.benchmarks.harness): medians of a fake clock, warm-up calls left
out, the first-call limit, and memory figures against buffers of known size. Timing figures
themselves belong to the benchmarks, not here."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from attn.benchmarks import harness

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class FakeClock:
  """A clock that advances only when the timed function runs: call i takes durations[i]."""

  def __init__(self, durations):
    self.now, self.durations, self.seen = 0.0, list(durations), []

  def __call__(self):
    return self.now

  def fn(self, *args):
    self.seen.append(args)
    self.now += self.durations[len(self.seen) - 1]
    return jnp.zeros(())


def test_median_leaves_out_the_warmup_and_cycles_the_input_sets():
  clock = FakeClock([50.0, 40.0, 3.0, 1.0, 2.0, 5.0, 4.0])
  sets = [("a",), ("b",), ("c",)]
  got = harness.median_seconds(clock.fn, sets, warmup=2, repeats=5, clock=clock)
  assert got == 3.0  # median of 3, 1, 2, 5, 4; the slow warm-up calls are not in it
  assert [a for (a,) in clock.seen] == ["a", "b", "a", "b", "c", "a", "b"]


def test_median_of_an_even_count_is_the_mean_of_the_middle_two():
  clock = FakeClock([9.0, 1.0, 4.0, 2.0, 8.0])
  assert harness.median_seconds(clock.fn, [()], warmup=1, repeats=4, clock=clock) == 3.0
  clock = FakeClock([1.0, 2.0])
  assert harness.call_times(clock.fn, [()], warmup=0, repeats=2, clock=clock) == [1.0, 2.0]


def test_a_first_call_over_the_limit_stops_the_timing():
  clock = FakeClock([7.0, 1.0, 1.0])
  with pytest.raises(harness.TooSlow) as e:
    harness.median_seconds(clock.fn, [()], warmup=1, repeats=2, first_limit=5.0, clock=clock)
  assert e.value.seconds == 7.0 and len(clock.seen) == 1  # nothing after the first call
  clock = FakeClock([4.0, 1.0, 3.0])
  assert harness.median_seconds(clock.fn, [()], warmup=1, repeats=2, first_limit=5.0,
                                clock=clock) == 2.0


def test_timed_call_waits_for_the_result():
  out, seconds = harness.timed_call(jax.jit(lambda x: x * 2), jnp.arange(3.0))
  assert out.tolist() == [0.0, 2.0, 4.0] and seconds >= 0


def test_memory_counts_arguments_outputs_and_a_known_temporary():
  n, m = 256, 32
  x = jax.ShapeDtypeStruct((n, m), jnp.float32)
  # exp(x) flattened must exist whole before the sort: an [n * m] float32 temporary.
  mem = harness.memory(harness.compile(lambda x: jnp.sort(jnp.exp(x).reshape(-1))[:3], x))
  assert mem.arguments == n * m * 4 and mem.outputs == 3 * 4
  assert mem.temp >= n * m * 4
  assert mem.peak == mem.temp + mem.arguments + mem.outputs
  already_jitted = jax.jit(lambda x: x + 1)
  assert harness.memory(harness.compile(already_jitted, x)).outputs == n * m * 4


def test_without_ynn_fusion_cpu_reports_the_attention_like_temporary():
  # [n, n] scores reduced away: with YNNPACK fusion on, XLA CPU reports no temporary for them.
  code = ("from attn.benchmarks import harness; harness.disable_cpu_ynn_fusion(); "
          "import jax, jax.numpy as jnp; "
          "x = jax.ShapeDtypeStruct((512, 64), jnp.float32); "
          "f = lambda x: jnp.sum(jnp.tanh(x @ x.T), axis=0); "
          "print(harness.memory(harness.compile(f, x)).temp)")
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                       check=True, timeout=120, env=env)
  assert int(out.stdout.split()[-1]) >= 512 * 512 * 4


def test_disabling_ynn_fusion_keeps_other_flags_and_adds_it_once(monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
  harness.disable_cpu_ynn_fusion()
  harness.disable_cpu_ynn_fusion()
  assert os.environ["XLA_FLAGS"].split() == ["--xla_force_host_platform_device_count=2",
                                             harness.NO_YNN_FUSION]


def test_the_harness_needs_jax_alone():
  code = ("import sys; import attn.benchmarks.harness; "
          "print(' '.join(m for m in sys.modules if m.split('.')[0] in "
          "('flax', 'tensorflow_datasets', 'grain', 'optax')))")
  out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                       check=True, timeout=120)
  assert out.stdout.strip() == ""


XEON_AMX = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8
processor\t: 1
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8
"""
EPYC_AVX2 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse2 avx avx2 fma
"""


def test_cpu_info_reads_the_model_and_the_bfloat16_instructions_from_cpuinfo():
  assert harness.cpu_info(XEON_AMX) == {"model": "Intel(R) Xeon(R) Processor",
                                        "avx512_bf16": True, "amx": True}
  assert harness.cpu_info(EPYC_AVX2) == {"model": "AMD EPYC 7B13", "avx512_bf16": False,
                                         "amx": False}
  # avx512_bf16 without AMX (the team's AVX-512 EPYC); a flag is a whole word, not a prefix
  assert harness.cpu_info("model name: AMD EPYC 9B14\nflags: avx512f avx512_bf16\n") == {
      "model": "AMD EPYC 9B14", "avx512_bf16": True, "amx": False}
  assert harness.cpu_info("model name: X\nflags: avx512_bf16x amx\n")["amx"] is False
  # no model line (arm64 says Features): the flags are still read; nothing readable: unknown
  assert harness.cpu_info("Features: fp asimd bf16\n") == {
      "model": "unknown", "avx512_bf16": False, "amx": False}
  assert harness.cpu_info("") == {"model": "unknown", "avx512_bf16": "unknown",
                                  "amx": "unknown"}
  assert harness.cpu_line(harness.cpu_info(XEON_AMX)) == (
      "CPU: Intel(R) Xeon(R) Processor (avx512_bf16: yes, amx: yes)")
  assert harness.cpu_line(harness.cpu_info("")) == (
      "CPU: unknown (avx512_bf16: unknown, amx: unknown)")


def test_cpu_info_is_unknown_where_there_is_no_cpuinfo(monkeypatch):
  import builtins
  real_open = builtins.open

  def no_cpuinfo(path, *a, **kw):
    if path == "/proc/cpuinfo":
      raise FileNotFoundError(path)
    return real_open(path, *a, **kw)

  monkeypatch.setattr(builtins, "open", no_cpuinfo)
  assert harness.cpu_info() == {"model": "unknown", "avx512_bf16": "unknown", "amx": "unknown"}


def test_every_record_of_the_machine_holds_the_cpu():
  meta = harness.machine()
  assert set(meta["cpu"]) == {"model", "avx512_bf16", "amx"}
  assert meta["cpu"] == harness.cpu_info()
