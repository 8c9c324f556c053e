"""Data presets: the `data` section of an experiment config, `get_config(preset)` (every
`attn.data.DataConfig` field at its default, then the preset's values).

    from experiments.configs import data as data_presets
    config.data = data_presets.get_config("multi30k")     # inside an experiment's get_config()
    python -m experiments.data_stats --config=experiments/configs/data.py:dates --config.train_size=2000

Presets: multi30k (default, de->en), multi30k_en_de, copy, reverse, dates, numbers, aeslc (local
JSON lines), ted_pt_en, wmt14_de_en, cnn_dailymail, xsum, gigaword, aeslc_tfds (named TFDS
datasets), smoke (a tiny built-in task for CI). The local corpora are read from
$ATTN_SHARED_DATA/<name>, else ../shared/data/<name> (relative to the working directory); <name>
is the dataset `python -m experiments.get_data <name> --dir=DIR` downloads into DIR/<name>, in
the layout the preset reads (then --config.data.dir=DIR/<name>, or ATTN_SHARED_DATA=DIR).
"""

import os

from attn.config import configurable
from attn.data.base import DataError
from attn.data.config import DataConfig

SHARED_DATA_ENV = "ATTN_SHARED_DATA"  # where ../shared/data lives, if not there


def shared_data_dir() -> str:
  """The shared corpora: $ATTN_SHARED_DATA, else ../shared/data (relative to the working directory)."""
  return os.environ.get(SHARED_DATA_ENV, os.path.join("..", "shared", "data"))


PRESETS = {
    "": {},
    "multi30k": {},
    "multi30k_en_de": dict(src_lang="en", tgt_lang="de"),
    "copy": dict(task="copy", tokenizer="space", min_freq=1, max_src_len=64, max_tgt_len=64),
    "reverse": dict(task="reverse", tokenizer="space", min_freq=1, max_src_len=64, max_tgt_len=64),
    "dates": dict(task="dates", tokenizer="char", min_freq=1, max_src_len=48, max_tgt_len=12,
                  num_buckets=4),
    "numbers": dict(task="numbers", tokenizer="space", min_freq=1, max_src_len=32, max_tgt_len=12,
                    num_buckets=4),
    "smoke": dict(task="reverse", tokenizer="space", min_freq=1, train_size=512, eval_size=64,
                  test_size=64, min_len=3, max_len=12, batch_size=16, num_buckets=2,
                  max_src_len=16, max_tgt_len=16),
    "aeslc": dict(task="jsonl", source_field="email", target_field="subject", eval_split="dev",
                  test_split="", max_src_len=512, max_tgt_len=32, too_long="truncate",
                  vocab_size=32_000, shared_vocab=True),
    "ted_pt_en": dict(task="tfds", tfds_name="ted_hrlr_translate/pt_to_en", src_lang="pt",
                      tgt_lang="en", eval_split="validation", test_split="test"),
    "wmt14_de_en": dict(task="tfds", tfds_name="wmt14_translate/de-en", src_lang="de",
                        tgt_lang="en", eval_split="validation", test_split="test",
                        tokenizer="sentencepiece", vocab_size=32_000, shared_vocab=True),
    "cnn_dailymail": dict(task="tfds", tfds_name="cnn_dailymail", eval_split="validation",
                          test_split="test", max_src_len=400, max_tgt_len=100, too_long="truncate",
                          vocab_size=50_000, shared_vocab=True),
    "xsum": dict(task="tfds", tfds_name="xsum", eval_split="validation", test_split="test",
                 max_src_len=400, max_tgt_len=64, too_long="truncate", vocab_size=50_000,
                 shared_vocab=True),
    "gigaword": dict(task="tfds", tfds_name="gigaword", eval_split="validation", test_split="test",
                     max_src_len=64, max_tgt_len=32, too_long="truncate", vocab_size=50_000,
                     shared_vocab=True),
    "aeslc_tfds": dict(task="tfds", tfds_name="aeslc", eval_split="validation", test_split="test",
                       max_src_len=512, max_tgt_len=32, too_long="truncate", vocab_size=32_000,
                       shared_vocab=True),
}
# preset -> its corpus directory under the shared data, named as get_data's dataset
# (attn/data/downloads_catalog.py), whose files the preset's splits name
_PRESET_DIRS = {"": "multi30k", "multi30k": "multi30k", "multi30k_en_de": "multi30k",
                "aeslc": "aeslc"}


def get_config(preset: str = ""):
  """The data ConfigDict (every `DataConfig` field at its default), with `preset` applied.

  Use it as the `data` field of an experiment config: `config.data = get_config("multi30k")`.
  """
  if preset not in PRESETS:
    raise DataError(f"unknown data preset {preset!r}; known: {', '.join(sorted(p for p in PRESETS if p))}")
  values = dict(PRESETS[preset])
  if preset in _PRESET_DIRS:
    values["dir"] = os.path.join(shared_data_dir(), _PRESET_DIRS[preset])
  return configurable.config_dict(DataConfig, **values)
