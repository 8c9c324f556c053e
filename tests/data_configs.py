"""Data configs for tests: a named preset pointed at a corpus the test wrote."""

from experiments.configs import data as data_presets


def corpus_config(preset, tmp, corpus_dir, **overrides):
  """The `preset` data ConfigDict reading `corpus_dir`, caching under `tmp`/cache, batches of 2,
  then `overrides`."""
  cfg = data_presets.get_config(preset)
  cfg.dir, cfg.cache_dir, cfg.batch_size = str(corpus_dir), str(tmp / "cache"), 2
  cfg.update(overrides)
  return cfg
