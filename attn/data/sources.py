"""The data sources behind `data.task`, each ending in TFDS array_record data sources.

A source knows its splits (role -> split name), prepares them (writing TFDS array_record files for
built-in tasks and local corpora, opening prepared ones for named TFDS datasets), and reads
(source text, target text[, alignment pairs]) out of a record.

    built-in task  --generate-->  AttnTask builder  --\
    local corpus   --validate-->  AttnText builder  ----> tfds data source (random access) -> grain
    named TFDS     ------------------------------------/
"""

from __future__ import annotations

import abc
import json
import os
import re
from typing import Iterator

import numpy as np

from attn.data import builtin_tasks, corpora, tfds_sources
from attn.data.base import ROLES, DataError, register_source
from attn.data.config import DataConfig, check_reference_fields
from attn.data.tokenize import TokenizerSpec

_SPLIT_RE = re.compile(r"^\w+$")


def _text(value) -> str:
  return value.decode("utf-8") if isinstance(value, (bytes, np.bytes_)) else str(value)


class Source(abc.ABC):
  """Interface. Subclasses set `has_alignments` (batches carry gold alignments) and
  `reads_references` (records can carry data.reference_fields) and implement the methods below."""
  name = ""
  has_alignments = False
  reads_references = False

  def __init__(self, cfg: DataConfig):
    self.cfg = cfg
    self._sources: dict[str, object] = {}

  def tokenizer_specs(self) -> tuple[TokenizerSpec, TokenizerSpec]:
    spec = TokenizerSpec(self.cfg.tokenizer, self.cfg.lowercase)
    return spec, spec

  def splits(self) -> dict[str, str]:
    """role -> split name, for the roles this source has."""
    c = self.cfg
    out = {"train": c.train_split, "eval": c.eval_split, "test": c.test_split}
    return {r: s for r, s in out.items() if s}

  def check(self) -> None:
    """The checks of the settings that read no record and write nothing (settings the source
    needs, split names, files that must exist): DataError. A run calls them before its workdir
    is touched (attn.data.check); `prepare` calls them again. None by default."""

  @abc.abstractmethod
  def prepare(self, cache_dir: str) -> None:
    """Implemented by each subclass."""

  def data_source(self, role: str):
    """Random-access records of the role's split (len, __getitem__, __getitems__)."""
    return self._sources[role]

  def read(self, record) -> tuple[str, str]:
    return _text(record["src"]), _text(record["tgt"])

  def read_references(self, role: str, record) -> list[str]:
    """The texts of data.reference_fields in a record of `role` (maybe empty strings); [] for
    training records and for sources without reference fields."""
    del role, record
    return []

  def describe(self, role: str) -> str:
    return f"{self.name} {role} split"

  @abc.abstractmethod
  def fingerprint(self) -> str:
    """Identifies the records (used to key the lengths cache)."""


class BuiltinTaskSource(Source):
  """A built-in task (builtin_tasks.py); split names in the config are ignored: the task generates
  train/eval/test of train_size/eval_size/test_size."""
  has_alignments = True

  def __init__(self, cfg):
    super().__init__(cfg)
    self.task = builtin_tasks.builtin_task(cfg)

  def tokenizer_specs(self):
    return TokenizerSpec(self.task.src_tokenizer), TokenizerSpec(self.task.tgt_tokenizer)

  def splits(self):
    sizes = {"train": self.cfg.train_size, "eval": self.cfg.eval_size, "test": self.cfg.test_size}
    return {r: r for r in ROLES if sizes[r]}

  def _params(self):
    c = self.cfg
    return {"config": self.task.fingerprint(),
            "sizes": {"train": c.train_size, "eval": c.eval_size, "test": c.test_size}}

  def prepare(self, cache_dir):
    from attn.data import builders  # pylint: disable=import-outside-toplevel

    config = builders.config_for(self.name, self._params())
    self._config_name = config.name
    builder = builders.prepare(builders.AttnTask, config, cache_dir)
    self._sources = {r: builder.as_data_source(r) for r in self.splits()}

  def read_alignment(self, record) -> np.ndarray:
    return np.asarray(record["align"], np.int32).reshape(-1, 2)

  def describe(self, role):
    return f"built-in task {self.name} ({role})"

  def fingerprint(self):
    return self._config_name


for _name in builtin_tasks.BUILTIN_TASKS:
  register_source(_name)(type(f"{_name.title()}Source", (BuiltinTaskSource,), {}))


class _LocalSource(Source):
  """Shared by parallel_text and jsonl: validate every file, then write them as TFDS (the
  AttnText builder, which reads the files back through the source's `read_files`)."""

  @abc.abstractmethod
  def _files(self, split: str) -> list[str]:
    """Implemented by each subclass."""

  @abc.abstractmethod
  def _check(self, split: str, files: list[str]) -> None:
    """Implemented by each subclass."""

  @staticmethod
  @abc.abstractmethod
  def read_files(split: str, paths: list[str], params: dict) -> Iterator[tuple[str, str, tuple]]:
    """(source, target, references) of every record of a split's (validated) files; `params`:
    the builder's (`_params` and the files)."""

  def _params(self) -> dict:
    """Settings the records depend on besides the files (they key the builder config)."""
    return {}

  def check(self):
    self._split_files()

  def _split_files(self) -> dict[str, list[str]]:
    """split name -> its files, every one found (DataError naming the first missing one)."""
    if not self.cfg.dir:
      raise DataError(f"data.task={self.name} needs data.dir")
    splits = {}
    for role, split in self.splits().items():
      if not _SPLIT_RE.match(split):
        raise DataError(f"split name {split!r} ({role}) must be letters, digits and _ only")
      splits[split] = self._files(split)
    return splits

  def prepare(self, cache_dir):
    from attn.data import builders  # pylint: disable=import-outside-toplevel

    splits = self._split_files()
    params = {"kind": self.name, **self._params(),
              "splits": {s: [builders.file_entry(p) for p in files] for s, files in splits.items()}}
    config = builders.config_for(self.name, params)
    self._config_name = config.name
    self._files_by_split = splits

    def validate():
      for split, files in splits.items():
        self._check(split, files)

    builder = builders.prepare(builders.AttnText, config, cache_dir, validate)
    self._sources = {r: builder.as_data_source(s) for r, s in self.splits().items()}

  def describe(self, role):
    return " + ".join(self._files_by_split[self.splits()[role]])

  def fingerprint(self):
    return self._config_name


