"""Experiment configs (ml_collections): `<experiment>.py:<preset>` files built from the frozen
dataclasses (attn.data.DataConfig, attn.models.ModelConfig, attn.training.TrainConfig)."""

import ml_collections

from attn.config import configurable
from attn.errors import ConfigError
from attn.models.config import ModelConfig
from attn.training.config import TrainConfig
from experiments.configs import data as data_presets


def from_preset(presets: dict, preset: str, experiment: str) -> ml_collections.ConfigDict:
  """Every field of DataConfig, ModelConfig and TrainConfig at its dataclass default, then the
  preset's overrides: `data` (a data preset name), `data_overrides`, `model` (the shared fields
  and one architecture's section, e.g. `rnn=dict(...)`), `train`."""
  if preset not in presets:
    raise ConfigError(f"unknown {experiment} preset {preset!r}; known: "
                      f"{', '.join(sorted(presets))}")
  p = presets[preset]
  c = ml_collections.ConfigDict()
  c.data = data_presets.get_config(p["data"])
  c.data.update(p.get("data_overrides", {}))
  c.model = configurable.config_dict(ModelConfig, **p["model"])
  c.train = configurable.config_dict(TrainConfig, **p["train"])
  return c


def use_arch(c: ml_collections.ConfigDict, arch: str, **settings) -> ml_collections.ConfigDict:
  """`c` with model.arch = `arch`, the other architectures' sections back at their defaults (a
  preset's RNN sizes do not apply to a Transformer, and a value left there is refused) and
  `settings` set in the chosen architecture's section. Returns c."""
  from attn.models.config import section_names  # pylint: disable=import-outside-toplevel
  c.model.arch = arch
  for name in section_names():
    if name != arch:
      section = ModelConfig.__dataclass_fields__[name].default
      setattr(c.model, name, configurable.config_dict(type(section)))
  getattr(c.model, arch).update(settings)
  return c
