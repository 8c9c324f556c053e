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
and each compile prints a warning. `enable` removes such entries first (`repair`). An entry
whose bytes were cut short with its access time intact fails to decompress when it is read: the
cache this module gives JAX (`_CheckedCache`) checks every entry it reads, removes one that does
not decompress (one warning line) and lets the compile that follows write it again; JAX alone
would warn and compile it in every later process, never replacing it. That cache also counts
the entries it writes: JAX's own event fires before its write, also when another process's
entry already stands there and nothing is written.
A directory this process cannot write (a shared read-only cache, another user's) is no cache:
every read and write would first try to create its lock, and fail or wait; `enable` tries to
create a file there and the lock, and where either fails runs without the cache, with one
warning line saying why.
The price of the limit: every write scans the directory (JAX sizes it for eviction), so the cost
of a write grows with the entries. Programs of a second or more stay in the thousands within
MAX_BYTES; a threshold of 0 with op-by-op work writes tens of thousands of tiny programs, and a
write then takes seconds (the test suite keeps 0.1 s: tests/conftest.py).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import sys
import tempfile
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
# Whether writes are counted by _CheckedCache, where they happen, rather than by JAX's event,
# which fires before its write whether or not the write happens (module docstring).
_counting_writes = False


def _on_event(event: str, **_):
  if event == _HIT_EVENT or (event == _WRITE_EVENT and not _counting_writes):
    with _lock:
      if event == _HIT_EVENT:
        _stats.loaded += 1
      else:
        _stats.written += 1


def _count_write():
  with _lock:
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


def unwritable(directory: str) -> str | None:
  """Why this process cannot keep a cache in `directory`, or None when it can: it creates (and
  removes) a file there, and opens the cache's lock file as JAX's lock does. Trying beats asking
  (os.access): root passes every permission check, yet not a read-only mount or a lock path
  that is a directory."""
  try:
    fd, probe = tempfile.mkstemp(prefix=".probe-", dir=directory)
    os.close(fd)
    os.unlink(probe)
    os.close(os.open(os.path.join(directory, ".lockfile"), os.O_RDWR | os.O_CREAT, 0o644))
  except OSError as e:
    return f"{type(e).__name__}: {e.strerror or e}" + (f": {e.filename}" if e.filename else "")
  return None


def _intact(value: bytes) -> bool:
  """Whether a cache entry's bytes decompress (an entry cut short does not)."""
  from jax._src import compilation_cache as jax_cache  # pylint: disable=import-outside-toplevel
  try:
    jax_cache.decompress_executable(value)
  except Exception:  # pylint: disable=broad-except  # zstandard and zlib raise their own errors
    return False
  return True


def _checked_cache_class():
  """_CheckedCache: JAX's LRU file cache, which removes an entry that does not decompress when
  it reads it (JAX then compiles and writes it again) and counts the entries it writes (module
  docstring). Defined on first use: importing this module imports no jax."""
  from jax._src import lru_cache  # pylint: disable=import-outside-toplevel

  class _CheckedCache(lru_cache.LRUCache):

    def _entry(self, key: str) -> pathlib.Path:
      return pathlib.Path(str(self.path), key + _ENTRY)

    def get(self, key: str) -> bytes | None:
      value = super().get(key)
      if value is None or _intact(value):
        return value
      with self.lock.acquire(timeout=self.lock_timeout_secs):
        self._entry(key).unlink(missing_ok=True)
        pathlib.Path(str(self.path), key + _ACCESS_TIME).unlink(missing_ok=True)
      print(f"warning: compilation cache entry {key} in {self.path} was damaged (it does not "
            "decompress): removed, compiling it again", file=sys.stderr)
      return None

    def put(self, key: str, value: bytes) -> None:
      with self.lock.acquire(timeout=self.lock_timeout_secs):  # reentrant: put takes it again
        stood = self._entry(key).exists()
        super().put(key, value)
        if not stood and self._entry(key).exists():
          _count_write()

  return _CheckedCache


def _use_checked_cache() -> None:
  """Has JAX build its file cache as a _CheckedCache (it builds it at its first compilation,
  from its settings, through `get_file_cache`); idempotent."""
  global _counting_writes
  from jax._src import compilation_cache as jax_cache  # pylint: disable=import-outside-toplevel
  if getattr(jax_cache.get_file_cache, "checked", False):
    return
  from jax import config  # pylint: disable=import-outside-toplevel
  original, cls = jax_cache.get_file_cache, _checked_cache_class()

  def get_file_cache(path):
    if config.jax_compilation_cache_check_contents or config.jax_compilation_cache_max_size == -1:
      return original(path)  # JAX's verifying cache, or no lock: left as JAX builds it
    global _counting_writes  # pylint: disable=global-statement
    _counting_writes = True
    return cls(path, max_size=config.jax_compilation_cache_max_size), path

  get_file_cache.checked = True
  jax_cache.get_file_cache = get_file_cache


def enable(directory: str | None = None) -> str | None:
  """Turns the persistent cache on in `directory` (default: `configured_dir()`) and starts the
  count; returns the directory, or None when the cache stays off (also where the directory
  cannot be written: one warning line says why). Call before the first compilation; JAX reads
  the setting when it first compiles."""
  import jax  # pylint: disable=import-outside-toplevel
  count_compiles()
  directory = configured_dir() if directory is None else directory
  if not directory:
    return None
  try:
    os.makedirs(directory, exist_ok=True)
  except OSError:
    return None  # a read-only home: run without the cache rather than fail
  why = unwritable(directory)
  if why:
    print(f"warning: the compilation cache {directory} cannot be written ({why}): running "
          f"without it (set {ENV}=off, or to a directory this user can write)", file=sys.stderr)
    return None
  repair(directory)
  _use_checked_cache()
  jax.config.update("jax_compilation_cache_dir", directory)
  jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)  # the lock (module docstring)
  if not os.environ.get(_MIN_COMPILE_ENV):
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_S)
  return directory
