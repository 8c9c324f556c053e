"""The data pipeline's constants (re-exported from attn.data.tokens / attn.errors) and its source registry of the data pipeline.

Nothing here imports tensorflow_datasets, grain or babel, so `from attn.data import base` is cheap.
"""

from __future__ import annotations

from typing import Any, Callable

from attn.errors import DataError  # noqa: F401  (re-exported)
from attn.data.tokens import BOS, EOS, PAD, SPECIAL_TOKENS, UNK  # noqa: F401  (re-exported)

# Split roles. Config names the split of each role (`data.train_split` etc.); built-in tasks generate
# the three roles directly.
ROLES = ("train", "eval", "test")


# name -> source class; see pipeline.py for the interface (`prepare`).
SOURCES: dict[str, Callable[..., Any]] = {}


def register_source(name: str):
  """Class decorator registering a data source under `name` (the value of `data.task`)."""

  def decorator(cls):
    if name in SOURCES:
      raise ValueError(f"data source {name!r} is already registered")
    SOURCES[name] = cls
    cls.name = name
    return cls

  return decorator


def get_source(name: str):
  """The source class registered as `name`; unknown names fail with the known ones."""
  if name not in SOURCES:
    raise DataError(f"unknown data.task {name!r}; known: {', '.join(sorted(SOURCES))}")
  return SOURCES[name]
