"""The persistent XLA compilation cache that every entry point turns on, and a count of what it
saved.

A run compiles its train step once per bucket shape and its decoders once per batch shape: on two
CPU cores that is minutes before the first steady step. Kept on disk, those programs load in a
fraction of a second in every later process on the machine: a resumed run, the next point of a
sweep with the same shapes, a rerun, the test suite's subprocesses.

    ATTN_COMPILE_CACHE=/path   the directory (default: $XDG_CACHE_HOME/attn/xla, ~/.cache/attn/xla)
    ATTN_COMPILE_CACHE=off     no persistent cache

JAX's own JAX_COMPILATION_CACHE_DIR, when set, is left to JAX. Entries are keyed on the program,
the jax and jaxlib versions, the backend, the devices and the XLA flags, so an entry is only ever
loaded by the program it was compiled from. Programs that compile in under MIN_COMPILE_S are not
written (JAX's threshold, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS, which wins where set):
JAX's default second left out the programs of the small models' sweeps (a reader's 50 steps a
call compile in 0.8-0.9 s, its loss in 0.4-0.5 s), which then compiled in every rerun, while
loading them takes a few hundredths; op-by-op programs (well under 0.1 s each) stay out. Nor
does JAX keep a program that calls back into Python (the Transformer decoder's cache-overrun
check): those compile in every process.

Several processes share one directory (a sweep's runs, `launch --parallel`, the test suite's
workers and subprocesses). JAX's file cache takes its lock (a `filelock` on `<dir>/.lockfile`)
only when the cache has a size limit; without one, two processes compiling the same program both
write its entry, each truncating the file the other is writing, while a third may read it
half-written. A compressor without a checksum (zstandard, where installed) then hands damaged
bytes to XLA's deserializer, which aborts the process. So the cache always has a limit,
MAX_BYTES (least recently used entries are evicted past it), and every read and write holds the
lock. An entry left short by a killed process fails to decompress and is compiled again.
JAX writes an entry's bytes, then its access time (`<key>-atime`, beside `<key>-cache`); a write
cut between the two (a full disk, a kill) leaves an entry with no access time, and JAX's eviction
scan, which every later write runs, then fails on it: no process writes to that directory again,
and each compile prints a warning. `enable` removes such entries first (`repair`).
The price of the limit: every write scans the directory (JAX sizes it for eviction), so the cost
of a write grows with the entries. Programs of a second or more stay in the thousands within
MAX_BYTES; a threshold of 0 with op-by-op work writes tens of thousands of tiny programs, and a
write then takes seconds (the test suite keeps 0.1 s: tests/conftest.py).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import threading

ENV = "ATTN_COMPILE_CACHE"
# The cache's size limit: what turns JAX's inter-process lock on, and bounds the directory.
MAX_BYTES = 4 << 30
# The shortest compile whose program is written (module docstring).
MIN_COMPILE_S = 0.2
_MIN_COMPILE_ENV = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"
OFF = ("off", "none", "0", "false", "")
_ENTRY, _ACCESS_TIME = "-cache", "-atime"  # JAX's names for an entry's two files

_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"  # compiles and cache loads alike
_HIT_EVENT = "/jax/compilation_cache/cache_hits"
_SAVED_EVENT = "/jax/compilation_cache/compile_time_saved_sec"
_WRITE_EVENT = "/jax/compilation_cache/cache_misses"  # recorded when an entry is written


def default_dir(environ=None) -> str:
  environ = os.environ if environ is None else environ
  base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "attn", "xla")


def configured_dir(environ=None) -> str | None:
  """The cache directory the environment asks for; None when it turns the cache off or leaves
  it to JAX_COMPILATION_CACHE_DIR."""
  environ = os.environ if environ is None else environ
  if environ.get("JAX_COMPILATION_CACHE_DIR"):
    return None
  value = environ.get(ENV)
  if value is None:
    return default_dir(environ)
  return None if value.strip().lower() in OFF else os.path.expanduser(value)


@dataclasses.dataclass
class CompileStats:
  """What the process compiled so far: programs and seconds (cache loads included), of which
  loaded from the persistent cache (and the compile seconds that saved), and entries written."""
  programs: int = 0
  seconds: float = 0.0
  loaded: int = 0
  saved_s: float = 0.0
  written: int = 0

  def __sub__(self, other: "CompileStats") -> "CompileStats":
    return CompileStats(*(a - b for a, b in zip(dataclasses.astuple(self),
                                                dataclasses.astuple(other))))

  def summary(self) -> str:
    text = f"XLA compiled {self.programs} programs in {self.seconds:.1f} s"
    if self.loaded:
      text += (f"; {self.loaded} of them loaded from the compilation cache "
               f"(saving ~{max(self.saved_s, 0.0):.0f} s)")
    if self.written:
      text += f"; {self.written} written to it"
    return text


_stats = CompileStats()
_lock = threading.Lock()
_listening = False


def _on_event(event: str, **_):
  if event in (_HIT_EVENT, _WRITE_EVENT):
    with _lock:
      if event == _HIT_EVENT:
        _stats.loaded += 1
      else:
        _stats.written += 1


def _on_duration(event: str, seconds: float, **_):
  if event in (_COMPILE_EVENT, _SAVED_EVENT):
    with _lock:
      if event == _COMPILE_EVENT:
        _stats.programs += 1
        _stats.seconds += seconds
      else:
        _stats.saved_s += seconds


def count_compiles() -> None:
  """Starts counting this process's compilations (idempotent); read them with `stats()`."""
  global _listening
  from jax import monitoring  # pylint: disable=import-outside-toplevel
  with _lock:
    if _listening:
      return
    _listening = True
  monitoring.register_event_listener(_on_event)
  monitoring.register_event_duration_secs_listener(_on_duration)


def stats() -> CompileStats:
  """A snapshot of the counts since `count_compiles()`."""
  with _lock:
    return dataclasses.replace(_stats)


def repair(directory: str, timeout_s: float = 10.0) -> list[str]:
  """Removes the entries of `directory` whose write was cut short before JAX wrote their access
  time (module docstring), holding the cache's lock; returns their keys. Such an entry is
  suspect (its bytes may be cut short too) and is simply compiled again. A lock still held after
  `timeout_s` leaves the directory as it is."""
  import filelock  # pylint: disable=import-outside-toplevel  (JAX's own lock, a dependency of it)
  try:
    with filelock.FileLock(os.path.join(directory, ".lockfile"), timeout=timeout_s):
      names = set(os.listdir(directory))
      cut = sorted(n[:-len(_ENTRY)] for n in names
                   if n.endswith(_ENTRY) and n[:-len(_ENTRY)] + _ACCESS_TIME not in names)
      for key in cut:
        pathlib.Path(directory, key + _ENTRY).unlink(missing_ok=True)
  except (filelock.Timeout, OSError):
    return []
  return cut


def enable(directory: str | None = None) -> str | None:
  """Turns the persistent cache on in `directory` (default: `configured_dir()`) and starts the
  count; returns the directory, or None when the cache stays off. Call before the first
  compilation; JAX reads the setting when it first compiles."""
  import jax  # pylint: disable=import-outside-toplevel
  count_compiles()
  directory = configured_dir() if directory is None else directory
  if not directory:
    return None
  try:
    os.makedirs(directory, exist_ok=True)
  except OSError:
    return None  # a read-only home: run without the cache rather than fail
  repair(directory)
  jax.config.update("jax_compilation_cache_dir", directory)
  jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)  # the lock (module docstring)
  if not os.environ.get(_MIN_COMPILE_ENV):
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_S)
  return directory
