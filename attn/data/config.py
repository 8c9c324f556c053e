"""The frozen `DataConfig`: the one home of every data field and its default.

`DataConfig.from_config` is the one boundary from the ConfigDict to code: it validates every field
once and fails with a `DataError` naming the field and the allowed values. The named data presets
(multi30k, aeslc, the built-in tasks, TFDS datasets) are experiment settings and live beside the
experiment presets, in experiments/configs/data.py.
"""

from __future__ import annotations

import dataclasses

from attn.config import configurable
from attn.config.configurable import option
from attn.data.base import DataError
from attn.data.tokens import SPECIAL_TOKENS

# The smallest vocabulary cap that holds a word: the reserved ids count in it.
MIN_VOCAB_SIZE = len(SPECIAL_TOKENS) + 1

# old name -> new name of renamed fields, so that a run's recorded config.json still loads
_RENAMED = {"src_field": "source_field", "tgt_field": "target_field"}


def _sources():
  """The registry of `data.task`'s values (attn.data.base.SOURCES): the package's __init__
  registers every source (attn.data.sources) on the import that brings this module in, before
  any value can be checked; importing that module here would close an import circle."""
  from attn.data import base  # pylint: disable=import-outside-toplevel
  return base.SOURCES


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """Validated, immutable data settings: the one home of every data field and its default."""
  task: str = option(
      "parallel_text", "copy | reverse | dates | numbers | parallel_text | jsonl | tfds",
      names=_sources)
  dir: str = option(
      "", "parallel_text/jsonl: directory of <split>.<lang>[.gz] or <split>.jsonl[.gz]")
  src_lang: str = option("de", "parallel_text/tfds translation: source language (file suffix)")
  tgt_lang: str = option("en", "parallel_text/tfds translation: target language")
  train_split: str = option(
      "train", "split names (files <dir>/<split>.<lang>[.gz]); ignored by built-in tasks")
  eval_split: str = option("val", "evaluated during training; '' for none")
  test_split: str = option("test_2016_flickr", "scored at the end; '' for none")
  source_field: str = option("", "jsonl/tfds: source field (tfds: '' = the dataset's default)")
  target_field: str = option("", "jsonl/tfds: target field")
  reference_fields: tuple[str, ...] = option(
      (), "jsonl/tfds: reference fields of eval/test records (e.g. AESLC's annotations "
          "ann0,ann1,ann2), only scored, never trained on: a split that has them is scored "
          "against them (rouge1/2/L) and against the target field alone (rouge*_subject); the "
          "train split is not read for them and may lack them; the target field is not listed")
  tfds_name: str = option("", "tfds: e.g. 'ted_hrlr_translate/pt_to_en' (prepared as array_record)")
  tfds_data_dir: str = option("", "tfds: data_dir of the prepared dataset ('' = TFDS default)")
  cache_dir: str = option(
      "", "where built-in tasks and local corpora are written as TFDS array_record "
          "('' = <workdir>/data_cache, or a temp dir without workdir)")
  # tokenization and vocabulary
  tokenizer: str = option(
      "word", "word | space | char | sentencepiece (built-in tasks fix their own)")
  lowercase: bool = option(
      False, "lowercase before tokenizing (score with sacreBLEU lowercase=True)")
  shared_vocab: bool = option(False, "one vocabulary for source and target")
  extended_vocab: bool = option(
      False, "batches carry src_ext/tgt_ext, ids on each example's source-extended vocabulary, "
             "for copying models (pointer-generator); needs shared_vocab")
  vocab_size: int = option(
      0, f"cap on vocabulary size incl. the {len(SPECIAL_TOKENS)} specials, at least "
         f"{MIN_VOCAB_SIZE} (0 = none; sentencepiece: 8000)")
  min_freq: int = option(2, "tokens seen fewer times in the training split map to <unk>")
  # lengths and bad input
  max_src_len: int = option(128, "longest source row, EOS included")
  max_tgt_len: int = option(128, "longest target row, EOS included")
  too_long: str = option(
      "drop", "training pairs over a max: drop | truncate | error (eval/test truncate)")
  empty: str = option(
      "drop", "training pairs with an empty side: drop | error (eval/test keep them)")
  # batching
  batch_size: int = option(64, "sentences per training batch (per bucket if tokens_per_batch > 0)")
  eval_batch_size: int = option(0, "sentences per eval/test batch (0 = batch_size)")
  tokens_per_batch: int = option(
      0, "if > 0, each bucket's batch size is tokens_per_batch // its src+tgt width")
  bucket_boundaries: tuple[tuple[int, int], ...] = option(
      (), "bucket shapes: (src_width, tgt_width) pairs or widths b = (b, b), EOS "
          "incl.; () = chosen from the data")
  num_buckets: int = option(8, "with bucket_boundaries=(): how many buckets to choose")
  pack: bool = option(
      False, "training batches of rows of the widest bucket's shape, each holding several "
             "examples one after another (Transformer only: attention stays within an example); "
             "batch_size then sets the rows so a batch holds about that many examples")
  length_multiple: int = option(
      4, "bucket widths are multiples of this (keeps shapes friendly to kernels)")
  seed: int = option(0, "shuffling and generation seed")
  num_threads: int = option(
      2, "grain threads reading and collating training batches (0 = in the caller)")
  prefetch: int = option(8, "training batches prepared ahead")
  # built-in tasks
  train_size: int = option(50_000, "built-in tasks: training examples")
  eval_size: int = option(1_000, "built-in tasks: eval examples")
  test_size: int = option(1_000, "built-in tasks: test examples")
  min_len: int = option(0, "copy/reverse: tokens; numbers: digits (0 = task default: 5 / 1)")
  max_len: int = option(0, "copy/reverse: tokens; numbers: digits (0 = task default: 50 / 9)")
  eval_min_len: int = option(
      0, "eval/test lengths (0 = same as training), for length generalization")
  eval_max_len: int = option(0, "eval/test max length (0 = same as training)")
  task_vocab_size: int = option(20, "copy/reverse: number of distinct symbols")
  languages: tuple[str, ...] = option(
      (), "dates: babel locales; numbers: en/fr/de; () = task default")
  date_formats: tuple[str, ...] = option(
      (), "dates: CLDR format names/skeletons; () = task default")
  min_year: int = option(1950, "dates: first year")
  max_year: int = option(
      2049, "dates: last year (2-digit years are used only if the range spans < 100)")

  @classmethod
  def from_config(cls, config) -> "DataConfig":
    """From a ConfigDict / dict / DataConfig; unknown fields and bad values raise DataError.

    The config.json of a run recorded before a field was renamed (`_RENAMED`) still reads.
    """
    if isinstance(config, DataConfig):
      return config
    d = configurable.as_dict(config)
    for old, new in _RENAMED.items():
      if old in d:
        value = d.pop(old)
        if d.setdefault(new, value) != value:
          raise DataError(f"data config: {old} was renamed {new}; set only {new}")
    if d.get("bucket_boundaries"):
      try:  # a width b means the square bucket (b, b)
        d["bucket_boundaries"] = tuple(sorted({(int(b), int(b)) if isinstance(b, (int, float)) else
                                               (int(b[0]), int(b[1])) for b in d["bucket_boundaries"]}))
      except (TypeError, ValueError, IndexError) as e:
        raise DataError(f"data config: bucket_boundaries={d['bucket_boundaries']!r} must be widths "
                        "or (src_width, tgt_width) pairs") from e
    else:
      d["bucket_boundaries"] = ()
    return configurable.from_config(cls, d, section="data", error=DataError)

  def __post_init__(self):
    self.validate()

  def validate(self) -> None:
    def check(ok, msg):
      if not ok:
        raise DataError(f"data config: {msg}")

    from attn.data.tokenize import TOKENIZERS  # pylint: disable=import-outside-toplevel
    check(self.tokenizer in TOKENIZERS,
          f"tokenizer={self.tokenizer!r}; known: {', '.join(TOKENIZERS.names())}")
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
    check(self.vocab_size == 0 or self.vocab_size >= MIN_VOCAB_SIZE,
          f"vocab_size={self.vocab_size} leaves no room for a word: the {len(SPECIAL_TOKENS)} "
          f"reserved ids ({' '.join(SPECIAL_TOKENS)}) count in it; use at least "
          f"{MIN_VOCAB_SIZE}, or 0 for no cap")
    check(not (self.pack and self.extended_vocab),
          "pack=True with extended_vocab=True: a packed row would share one source's copy "
          "vocabulary among its examples; pack without extended_vocab")
    check(self.shared_vocab or not self.extended_vocab,
          "extended_vocab=True needs shared_vocab=True (a target token is copied by its position "
          "in the source, so both sides must have the same ids)")
    refs = self.reference_fields
    check(all(isinstance(f, str) and f and "," not in f for f in refs)
          and len(set(refs)) == len(refs),
          f"reference_fields={refs!r} must be distinct field names (a tuple, or one comma string)")
    check_reference_fields(refs, self.target_field)
    check(self.train_size >= 1 and self.eval_size >= 0 and self.test_size >= 0, "task sizes")
    check(self.min_year <= self.max_year, "min_year <= max_year")
    check(self.train_split != "", "train_split must name a split")

  def replace(self, **kw) -> "DataConfig":
    return dataclasses.replace(self, **kw)

  @property
  def eval_bs(self) -> int:
    return self.eval_batch_size or self.batch_size

  @property
  def widest_batch(self) -> dict[str, tuple[int, str]]:
    """{"source" | "target": (the widest batch that side can have, EOS included, and what sets
    it)}: the widest of bucket_boundaries, else max_src_len / max_tgt_len rounded up to a
    multiple of length_multiple (the widths buckets are chosen from)."""
    if self.bucket_boundaries:
      return {side: (max(b[i] for b in self.bucket_boundaries),
                     f"the widest of data.bucket_boundaries={list(self.bucket_boundaries)}")
              for i, side in enumerate(("source", "target"))}
    out = {}
    for side, name in (("source", "max_src_len"), ("target", "max_tgt_len")):
      cap, m = getattr(self, name), self.length_multiple
      width = -(-cap // m) * m
      out[side] = (width, f"data.{name}={cap}" + (
          f" rounded up to a multiple of data.length_multiple={m}" if width != cap else ""))
    return out


def check_reference_fields(reference_fields: tuple[str, ...], target_field: str) -> None:
  """The target field is scored on its own (rouge*_subject, attn.apps.summarize.task):
  listed among the reference fields it would also enter the figure against the annotations,
  mixing the two protocols (DataError)."""
  if target_field and target_field in reference_fields:
    raise DataError(f"data config: reference_fields={','.join(reference_fields)} lists the "
                    f"target field {target_field!r}, which is scored on its own (rouge*_subject); "
                    "list only the other references")
