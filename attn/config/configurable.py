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

# A dotted config key that moved -> where it is now ("model.decoder" -> "model.rnn.decoder"),
# filled by the modules whose settings moved; command-line errors name the new place.
MOVED: dict[str, str] = {}


def option(default: Any, help: str, *, derived: bool = False, names=None,  # pylint: disable=redefined-builtin
           also: tuple = ()):
  """A dataclass field with its one-line help (shown in config files) and its default.

  names: the registry (an `attn.registry.Registry`, or anything with `names()`; or a function
  of no arguments returning one, called when a value is checked, for a registry whose module is
  imported only when it is named) whose entries the field's value names; a tuple of strings
  names one entry each. also: values accepted besides the registry's names (e.g. "auto", "")."""
  return dataclasses.field(default=default, metadata={"help": help, "derived": derived,
                                                      "names": names, "also": tuple(also)})


def settable_fields(cls) -> list[dataclasses.Field]:
  """The fields a user sets through the config (derived ones excluded)."""
  return [f for f in dataclasses.fields(cls) if f.init and not f.metadata.get("derived")]


def help_of(cls) -> dict[str, str]:
  """Field name -> one-line help, for listings and config docs."""
  return {f.name: f.metadata.get("help", "") for f in settable_fields(cls)}


def is_section(default) -> bool:
  """A field whose default is a dataclass instance is a nested section of the config."""
  return dataclasses.is_dataclass(default) and not isinstance(default, type)


def _settable_values(obj) -> dict:
  return {f.name: getattr(obj, f.name) for f in settable_fields(type(obj))}


def _takes_several_types(field: dataclasses.Field) -> bool:
  """A field annotated with a union of types besides None (`bool | str`). Annotations are strings
  under `from __future__ import annotations`."""
  kinds = {t.strip() for t in str(field.type).split("|")} - {"None", "NoneType"}
  return len(kinds) > 1


def config_dict(cls, **overrides):
  """An ml_collections ConfigDict holding every settable field of `cls` at its default, then
  `overrides` (unknown names are refused: a preset cannot invent a field). A field whose default
  is a dataclass instance becomes a nested ConfigDict of that dataclass's fields (so
  `--config.model.transformer.cross.scope=topk` works); its override is a dict of some of those fields."""
  import ml_collections  # pylint: disable=import-outside-toplevel
  fields = {f.name: f for f in settable_fields(cls)}
  defaults = {name: f.default for name, f in fields.items()}
  unknown = sorted(set(overrides) - set(defaults))
  if unknown:
    raise ConfigError(f"unknown {cls.__name__} fields {unknown}; "
                      f"known: {', '.join(sorted(defaults))}")
  cfg = ml_collections.ConfigDict()
  for k, default in defaults.items():
    v = overrides.get(k, default)
    if is_section(default):  # overridden by an instance, or by a dict of some of its fields
      values = _settable_values(v) if is_section(v) else {**_settable_values(default),
                                                           **as_dict(v)}
      v = config_dict(type(default), **values)
    v = tuple(v) if isinstance(v, list) else v
    if _takes_several_types(fields[k]):
      # ml_collections types a command-line override by the default's type: a bool default
      # would make `--config.model.fused=triton` a "Non-boolean argument to boolean flag". An
      # `object` field is parsed as a Python literal instead (true/True/False -> bool, any other
      # word a string); the dataclass then checks the value.
      v = ml_collections.FieldReference(v, field_type=object)
    setattr(cfg, k, v)
  return cfg


def as_dict(cfg) -> dict:
  """A plain dict from a ConfigDict, a dict or a dataclass instance."""
  if dataclasses.is_dataclass(cfg):
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
  return dict(cfg.to_dict() if hasattr(cfg, "to_dict") else cfg)


def _is_str_tuple(field: dataclasses.Field) -> bool:
  # Annotations are strings under `from __future__ import annotations`.
  return field.type in ("tuple[str, ...]", tuple[str, ...])


def split_commas(value) -> tuple[str, ...]:
  """("a", "b") from "a,b", ("a,b",) or ["a", "b"]; blanks dropped, so "" gives ().

  ml_collections parses `--config.x=a,b` for a tuple field as the one string ("a,b",) (a bare
  name is not a Python literal), so a comma list must be split here to work from the command line.
  """
  out = []
  for item in [value] if isinstance(value, str) else value:
    if isinstance(item, str):
      out += [p.strip() for p in item.split(",") if p.strip()]
    else:
      out.append(item)  # not a string: left for the dataclass's validation to refuse
  return tuple(out)


def _registry(field: dataclasses.Field):
  """The registry `field`'s value names (option(names=...)), or None."""
  names = field.metadata.get("names")
  if names is None or hasattr(names, "names"):
    return names
  return names()


def _value(cfg, name: str, missing):
  if isinstance(cfg, dict):
    return cfg.get(name, missing)
  if hasattr(cfg, "to_dict"):  # an ml_collections ConfigDict
    return cfg[name] if name in cfg else missing
  return getattr(cfg, name, missing)


def check_names(cls, cfg, *, section: str, error: type[Exception] = ConfigError) -> None:
  """Refuses, with `error` naming the dotted field, the value and the registry's known names,
  the first value of `cfg` (a ConfigDict, a dict or a `cls` instance) that a field of dataclass
  `cls` declares as a registry name (`option(names=...)`) and the registry does not hold.
  Nested sections are checked under `section.field`; fields `cfg` leaves out, and values that
  are not strings (left to the dataclass's own validation), are not checked."""
  missing = object()
  for field in settable_fields(cls):
    value = _value(cfg, field.name, missing)
    if value is missing or value is None:
      continue
    if is_section(field.default):
      check_names(type(field.default), value, section=f"{section}.{field.name}", error=error)
      continue
    if field.metadata.get("names") is None:
      continue
    if _is_str_tuple(field) and isinstance(value, (str, list, tuple)):
      values = split_commas(value)  # (a comma string from the command line, as from_config)
    else:
      values = value if isinstance(value, (list, tuple)) else (value,)
    also = field.metadata.get("also", ())
    names = [v for v in values if isinstance(v, str) and v not in also]
    if not names:
      continue
    known = list(_registry(field).names())  # (resolved only now: it may import its module)
    for v in names:
      if v not in known:
        raise error(f"unknown {section}.{field.name} {v!r}; known: "
                    f"{', '.join(repr(k) if not k else k for k in (*also, *known))}")


def from_config(cls, cfg, *, section: str, error: type[Exception] = ConfigError, **derived):
  """`cls(**cfg, **derived)`: unknown fields raise `error` naming the section; lists become tuples
  where the field's default is a tuple, and `tuple[str, ...]` fields also take a comma string
  (`split_commas`); nested sections (dataclass-valued fields) are built the same way, their
  unknown fields named as `section.field`. Validation is the dataclass's own `__post_init__`."""
  given = as_dict(cfg)
  fields = {f.name: f for f in settable_fields(cls)}
  unknown = sorted(set(given) - set(fields))
  if unknown:
    raise error(f"unknown {section} config fields {unknown}; known: {', '.join(sorted(fields))}")
  for k, v in given.items():
    if is_section(fields[k].default) and not is_section(v):
      given[k] = from_config(type(fields[k].default), v, section=f"{section}.{k}", error=error)
    elif _is_str_tuple(fields[k]) and isinstance(v, (str, list, tuple)):
      given[k] = split_commas(v)
    elif isinstance(fields[k].default, tuple) and isinstance(v, list):
      given[k] = tuple(v)
  return cls(**given, **derived)
