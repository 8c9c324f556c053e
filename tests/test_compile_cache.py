"""The persistent compilation cache: where the environment puts it, and that a second process loads
what the first compiled, with the same results (a bare program, then a whole training run)."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import full_disk
from attn.common import compile_cache

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("environ, expected", [
    ({}, "default"),
    ({"ATTN_COMPILE_CACHE": "/data/xla"}, "/data/xla"),
    ({"ATTN_COMPILE_CACHE": "~/xla"}, os.path.expanduser("~/xla")),
    ({"ATTN_COMPILE_CACHE": "off"}, None),
    ({"ATTN_COMPILE_CACHE": "OFF"}, None),
    ({"ATTN_COMPILE_CACHE": ""}, None),
    ({"XDG_CACHE_HOME": "/xdg"}, "/xdg/attn/xla"),
    ({"JAX_COMPILATION_CACHE_DIR": "/jax", "ATTN_COMPILE_CACHE": "/data/xla"}, None),
])
def test_the_environment_chooses_the_directory(environ, expected, monkeypatch):
  monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
  if expected == "default":
    expected = os.path.join(os.path.expanduser("~"), ".cache", "attn", "xla")
  assert compile_cache.configured_dir(environ) == expected


def test_stats_subtract_and_summarize():
  a = compile_cache.CompileStats(programs=10, seconds=30.0, loaded=6, saved_s=25.0, written=1)
  b = compile_cache.CompileStats(programs=4, seconds=12.5, loaded=2, saved_s=5.0, written=1)
  d = a - b
  assert d == compile_cache.CompileStats(6, 17.5, 4, 20.0, 0)
  assert d.summary() == ("XLA compiled 6 programs in 17.5 s; 4 of them loaded from the "
                         "compilation cache (saving ~20 s)")
  assert compile_cache.CompileStats(3, 2.0, 0, 0.0, 3).summary() == (
      "XLA compiled 3 programs in 2.0 s; 3 written to it")



@pytest.mark.parametrize("threshold, expected", [(None, compile_cache.MIN_COMPILE_S),
                                                 ("0.5", 0.5)])
def test_enable_writes_programs_from_its_threshold_unless_jaxs_variable_is_set(
    threshold, expected, tmp_path):
  """A program that compiles in MIN_COMPILE_S or more is written (JAX's default second left a
  small model's steps out of every rerun); JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS wins."""
  env = {k: v for k, v in os.environ.items()
         if k not in ("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "JAX_COMPILATION_CACHE_DIR")}
  if threshold is not None:
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = threshold
  code = ("import sys, jax\nfrom attn.common import compile_cache\n"
          "compile_cache.enable(sys.argv[1])\n"
          "print(jax.config.jax_persistent_cache_min_compile_time_secs)")
  p = subprocess.run([sys.executable, "-c", code, str(tmp_path / "xla")], cwd=REPO, env=env,
                     capture_output=True, text=True, timeout=120, check=False)
  assert p.returncode == 0, p.stderr[-2000:]
  assert float(p.stdout.strip().splitlines()[-1]) == expected
  assert 0.1 <= compile_cache.MIN_COMPILE_S < 1.0

_PROGRAM = textwrap.dedent("""
    import json, sys
    from attn.common import compile_cache
    directory = compile_cache.enable(sys.argv[1])
    import jax, jax.numpy as jnp
    seen = []
    def chain(x):
      for i in range(20):
        x = jnp.tanh(x @ x.T + i)
      return x.sum()
    def with_callback(x):  # a host callback, as the Transformer's decoder has
      jax.lax.cond(x.sum() > -1e9, lambda: jax.debug.callback(seen.append, x.sum()), lambda: None)
      return x * 2
    x = jnp.linspace(-1, 1, 64 * 64).reshape(64, 64)
    out = float(jax.jit(chain)(x))
    jax.block_until_ready(jax.jit(with_callback)(x))
    s = compile_cache.stats()
    print(json.dumps({"dir": directory, "out": out, "loaded": s.loaded, "written": s.written,
                      "programs": s.programs, "seen": [float(v) for v in seen]}))
""")


def _run_program(directory, tmp_path, max_file_bytes=None):
  """_PROGRAM in a fresh process; max_file_bytes emulates a full disk (RLIMIT_FSIZE)."""
  env = {**os.environ, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  code = _PROGRAM
  if max_file_bytes is not None:
    code = full_disk.prelude(max_file_bytes) + code
  return subprocess.run([sys.executable, "-c", code, directory], cwd=tmp_path, env=env,
                        capture_output=True, text=True, timeout=300)


def _program(directory, tmp_path):
  p = _run_program(directory, tmp_path)
  assert p.returncode == 0, p.stderr[-2000:]
  return json.loads(p.stdout.strip().splitlines()[-1])


def test_a_second_process_loads_the_program_the_first_compiled(tmp_path):
  cache = tmp_path / "xla"
  first = _program(str(cache), tmp_path)
  assert first["dir"] == str(cache) and first["loaded"] == 0 and first["written"] >= 1
  kept = {p.name.split("-")[0] for p in cache.iterdir()}
  assert "jit_chain" in kept
  assert "jit_with_callback" not in kept  # JAX keeps no program that calls back into Python
  second = _program(str(cache), tmp_path)
  assert second["loaded"] >= 1 and second["written"] == 0
  assert second["out"] == first["out"]
  assert len(first["seen"]) == 1 and second["seen"] == first["seen"]  # it still fires
  assert second["programs"] == first["programs"]  # a load is counted as the program it replaces


def test_processes_sharing_a_directory_take_its_lock_and_agree(tmp_path):
  """Four processes compile the same programs into one new directory at once: every read and
  write of an entry holds the directory's lock (JAX takes it only for a cache with a size
  limit), and each process computes what a process without the cache computes."""
  cache = str(tmp_path / "xla")
  env = {**os.environ, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  procs = [subprocess.Popen([sys.executable, "-c", _PROGRAM, cache], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for _ in range(4)]
  outs = []
  for p in procs:
    stdout, stderr = p.communicate(timeout=300)
    assert p.returncode == 0, stderr[-2000:]
    outs.append(json.loads(stdout.strip().splitlines()[-1]))
  alone = _program("", tmp_path)
  assert {o["out"] for o in outs} == {alone["out"]}
  assert os.path.exists(os.path.join(cache, ".lockfile"))
  assert sum(o["written"] for o in outs) >= 1


def _entries(directory):
  names = os.listdir(directory)
  return ({n[:-len("-cache")] for n in names if n.endswith("-cache")},
          {n[:-len("-atime")] for n in names if n.endswith("-atime")})


def test_a_write_cut_short_by_a_full_disk_does_not_stop_later_processes_writing(tmp_path):
  """JAX writes an entry's bytes, then its access time; a full disk between the two leaves an
  entry with no access time, on which JAX's eviction scan (run by every write) fails ever after.
  The next process to enable the cache removes it, and writes and loads as usual."""
  cache = str(tmp_path / "xla")
  cut = _run_program(cache, tmp_path, max_file_bytes=2_000)  # the first entry is larger
  assert cut.returncode == 0, cut.stderr[-2000:]  # the compiled programs still ran
  written, timed = _entries(cache)
  assert len(written - timed) == 1  # the cut entry; each later write failed on it
  assert "Error writing persistent compilation cache entry for 'jit_chain'" in cut.stderr
  p = _run_program(cache, tmp_path)
  assert p.returncode == 0 and "Error writing persistent compilation cache" not in p.stderr, (
      p.stderr[-2000:])
  first = json.loads(p.stdout.strip().splitlines()[-1])
  assert first["written"] >= 1 and first["loaded"] == 0
  written, timed = _entries(cache)
  assert written == timed and any(k.startswith("jit_chain-") for k in written)
  second = _program(cache, tmp_path)
  assert second["loaded"] >= 1 and second["written"] == 0 and second["out"] == first["out"]


def test_repair_leaves_whole_entries_alone(tmp_path):
  for key, files in (("whole", ("-cache", "-atime")), ("cut", ("-cache",)),
                     ("orphan_time", ("-atime",))):
    for suffix in files:
      (tmp_path / f"{key}{suffix}").write_bytes(b"x")
  assert compile_cache.repair(str(tmp_path)) == ["cut"]
  assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == [
      "orphan_time-atime", "whole-atime", "whole-cache"]


def test_the_cache_has_a_size_limit_so_jax_locks_it(tmp_path):
  code = ("import jax; from attn.common import compile_cache; "
          f"compile_cache.enable({str(tmp_path)!r}); "
          "print(jax.config.jax_compilation_cache_max_size)")
  out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                       check=True).stdout
  assert int(out.split()[-1]) == compile_cache.MAX_BYTES > 0


def test_off_writes_nothing(tmp_path):
  out = _program("", tmp_path)
  assert out["dir"] is None and out["loaded"] == out["written"] == 0


# slow: two smoke runs; test_a_second_process_loads_the_program_the_first_compiled pins the reload fast
@pytest.mark.slow
def test_a_rerun_of_an_experiment_loads_its_programs_and_trains_the_same_model(tmp_path):
  env = {**os.environ, "ATTN_COMPILE_CACHE": str(tmp_path / "xla"),
         "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  runs = []
  for name in ("first", "second"):
    p = subprocess.run([sys.executable, "-m", "experiments.translate",
                        "--config=experiments/configs/translate.py:smoke",
                        "--config.model.rnn.decoder=bahdanau", "--config.train.steps=20",
                        f"--workdir={tmp_path / name}"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    summary = [l for l in p.stderr.splitlines() if "XLA compiled" in l]
    assert len(summary) == 1, p.stderr[-3000:]
    runs.append((summary[0], json.loads((tmp_path / name / "results.json").read_text())))
  (first, r1), (second, r2) = runs
  assert "written to it" in first and "loaded from" not in first
  assert "loaded from the compilation cache" in second and "written" not in second
  assert r2["bleu"] == r1["bleu"]
  assert (tmp_path / "second" / "predictions.txt").read_text() == (
      tmp_path / "first" / "predictions.txt").read_text()


def test_the_suite_leaves_tiny_programs_out_of_its_shared_cache():
  """Every write to the locked cache scans its directory: caching the tests' tens of thousands of
  op-by-op programs made late tests up to 50x slower (tests/conftest.py)."""
  import jax  # pylint: disable=import-outside-toplevel
  if os.environ.get("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS") not in (None, "0.1"):
    pytest.skip("the caller chose its own JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS")
  assert jax.config.jax_persistent_cache_min_compile_time_secs >= 0.1


def test_the_suite_compiles_with_xlas_elemental_cpu_emitters():
  """The suite's many small programs compile in about half the time (tests/conftest.py)."""
  flags = os.environ.get("XLA_FLAGS", "")
  if "--xla_cpu_use_fusion_emitters" not in flags:
    pytest.skip("this jaxlib's XLA does not know --xla_cpu_use_fusion_emitters")
  assert "--xla_cpu_use_fusion_emitters=false" in flags


# Root writes into a chmod-555 directory: a real read-only directory needs a process without
# CAP_DAC_OVERRIDE, which setpriv gives a root shell (its other privileges kept).
_NO_DAC = ["setpriv", "--bounding-set=-dac_override,-dac_read_search",
           "--inh-caps=-dac_override,-dac_read_search"]


def _can_drop_dac() -> bool:
  return shutil.which("setpriv") is not None and os.geteuid() == 0


@pytest.mark.parametrize("blocked", ["read_only_directory", "lock_path_is_a_directory"])
def test_a_directory_the_process_cannot_write_is_no_cache(blocked, tmp_path):
  """A cache it cannot write would have every compile try (and fail, or wait on) its lock: the
  process runs without it, with one warning line, and JAX is never given the directory."""
  cache = tmp_path / "xla"
  cache.mkdir()
  prefix = []
  if blocked == "read_only_directory":
    if not _can_drop_dac():
      pytest.skip("needs root and setpriv to make a directory this process cannot write "
                  "(lock_path_is_a_directory checks the same behaviour)")
    cache.chmod(0o555)
    prefix = _NO_DAC
  else:
    (cache / ".lockfile").mkdir()  # no process can open it as the lock, root included
  env = {**os.environ, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  code = _PROGRAM.replace("print(json.dumps({", "print(json.dumps({'jax_dir': "
                          "jax.config.jax_compilation_cache_dir, ")
  p = subprocess.run(prefix + [sys.executable, "-c", code, str(cache)], cwd=REPO, env=env,
                     capture_output=True, text=True, timeout=300, check=False)
  assert p.returncode == 0, p.stderr[-2000:]
  out = json.loads(p.stdout.strip().splitlines()[-1])
  assert out["dir"] is None and out["jax_dir"] is None  # JAX never tries the lock
  assert out["loaded"] == out["written"] == 0
  warnings = [l for l in p.stderr.splitlines() if "cache" in l]
  assert len(warnings) == 1, p.stderr[-2000:]
  assert warnings[0].startswith(f"warning: the compilation cache {cache} cannot be written (")
  assert "running without it" in warnings[0]
  assert sorted(q.name for q in cache.iterdir()) == ([] if prefix else [".lockfile"])


def test_a_cut_short_entry_is_replaced_and_only_real_writes_are_counted(tmp_path):
  """An entry whose bytes were cut short, its access time intact, does not decompress: the
  next process removes it (one warning line), compiles and writes it again, and counts as
  written exactly the entries it wrote; the process after it loads every entry quietly."""
  cache = tmp_path / "xla"
  first = _program(str(cache), tmp_path)
  (chain,) = [q for q in cache.iterdir() if q.name.startswith("jit_chain-")
              and q.name.endswith("-cache")]
  whole = chain.read_bytes()
  chain.write_bytes(whole[:len(whole) // 2])
  before = {q.name: (q.stat().st_mtime_ns, q.stat().st_size) for q in cache.glob("*-cache")}
  p = _run_program(str(cache), tmp_path)
  assert p.returncode == 0, p.stderr[-2000:]
  second = json.loads(p.stdout.strip().splitlines()[-1])
  assert "Error reading persistent compilation cache" not in p.stderr, p.stderr[-2000:]
  damaged = [l for l in p.stderr.splitlines() if "damaged" in l]
  assert len(damaged) == 1 and chain.name[:-len("-cache")] in damaged[0], p.stderr[-2000:]
  after = {q.name: (q.stat().st_mtime_ns, q.stat().st_size) for q in cache.glob("*-cache")}
  rewritten = [n for n in after if before.get(n) != after[n]]
  assert rewritten == [chain.name] and second["written"] == 1
  assert chain.stat().st_size == len(whole)
  assert second["out"] == first["out"] and second["loaded"] == first["written"] - 1
  third = _run_program(str(cache), tmp_path)
  assert third.returncode == 0 and "cache" not in third.stderr, third.stderr[-2000:]
  out = json.loads(third.stdout.strip().splitlines()[-1])
  assert out["loaded"] == first["written"] and out["written"] == 0 and out["out"] == first["out"]
