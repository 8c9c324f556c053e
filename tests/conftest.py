"""Fixtures shared by several test files."""

import os
import shutil
import tempfile

import pytest

# One persistent compilation cache for the whole session, in a fresh directory removed at the
# end: the user's own cache is left alone, and the many processes that compile the same programs
# (the smoke runs of the launcher, reliability, docs and CLI tests, each a subprocess; the xdist
# workers) compile each once. Most of a smoke run's wall time is compiling: ~170 s cold, ~50 s
# warm on two busy cores. Entries are keyed on the program, so a loaded one is the one that would
# have been compiled. The controller makes the directory before it starts the workers, which
# inherit it; ATTN_COMPILE_CACHE set by the caller (a path, or "off") wins.
# tests/test_compile_cache.py sets its own directories.
_SESSION_CACHE = None
if "ATTN_COMPILE_CACHE" not in os.environ:
  _SESSION_CACHE = tempfile.mkdtemp(prefix="attn-test-xla-")
  os.environ["ATTN_COMPILE_CACHE"] = _SESSION_CACHE
  # Programs from 0.1 s up: in a test most programs compile in well under JAX's default second
  # (a smoke rerun: 13 s cold, 7.9 s warm at 0.1 s, 6.4 s at 0). Not every program: each write
  # to a size-limited cache (the lock, attn/common/compile_cache.py) scans the whole directory,
  # and the tests' op-by-op work compiles tens of thousands of tiny programs, which at 0 made
  # late tests up to 50x slower (a 3 s test took 168 s beside 20,000 entries).
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.1")

# XLA:CPU's backend (LLVM) at optimization level 0 for every process of the suite: a smoke run
# compiles its ~60 programs in ~50 s instead of ~120 s, with the same perplexity and BLEU to the
# last digit (the demo preset's 600 steps move its last digits, so its pinned test runs with
# XLA's defaults: tests/test_pinned_results.py). The HLO passes (fusion, layout, buffer
# assignment) still run, so memory figures the tests read are unchanged; the matmuls run in the
# same library calls. Set before any backend starts; a level in the caller's XLA_FLAGS wins.
_OPT_LEVEL = "--xla_backend_optimization_level"
if _OPT_LEVEL not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_OPT_LEVEL}=0".strip()

# And XLA:CPU's elemental emitters for fused loops instead of its MLIR fusion emitters: the tests
# compile thousands of small programs (op by op, and each eager scan), and the MLIR pipeline is
# most of each compile. Measured on 2 cores: the pinned-results, precision, train and model
# tests take 83 s instead of 120 s (compiling 1,054 programs in 30 s instead of 61 s), and the
# smoke preset still reproduces its recorded figures to the last digit; the whole suite took
# 543 s instead of 778 s. Fusion decisions and buffers are the HLO passes', so memory figures
# are unchanged. XLA aborts on a flag it does not know, so a jaxlib without this one (the
# emitters may go) is asked first, once, by the process that starts the suite; its workers
# inherit the answer in XLA_FLAGS.
_EMITTERS = "--xla_cpu_use_fusion_emitters"


def _xla_accepts(flags: str) -> bool:
  import subprocess  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel
  probe = subprocess.run([sys.executable, "-c", "import jax; jax.devices('cpu')"],
                         env={**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"},
                         capture_output=True, timeout=120, check=False)
  return probe.returncode == 0


if _EMITTERS not in os.environ.get("XLA_FLAGS", ""):
  _with_emitters = f"{os.environ['XLA_FLAGS']} {_EMITTERS}=false"
  if _xla_accepts(_with_emitters):
    os.environ["XLA_FLAGS"] = _with_emitters

from attn.common import compile_cache  # pylint: disable=wrong-import-position

if compile_cache.configured_dir():
  import jax  # pylint: disable=wrong-import-position
  if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" in os.environ:  # read by jax only at import
    jax.config.update("jax_persistent_cache_min_compile_time_secs",
                      float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]))
  compile_cache.enable()  # this process's own compilations (in-process training, kernels) too

# The tests sit above every layer: they register the built-in applications, as the entry
# points do.
import attn.apps  # noqa: F401,E402  pylint: disable=wrong-import-position,unused-import
from attn import training  # pylint: disable=wrong-import-position
from experiments.configs import translate as translate_config
from experiments.configs import use_arch


@pytest.fixture(scope="session")
def smoke_bahdanau_workdir(tmp_path_factory):
  """One finished smoke run (decoder=bahdanau, one bucket shape), trained once per session and
  read by the diagnosis and notebook tests (which must not modify its checkpoints)."""
  workdir = str(tmp_path_factory.mktemp("smoke_bahdanau"))
  config = translate_config.get_config("smoke")
  config.model.rnn.decoder = "bahdanau"
  config.data.num_buckets = 1  # one batch shape: one compilation of each function downstream
  training.train_and_evaluate(config, workdir)
  return workdir


@pytest.fixture(scope="session")
def smoke_transformer_workdir(tmp_path_factory):
  """One finished smoke run on a tiny Transformer (2 decoder layers x 2 heads: per-layer and
  per-head attention differ), trained once per session; read by the viewer and diagnosis tests."""
  workdir = str(tmp_path_factory.mktemp("smoke_transformer"))
  config = translate_config.get_config("smoke")
  use_arch(config, "transformer", d_model=16, num_heads=2, d_ff=32)
  config.model.update(dict(enc_layers=1, dec_layers=2))
  config.data.num_buckets = 1
  training.train_and_evaluate(config, workdir)
  return workdir


def pytest_unconfigure(config):
  del config
  if _SESSION_CACHE:  # only the process that made it (the controller under xdist)
    shutil.rmtree(_SESSION_CACHE, ignore_errors=True)
