"""Settings dataclasses as flags (attn.launching.cli): names, defaults and help from the fields,
nested sections flattened, list elements typed, values validated by the dataclass."""

from __future__ import annotations

import dataclasses

import pytest
from absl import flags

from attn.config.configurable import option
from attn.errors import ConfigError
from attn.launching import cli


@dataclasses.dataclass(frozen=True)
class _Inner:
  object_questions: float = option(0.0, "fraction of object questions")


@dataclasses.dataclass(frozen=True)
class _Settings:
  steps: int = option(30, "timed steps")
  lr: float = option(1e-3, "learning rate")
  fused: bool = option(False, "use the kernels")
  score: str = option("dot", "a score")
  temperatures: tuple[float, ...] = option((0.5, 2.0), "temperatures")
  normalizers: tuple[str, ...] = option(("softmax",), "normalizers")
  inner: _Inner = option(_Inner(), "a nested section")
  workdir: str = option("", "derived by the entry point", derived=True)

  def __post_init__(self):
    if self.steps < 1:
      raise ConfigError(f"--steps must be positive, got {self.steps}")


def _parse(argv):
  fv = flags.FlagValues()
  cli.define_settings_flags(_Settings, flag_values=fv)
  fv(["prog", *argv])
  return fv


def test_defaults_and_help_come_from_the_fields():
  fv = _parse([])
  assert fv["steps"].default == 30 and fv["steps"].help == "timed steps"
  assert "workdir" not in fv  # derived: not a flag
  assert cli.settings_from_flags(_Settings, flag_values=fv) == _Settings()


def test_flags_set_fields_nested_sections_and_typed_lists():
  fv = _parse(["--steps=7", "--lr=0.5", "--fused", "--score=additive", "--temperatures=0.1,10",
               "--normalizers=softmax,sparsemax", "--object_questions=0.25"])
  got = cli.settings_from_flags(_Settings, flag_values=fv, workdir="w")
  assert got == _Settings(steps=7, lr=0.5, fused=True, score="additive", temperatures=(0.1, 10.0),
                          normalizers=("softmax", "sparsemax"), inner=_Inner(0.25), workdir="w")


def test_bad_values_are_config_errors_naming_the_flag():
  with pytest.raises(ConfigError, match="--temperatures"):
    cli.settings_from_flags(_Settings, flag_values=_parse(["--temperatures=0.1,hot"]))
  with pytest.raises(ConfigError, match="--steps must be positive"):
    cli.settings_from_flags(_Settings, flag_values=_parse(["--steps=0"]))
  with pytest.raises(flags.IllegalFlagValueError):
    _parse(["--steps=many"])


@dataclasses.dataclass(frozen=True)
class _Optional:
  value_dim: int | None = option(None, "dv; None: the kernel's default")
  budget_gib: float | None = option(None, "memory budget")
  name: str | None = option(None, "file stem")
  causal: tuple[bool, ...] = option((False,), "causal settings")


def test_none_defaults_take_their_flag_type_from_the_annotation_and_bools_parse():
  fv = flags.FlagValues()
  cli.define_settings_flags(_Optional, flag_values=fv)
  assert fv["causal"].default == ["false"]  # as one would type it
  fv(["prog"])
  assert cli.settings_from_flags(_Optional, flag_values=fv) == _Optional()
  fv = flags.FlagValues()
  cli.define_settings_flags(_Optional, flag_values=fv)
  fv(["prog", "--value_dim=32", "--budget_gib=0.5", "--name=x", "--causal=false,TRUE,1"])
  assert cli.settings_from_flags(_Optional, flag_values=fv) == _Optional(32, 0.5, "x",
                                                                         (False, True, True))
  with pytest.raises(flags.IllegalFlagValueError):  # an integer flag, not a string one
    fv2 = flags.FlagValues()
    cli.define_settings_flags(_Optional, flag_values=fv2)
    fv2(["prog", "--value_dim=wide"])
  fv(["prog", "--causal=false,maybe"])
  with pytest.raises(ConfigError, match="--causal: false,maybe are not all bool values"):
    cli.settings_from_flags(_Optional, flag_values=fv)
