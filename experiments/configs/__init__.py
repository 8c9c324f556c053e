"""Experiment configs (ml_collections): `<experiment>.py:<preset>` files built from the frozen
dataclasses (attn.data.DataConfig, attn.models.ModelConfig, attn.training.TrainConfig)."""

import ml_collections

from attn.config import configurable
from attn.data import config as data_config
from attn.errors import ConfigError
from attn.models.config import ModelConfig
from attn.training.config import TrainConfig


def from_preset(presets: dict, preset: str, experiment: str) -> ml_collections.ConfigDict:
  """Every field of DataConfig, ModelConfig and TrainConfig at its dataclass default, then the
  preset's overrides: `data` (a data preset name), `data_overrides`, `model`, `train`."""
  if preset not in presets:
    raise ConfigError(f"unknown {experiment} preset {preset!r}; known: {', '.join(sorted(presets))}")
  p = presets[preset]
  c = ml_collections.ConfigDict()
  c.data = data_config.get_config(p["data"])
  c.data.update(p.get("data_overrides", {}))
  c.model = configurable.config_dict(ModelConfig, **p["model"])
  c.train = configurable.config_dict(TrainConfig, **p["train"])
  return c