@register_source("parallel_text")
class ParallelTextSource(_LocalSource):
  """`<dir>/<split>.<src_lang>[.gz]` and `<dir>/<split>.<tgt_lang>[.gz]`."""

  def _files(self, split):
    return list(corpora.parallel_paths(self.cfg.dir, split, self.cfg.src_lang, self.cfg.tgt_lang))

  def _check(self, split, files):
    del split
    corpora.check_parallel(*files)

  @staticmethod
  def read_files(split, paths, params):
    del split, params
    return ((s, t, ()) for s, t in corpora.read_parallel(*paths))


@register_source("jsonl")
class JsonlSource(_LocalSource):
  """`<dir>/<split>.jsonl[.gz]` with fields data.source_field, data.target_field, and in the
  eval/test splits data.reference_fields."""
  reads_references = True

  def _reference_splits(self) -> list[str]:
    return sorted({s for role, s in self.splits().items() if role != "train"})

  def _params(self):
    c = self.cfg
    return {"source_field": c.source_field, "target_field": c.target_field,
            "reference_fields": list(c.reference_fields),
            "reference_splits": self._reference_splits() if c.reference_fields else []}

  def _files(self, split):
    if not self.cfg.source_field or not self.cfg.target_field:
      raise DataError("data.task=jsonl needs data.source_field and data.target_field")
    return [corpora.jsonl_path(self.cfg.dir, split)]

  def _check(self, split, files):
    c = self.cfg
    refs = c.reference_fields if split in self._reference_splits() else ()
    corpora.check_jsonl(files[0], c.source_field, c.target_field, refs)

  @staticmethod
  def read_files(split, paths, params):
    # Training files often lack the annotations: only the eval/test splits are read for them.
    refs = tuple(params["reference_fields"]) if split in params["reference_splits"] else ()
    return corpora.read_jsonl(paths[0], params["source_field"], params["target_field"], refs)

  def read_references(self, role, record):
    del role  # the builder wrote empty `refs` for training-only splits
    return [_text(r) for r in record["refs"]] if self.cfg.reference_fields else []


class _ItemwiseSource:
  """Hides a broken `__getitems__` (tfds.testing.mock_data's mock has one) behind item reads."""

  def __init__(self, ds):
    self._ds = ds

  def __len__(self):
    return len(self._ds)

  def __getitem__(self, i):
    return self._ds[i]


def _batch_readable(ds):
  if not hasattr(ds, "__getitems__"):  # a plain sequence: read item by item (splits.records)
    return ds
  try:
    ds.__getitems__([0])
  except TypeError:
    return _ItemwiseSource(ds)
  return ds


@register_source("tfds")
class TfdsSource(Source):
  """A named TFDS dataset (tfds_sources.py), prepared as array_record in data.tfds_data_dir."""
  reads_references = True

  def check(self):
    if not self.cfg.tfds_name:
      raise DataError("data.task=tfds needs data.tfds_name (e.g. ted_hrlr_translate/pt_to_en)")

  def prepare(self, cache_dir):
    del cache_dir
    c = self.cfg
    self.check()
    self.fields = tfds_sources.fields_for(c.tfds_name, c.src_lang, c.tgt_lang, c.source_field,
                                          c.target_field)
    check_reference_fields(c.reference_fields, self.fields[1])  # a default target field too
    for role, split in self.splits().items():
      ds = tfds_sources.open_split(c.tfds_name, split, c.tfds_data_dir)
      if len(ds):
        refs = c.reference_fields if role != "train" else ()
        tfds_sources.check_fields(c.tfds_name, ds[0], (*self.fields, *refs))
        ds = _batch_readable(ds)
      self._sources[role] = ds

  def read(self, record):
    return _text(record[self.fields[0]]), _text(record[self.fields[1]])

  def read_references(self, role, record):
    if role == "train":
      return []
    missing = [f for f in self.cfg.reference_fields if f not in record]
    if missing:
      raise DataError(f"{self.describe(role)}: a record has no field(s) {missing} (fields: "
                      f"{', '.join(sorted(record))}); check data.reference_fields")
    return [_text(record[f]) for f in self.cfg.reference_fields]

  def describe(self, role):
    return f"TFDS {self.cfg.tfds_name} split {self.splits()[role]}"

  def fingerprint(self):
    c = self.cfg
    sizes = {r: len(ds) for r, ds in self._sources.items()}
    return json.dumps([c.tfds_name, os.path.abspath(c.tfds_data_dir) if c.tfds_data_dir else "",
                       self.fields, sizes], sort_keys=True)
