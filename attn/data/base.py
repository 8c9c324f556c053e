"""Shared constants, the error type and the source registry of the data pipeline.

Nothing here imports tensorflow_datasets, grain or babel, so `from attn.data import base` is cheap.
"""

from __future__ import annotations

from typing import Any, Callable

# Reserved ids, identical in every vocabulary (word, char and sentencepiece).
PAD = 0
BOS = 1
EOS = 2
UNK = 3
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")

# Split roles. Config names the split of each role (`data.train_split` etc.); built-in tasks generate
# the three roles directly.
ROLES = ("train", "eval", "test")


class DataError(Exception):
  """Bad input data or data config: one line that says what and where, meant to end the run early.

  Experiment scripts catch it around `attn.data.load`, print `str(err)` and exit non-zero before
  training starts.
  """


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
