"""Data config: the ml_collections `get_config(preset)` users edit, and the frozen `DataConfig`.

    from attn.data import config as data_config
    config.data = data_config.get_config("multi30k")      # inside an experiment's get_config()
    python -m attn.data.stats --config=attn/data/config.py:dates --config.train_size=2000

`DataConfig.from_config` is the one boundary from the ConfigDict to code: it validates every field
once and fails with a `DataError` naming the field and the allowed values.

Presets (the argument of `get_config`): multi30k (default, de->en), multi30k_en_de, copy, reverse,
dates, numbers, aeslc (local JSON lines), ted_pt_en, wmt14_de_en, cnn_dailymail, xsum, gigaword,
aeslc_tfds (named TFDS datasets), smoke (a tiny built-in task for CI).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from attn.data.base import DataError

SHARED_DATA_ENV = "ATTN_SHARED_DATA"  # where ../shared/data lives, if not there


def shared_data_dir() -> str:
  """The shared corpora: $ATTN_SHARED_DATA, else ../shared/data (relative to the working directory)."""
  return os.environ.get(SHARED_DATA_ENV, os.path.join("..", "shared", "data"))


_DEFAULTS: dict[str, tuple[Any, str]] = {
    # name: (default, comment)
    "task": ("parallel_text", "copy | reverse | dates | numbers | parallel_text | jsonl | tfds"),
    "dir": ("", "parallel_text/jsonl: directory of <split>.<lang>[.gz] or <split>.jsonl[.gz]"),
    "src_lang": ("de", "parallel_text/tfds translation: source language (file suffix)"),
    "tgt_lang": ("en", "parallel_text/tfds translation: target language"),
    "train_split": ("train", "split names (files <dir>/<split>.<lang>[.gz]); ignored by built-in tasks"),
    "eval_split": ("val", "evaluated during training; '' for none"),
    "test_split": ("test_2016_flickr", "scored at the end; '' for none"),
    "src_field": ("", "jsonl/tfds: source field (tfds: '' = the dataset's default)"),
    "tgt_field": ("", "jsonl/tfds: target field"),
    "tfds_name": ("", "tfds: e.g. 'ted_hrlr_translate/pt_to_en' (prepared as array_record)"),
    "tfds_data_dir": ("", "tfds: data_dir of the prepared dataset ('' = TFDS default)"),
    "cache_dir": ("", "where built-in tasks and local corpora are written as TFDS array_record "
                      "('' = <workdir>/data_cache, or a temp dir without workdir)"),
    # tokenization and vocabulary
    "tokenizer": ("word", "word | space | char | sentencepiece (built-in tasks fix their own)"),
    "lowercase": (False, "lowercase before tokenizing (score with sacreBLEU lowercase=True)"),
    "shared_vocab": (False, "one vocabulary for source and target"),
    "vocab_size": (0, "cap on vocabulary size incl. the 4 specials (0 = none; sentencepiece: 8000)"),
    "min_freq": (2, "tokens seen fewer times in the training split map to <unk>"),
    # lengths and bad input
    "max_src_len": (128, "longest source row, EOS included"),
    "max_tgt_len": (128, "longest target row, EOS included"),
    "too_long": ("drop", "training pairs over a max: drop | truncate | error (eval/test truncate)"),
    "empty": ("drop", "training pairs with an empty side: drop | error (eval/test keep them)"),
    # batching
    "batch_size": (64, "sentences per training batch (per bucket if tokens_per_batch > 0)"),
    "eval_batch_size": (0, "sentences per eval/test batch (0 = batch_size)"),
    "tokens_per_batch": (0, "if > 0, each bucket's batch size is tokens_per_batch // its src+tgt width"),
    "bucket_boundaries": ((), "bucket shapes: (src_width, tgt_width) pairs or widths b = (b, b), "
                              "EOS incl.; () = chosen from the data"),
    "num_buckets": (8, "with bucket_boundaries=(): how many buckets to choose"),
    "length_multiple": (4, "bucket widths are multiples of this (keeps shapes friendly to kernels)"),
    "seed": (0, "shuffling and generation seed"),
    "num_threads": (2, "grain threads reading and collating training batches (0 = in the caller)"),
    "prefetch": (8, "training batches prepared ahead"),
    # built-in tasks
    "train_size": (50_000, "built-in tasks: training examples"),
    "eval_size": (1_000, "built-in tasks: eval examples"),
    "test_size": (1_000, "built-in tasks: test examples"),
    "min_len": (0, "copy/reverse: tokens; numbers: digits (0 = task default: 5 / 1)"),
    "max_len": (0, "copy/reverse: tokens; numbers: digits (0 = task default: 50 / 9)"),
    "eval_min_len": (0, "eval/test lengths (0 = same as training), for length generalization"),
    "eval_max_len": (0, "eval/test max length (0 = same as training)"),
    "task_vocab_size": (20, "copy/reverse: number of distinct symbols"),
    "languages": ((), "dates: babel locales; numbers: en/fr/de; () = task default"),
    "date_formats": ((), "dates: CLDR format names/skeletons; () = task default"),
    "min_year": (1950, "dates: first year"),
    "max_year": (2049, "dates: last year (2-digit years are used only if the range spans < 100)"),
}

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
    "aeslc": dict(task="jsonl", src_field="email", tgt_field="subject", eval_split="dev",
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
_PRESET_DIRS = {"": "multi30k", "multi30k": "multi30k", "multi30k_en_de": "multi30k",
                "aeslc": "aeslc"}


def get_config(preset: str = ""):
  """The data ConfigDict (fields and defaults in `_DEFAULTS`), with `preset` applied.

  Use it as the `data` field of an experiment config: `config.data = get_config("multi30k")`.
  """
  import ml_collections  # pylint: disable=import-outside-toplevel

  if preset not in PRESETS:
    raise DataError(f"unknown data preset {preset!r}; known: {', '.join(sorted(p for p in PRESETS if p))}")
  values = {k: v for k, (v, _) in _DEFAULTS.items()}
  values.update(PRESETS[preset])
  if preset in _PRESET_DIRS:
    values["dir"] = os.path.join(shared_data_dir(), _PRESET_DIRS[preset])
  cfg = ml_collections.ConfigDict()
  for k, v in values.items():
    # Tuples would become lists in some ConfigDict paths; keep them tuples of the right type.
    setattr(cfg, k, tuple(v) if isinstance(v, (list, tuple)) else v)
  return cfg


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """Validated, immutable data settings (field meanings: `_DEFAULTS`)."""
  task: str = "parallel_text"
  dir: str = ""
  src_lang: str = "de"
  tgt_lang: str = "en"
  train_split: str = "train"
  eval_split: str = "val"
  test_split: str = "test_2016_flickr"
  src_field: str = ""
  tgt_field: str = ""
  tfds_name: str = ""
  tfds_data_dir: str = ""
  cache_dir: str = ""
  tokenizer: str = "word"
  lowercase: bool = False
  shared_vocab: bool = False
  vocab_size: int = 0
  min_freq: int = 2
  max_src_len: int = 128
  max_tgt_len: int = 128
  too_long: str = "drop"
  empty: str = "drop"
  batch_size: int = 64
  eval_batch_size: int = 0
  tokens_per_batch: int = 0
  bucket_boundaries: tuple[tuple[int, int], ...] = ()
  num_buckets: int = 8
  length_multiple: int = 4
  seed: int = 0
  num_threads: int = 2
  prefetch: int = 8
  train_size: int = 50_000
  eval_size: int = 1_000
  test_size: int = 1_000
  min_len: int = 0
  max_len: int = 0
  eval_min_len: int = 0
  eval_max_len: int = 0
  task_vocab_size: int = 20
  languages: tuple[str, ...] = ()
  date_formats: tuple[str, ...] = ()
  min_year: int = 1950
  max_year: int = 2049

  @classmethod
  def from_config(cls, config) -> "DataConfig":
    """From a ConfigDict / dict / DataConfig; unknown fields and bad values raise DataError."""
    if isinstance(config, DataConfig):
      return config
    d = dict(config.to_dict() if hasattr(config, "to_dict") else config)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - names)
    if unknown:
      raise DataError(f"unknown data config fields {unknown}; known: {', '.join(sorted(names))}")
    for k in ("languages", "date_formats"):
      if k in d and d[k] is not None:
        d[k] = tuple(d[k])
    if d.get("bucket_boundaries"):
      try:  # a width b means the square bucket (b, b)
        d["bucket_boundaries"] = tuple(sorted({(int(b), int(b)) if isinstance(b, (int, float)) else
                                               (int(b[0]), int(b[1])) for b in d["bucket_boundaries"]}))
      except (TypeError, ValueError, IndexError) as e:
        raise DataError(f"data config: bucket_boundaries={d['bucket_boundaries']!r} must be widths "
                        "or (src_width, tgt_width) pairs") from e
    else:
      d["bucket_boundaries"] = ()
    cfg = cls(**d)
    cfg.validate()
    return cfg

  def validate(self) -> None:
    def check(ok, msg):
      if not ok:
        raise DataError(f"data config: {msg}")

    from attn.data.tokenize import TOKENIZER_NAMES  # pylint: disable=import-outside-toplevel
    check(self.tokenizer in TOKENIZER_NAMES,
          f"tokenizer={self.tokenizer!r}; known: {', '.join(TOKENIZER_NAMES)}")
    check(self.too_long in ("drop", "truncate", "error"),
          f"too_long={self.too_long!r}; use drop, truncate or error")
    check(self.empty in ("drop", "error"), f"empty={self.empty!r}; use drop or error")
    check(self.max_src_len >= 2 and self.max_tgt_len >= 2, "max_src_len and max_tgt_len must be >= 2")
    check(self.batch_size >= 1 and self.eval_batch_size >= 0, "batch sizes must be positive")
    check(self.num_buckets >= 1 and self.length_multiple >= 1, "num_buckets, length_multiple >= 1")
    check(all(len(b) == 2 and min(b) >= 2 for b in self.bucket_boundaries),
          f"bucket_boundaries={self.bucket_boundaries}: widths must be >= 2 (EOS included)")
    if self.bucket_boundaries:
      top = tuple(max(b[i] for b in self.bucket_boundaries) for i in (0, 1))
      check(top in self.bucket_boundaries,
            f"bucket_boundaries={self.bucket_boundaries}: one bucket must be the widest on both "
            f"sides (add {top}), so every example fits somewhere")
    check(self.min_freq >= 1 and self.vocab_size >= 0, "min_freq >= 1, vocab_size >= 0")
    check(self.train_size >= 1 and self.eval_size >= 0 and self.test_size >= 0, "task sizes")
    check(self.min_year <= self.max_year, "min_year <= max_year")
    check(self.train_split != "", "train_split must name a split")

  def replace(self, **kw) -> "DataConfig":
    new = dataclasses.replace(self, **kw)
    new.validate()
    return new

  @property
  def eval_bs(self) -> int:
    return self.eval_batch_size or self.batch_size
