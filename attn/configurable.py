"""Frozen dataclasses as the one home of every setting, and the ml_collections configs built from them.

A setting is a dataclass field; its default lives there and nowhere else. Experiment configs start
from `config_dict(Cls)` and presets only override; `from_config(Cls, cfg)` is the one way back, and
rejects unknown fields. Fields whose value comes from elsewhere (a vocabulary size read from the
data) are marked `derived` and left out of the user-facing config.

    @dataclasses.dataclass(frozen=True)
    class TrainConfig:
      steps: int = option(2000, "optimizer steps")
"""

from __future__ import annotations

import dataclasses
from typing import Any

from attn.errors import ConfigError


def option(default: Any, help: str, *, derived: bool = False):  # pylint: disable=redefined-builtin
  """A dataclass field with its one-line help (shown in config files) and its default."""
  return dataclasses.field(default=default, metadata={"help": help, "derived": derived})


def settable_fields(cls) -> list[dataclasses.Field]:
  """The fields a user sets through the config (derived ones excluded)."""
  return [f for f in dataclasses.fields(cls) if f.init and not f.metadata.get("derived")]


def help_of(cls) -> dict[str, str]:
  """Field name -> one-line help, for listings and config docs."""
  return {f.name: f.metadata.get("help", "") for f in settable_fields(cls)}


def config_dict(cls, **overrides):
  """An ml_collections ConfigDict holding every settable field of `cls` at its default, then
  `overrides` (unknown names are refused: a preset cannot invent a field)."""
  import ml_collections  # pylint: disable=import-outside-toplevel
  values = {f.name: f.default for f in settable_fields(cls)}
  unknown = sorted(set(overrides) - set(values))
  if unknown:
    raise ConfigError(f"unknown {cls.__name__} fields {unknown}; known: {', '.join(sorted(values))}")
  values.update(overrides)
  cfg = ml_collections.ConfigDict()
  for k, v in values.items():
    setattr(cfg, k, tuple(v) if isinstance(v, list) else v)
  return cfg


def as_dict(cfg) -> dict:
  """A plain dict from a ConfigDict, a dict or a dataclass instance."""
  if dataclasses.is_dataclass(cfg):
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
  return dict(cfg.to_dict() if hasattr(cfg, "to_dict") else cfg)


def from_config(cls, cfg, *, section: str, error: type[Exception] = ConfigError, **derived):
  """`cls(**cfg, **derived)`: unknown fields raise `error` naming the section; lists become tuples
  where the field's default is a tuple. Validation is the dataclass's own `__post_init__`."""
  given = as_dict(cfg)
  fields = {f.name: f for f in settable_fields(cls)}
  unknown = sorted(set(given) - set(fields))
  if unknown:
    raise error(f"unknown {section} config fields {unknown}; known: {', '.join(sorted(fields))}")
  for k, v in given.items():
    if isinstance(fields[k].default, tuple) and isinstance(v, list):
      given[k] = tuple(v)
  return cls(**given, **derived)
