"""TFDS builders (array_record, no TensorFlow) for the built-in tasks and the local corpora.

Each run's settings become a BuilderConfig whose name carries a hash of them (task settings and
seed; file paths, sizes and modification times), so a changed file or setting is written again
and an unchanged one is read from `<cache_dir>/<builder>/<config>/1.0.0/`. Records keep the
order they were generated or read in (`disable_shuffling`): record i of a split is line i + 1 of
its files, and its `id` field is i.

Features: `id` int64, `src` and `tgt` text; built-in tasks add `align`, [K, 2] int32 (target
token, source token) pairs (see builtin_tasks.py); JSON lines with `data.reference_fields` add `refs`, one
text per reference field, read in the splits of `reference_splits` (eval/test) and empty elsewhere.

This module imports tensorflow_datasets at import time: import it lazily (sources.py does).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os

import numpy as np
import tensorflow_datasets as tfds

from attn.data import builtin_tasks
from attn.data.base import SOURCES, DataError, disk_error, disk_full
from attn.data.config import DataConfig

_VERSION = "1.0.0"


@dataclasses.dataclass(eq=False)
class AttnBuilderConfig(tfds.core.BuilderConfig):
  """params: JSON of everything the records depend on."""
  params: str = dataclasses.field(default="{}", repr=False)


def config_for(prefix: str, params: dict) -> AttnBuilderConfig:
  blob = json.dumps(params, sort_keys=True, ensure_ascii=False)
  digest = hashlib.sha1(blob.encode("utf-8")).hexdigest()[:16]
  return AttnBuilderConfig(name=f"{prefix}_{digest}", version=_VERSION, params=blob,
                           description=f"{prefix} (settings hash {digest})")


def _text_features(with_align: bool, with_refs: bool = False):
  feats = {"id": np.int64, "src": tfds.features.Text(), "tgt": tfds.features.Text()}
  if with_align:
    feats["align"] = tfds.features.Tensor(shape=(None, 2), dtype=np.int32)
  if with_refs:
    feats["refs"] = tfds.features.Sequence(tfds.features.Text())
  return tfds.features.FeaturesDict(feats)


class AttnTask(tfds.core.GeneratorBasedBuilder):
  """A built-in task's train/eval/test splits, generated from the seed. params: the DataConfig
  fields of builtin_tasks.BuiltinTask.fingerprint plus the split sizes."""
  VERSION = tfds.core.Version(_VERSION)

  def _info(self):
    return self.dataset_info_from_configs(
        features=_text_features(True), disable_shuffling=True,
        description="attn built-in task (attn/data/builtin_tasks.py)")

  def _split_generators(self, dl_manager):
    del dl_manager
    p = json.loads(self.builder_config.params)
    return {role: self._generate_examples(role, size) for role, size in p["sizes"].items() if size}

  def _generate_examples(self, role, size):
    p = json.loads(self.builder_config.params)
    settings = {k: tuple(v) if isinstance(v, list) else v for k, v in p["config"].items()
                if k != "version"}
    task = builtin_tasks.builtin_task(DataConfig(**settings))
    for i, ex in enumerate(task.generate(role, size)):
      yield i, {"id": i, "src": ex.src, "tgt": ex.tgt, "align": ex.align}


class AttnText(tfds.core.GeneratorBasedBuilder):
  """Local parallel text or JSON lines. params: kind (the data source, "parallel_text" or "jsonl",
  whose `read_files` reads the files back), the files of each split (with size and mtime), and for
  jsonl source_field, target_field, reference_fields and reference_splits (the splits whose
  records must have the reference fields)."""
  VERSION = tfds.core.Version(_VERSION)

  def _params(self) -> dict:
    return json.loads(self.builder_config.params)

  def _info(self):
    with_refs = bool(self._params().get("reference_fields"))
    return self.dataset_info_from_configs(features=_text_features(False, with_refs),
                                          disable_shuffling=True,
                                          description="attn local corpus (attn/data/corpora.py)")

  def _split_generators(self, dl_manager):
    del dl_manager
    p = self._params()
    return {split: self._generate_examples(split, files) for split, files in p["splits"].items()}

  def _generate_examples(self, split, files):
    p = self._params()
    ref_fields = tuple(p.get("reference_fields", ()))
    records = SOURCES.get(p["kind"]).read_files(split, [f["path"] for f in files], p)
    for i, (src, tgt, refs) in enumerate(records):
      example = {"id": i, "src": src, "tgt": tgt}
      if ref_fields:
        example["refs"] = list(refs)
      yield i, example


def file_entry(path: str) -> dict:
  st = os.stat(path)
  return {"path": os.path.abspath(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def prepare(builder_cls, config: AttnBuilderConfig, cache_dir: str, validate=None):
  """The builder, written to cache_dir first if it is not there yet (after `validate()`)."""
  tfds.disable_progress_bar()
  builder = builder_cls(config=config, data_dir=cache_dir, file_format="array_record")
  if not builder.is_prepared():
    if validate is not None:
      validate()
    try:
      builder.download_and_prepare()
    except DataError:
      raise
    except Exception as e:  # pylint: disable=broad-except
      cause = e
      while cause is not None and not isinstance(cause, DataError):
        cause = cause.__cause__ or cause.__context__
      if cause is not None:
        raise cause from e
      if disk_error(e):  # TFDS deletes its incomplete copy: nothing half-written is read
        raise disk_full(e, f"the data cache in {cache_dir}") from e
      raise
  return builder

