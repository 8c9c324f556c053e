"""The data pipeline's constants (re-exported from attn.data.tokens / attn.errors) and its registry
of data sources.

Nothing here imports tensorflow_datasets, grain or babel, so `from attn.data import base` is cheap.
"""

from __future__ import annotations

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
