"""Atomic file writes: a reader (a viewer, a resumed run, another process) sees the old file or
the whole new one, never half of it, and a crash leaves no stray temporary file.

    write_json(os.path.join(workdir, "results.json"), results)
    with atomic_path(path) as tmp:          # for writers that take a path (np.savez, orbax, ...)
      np.savez(tmp, **arrays)
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile


def _readable_by_others(path: str) -> None:
  # mkstemp creates 0600, which would hide a record from the other users of a shared workdir.
  umask = os.umask(0)
  os.umask(umask)
  os.chmod(path, 0o666 & ~umask)


@contextlib.contextmanager
def atomic_path(path: str, *, suffix: str = ".tmp"):
  """Yields a temporary path in `path`'s directory; on a clean exit the file written there is
  flushed to disk and renamed over `path`, on an exception it is removed. `suffix` keeps an
  extension a writer insists on (np.savez appends ".npz" to a path without it)."""
  directory = os.path.dirname(os.path.abspath(path))
  fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path), suffix=suffix)
  os.close(fd)
  try:
    _readable_by_others(tmp)
    yield tmp
    with open(tmp, "rb+") as f:
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise


def write_bytes(path: str, data: bytes) -> None:
  """Writes `data` to `path` atomically."""
  with atomic_path(path) as tmp, open(tmp, "wb") as f:
    f.write(data)


def write_text(path: str, text: str) -> None:
  """Writes `text` (UTF-8) to `path` atomically."""
  write_bytes(path, text.encode("utf-8"))


def write_json(path: str, obj, **dump_kw) -> None:
  """Writes `obj` as JSON to `path` atomically (indent 1 unless `dump_kw` says otherwise)."""
  write_text(path, json.dumps(obj, **{"indent": 1, **dump_kw}))


def read_json(path: str, default=None):
  """The JSON value in `path`, or `default` when the file is missing, unreadable or not JSON: a
  run's earlier records are evidence to compare with when present, never a reason to fail."""
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except (OSError, ValueError):
    return default
