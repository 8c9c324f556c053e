"""The data settings a workdir's vocabularies were built from, so that a resumed run cannot reuse
them under other settings.

A run saves its vocabularies in the workdir and every later run on it reads them back (a
checkpoint's embedding rows are those ids). `check(cfg, source, workdir)` refuses, in one line
naming each changed field (there vs here), a run whose vocabulary settings differ from the ones
recorded in `vocab.settings.json` (`write`, next to the vocabularies), or, for a workdir written
before that file existed, from the data section of its config.json. A changed `data.dir` whose
training files are byte for byte those of the recorded one (the data moved) is not a change.
"""

from __future__ import annotations

import filecmp
import json
import os

from attn.common.files import read_json, write_json
from attn.data.base import DataError
from attn.data.config import DataConfig

SETTINGS_FILE = "vocab.settings.json"

# What the vocabulary of a corpus (local files or TFDS) is built from: the training records and
# how they are tokenized, counted and cut.
_CORPUS_FIELDS = ("task", "dir", "train_split", "src_lang", "tgt_lang", "source_field",
                  "target_field", "tfds_name", "tfds_data_dir", "tokenizer", "lowercase",
                  "shared_vocab", "vocab_size", "min_freq")


def settings(cfg: DataConfig, source) -> dict:
  """{field: value} of the DataConfig fields the vocabularies of `source` depend on."""
  if source.has_alignments:  # a built-in task keeps every symbol of its generated training split
    names = ["task", "train_size", "shared_vocab"] + [
        k for k in source.task.fingerprint() if k in DataConfig.__dataclass_fields__]
  else:
    names = list(_CORPUS_FIELDS)
    if source.tokenizer_specs()[0].learned:  # a learned tokenizer's training draws from the seed
      names.append("seed")
  return {k: _as_json(getattr(cfg, k)) for k in dict.fromkeys(names)}


def _as_json(v):  # tuples read back from JSON as lists: compare them as lists
  return list(v) if isinstance(v, tuple) else v


def _recorded(workdir: str) -> dict | None:
  """The recorded DataConfig fields (all of them, or those of vocab.settings.json); None when the
  workdir records none."""
  path = os.path.join(workdir, SETTINGS_FILE)
  if os.path.exists(path):
    try:
      with open(path, encoding="utf-8") as f:
        return json.load(f)
    except (OSError, ValueError) as e:
      raise DataError(f"cannot read {path}: {e}") from e
  config = read_json(os.path.join(workdir, "config.json"))
  try:
    recorded = DataConfig.from_config(config.get("data"))
  except (ValueError, AttributeError, TypeError):  # no (usable) record: nothing to hold
    return None
  return {k: _as_json(getattr(recorded, k)) for k in DataConfig.__dataclass_fields__}


def check(cfg: DataConfig, source, workdir: str) -> None:
  """Raises DataError when `workdir` holds vocabularies built under other settings (see the
  module docstring). Reads only: call it before anything is written."""
  if not any(os.path.exists(os.path.join(workdir, f"vocab.{n}.json"))
             for n in ("shared", "src", "tgt")):
    return
  recorded = _recorded(workdir)
  if recorded is None:
    return
  here = settings(cfg, source)
  differ = [k for k in here if k in recorded and recorded[k] != here[k]]
  if "dir" in differ and same_training_files(recorded["dir"], cfg.dir, cfg.train_split):
    differ.remove("dir")  # the same files, moved: the vocabularies still fit
  if differ:
    shown = ", ".join(f"data.{k}={_show(recorded[k])} there, {_show(here[k])} here"
                      for k in differ)
    raise DataError(f"workdir {workdir} holds vocabularies built with other data settings "
                    f"({shown}); resume with its settings or use another --workdir")


def same_training_files(old_dir: str, new_dir: str, train_split: str) -> bool:
  """Whether every `<train_split>.*` file of `old_dir` exists in `new_dir` with the same bytes
  (data moved or copied elsewhere); False when `old_dir` has none or is gone."""
  if not (old_dir and new_dir and os.path.isdir(old_dir)):
    return False
  names = [n for n in os.listdir(old_dir) if n.startswith(train_split + ".")]
  return bool(names) and all(
      os.path.isfile(os.path.join(new_dir, n))
      and filecmp.cmp(os.path.join(old_dir, n), os.path.join(new_dir, n), shallow=False)
      for n in names)


def _show(v) -> str:
  return repr(tuple(v)) if isinstance(v, list) else repr(v)


def write(cfg: DataConfig, source, workdir: str) -> None:
  """Records the settings of the vocabularies just built in `workdir`."""
  write_json(os.path.join(workdir, SETTINGS_FILE), settings(cfg, source))
