"""The data pipeline's constants (re-exported from attn.data.tokens / attn.errors) and its registry
of data sources.

Nothing here imports tensorflow_datasets, grain or babel, so `from attn.data import base` is cheap.
"""

from __future__ import annotations

import errno
import os

from attn.errors import DataError
from attn.data.tokens import BOS, EOS, PAD, SPECIAL_TOKENS, UNK  # noqa: F401  (re-exported)
from attn.registry import Registry

# Split roles. Config names the split of each role (`data.train_split` etc.); built-in tasks generate
# the three roles directly.
ROLES = ("train", "eval", "test")

# The value of `data.task` -> its source class (see sources.py for the interface, `prepare`).
SOURCES = Registry("data.task", error=DataError)


def register_source(name: str):
  """Class decorator registering a data source under `name` (the value of `data.task`); the class
  learns its name (`cls.name`, for messages)."""

  def decorator(cls):
    SOURCES.add(name, cls)
    cls.name = name
    return cls

  return decorator


# The write errors of a full or unwritable disk (RLIMIT_FSIZE reads as EFBIG).
_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES)


def disk_error(e: BaseException) -> str:
  """The strerror of a disk-full-like error in `e` or its causes ('' if none). TFDS's array_record
  writer reports one as a RuntimeError carrying the C library's message, so that is looked for
  too."""
  while e is not None:
    if isinstance(e, OSError) and e.errno in _DISK_ERRNOS:
      return os.strerror(e.errno)
    for n in _DISK_ERRNOS:
      if os.strerror(n) in str(e):
        return os.strerror(n)
    e = e.__cause__ or e.__context__
  return ""


def disk_full(e: BaseException, what: str) -> DataError:
  """The one line for `e` (disk_error(e) is not empty) met while writing `what`."""
  detail = " ".join(str(e).split())[:300]
  return DataError(f"writing {what} failed: {disk_error(e)} ({type(e).__name__}: {detail}); "
                   "nothing half-written was kept: free space (or set data.cache_dir to a disk "
                   "with room) and rerun the same command")
