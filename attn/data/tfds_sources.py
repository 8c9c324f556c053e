"""Named TFDS datasets read through `tfds.data_source` (array_record, no TensorFlow, no download).

These machines cannot download: prepare a dataset elsewhere with array_record files, e.g.
    tfds build ted_hrlr_translate/pt_to_en --file_format=array_record --data_dir=DIR
and point `data.tfds_data_dir` at DIR. Tests use `tfds.testing.mock_data`.

`NAMED` knows where each dataset's source and target live and which module defines its TFDS builder
(legacy datasets are only known to TFDS once that module is imported). Other TFDS names work too when
`data.source_field` and `data.target_field` are given.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging

from attn.data.base import DataError
from attn.registry import Registry

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class NamedDataset:
  """module: imported first so TFDS registers the builder. translation: fields are the languages
  (data.src_lang/tgt_lang); else src/tgt are the document and summary fields."""
  module: str
  translation: bool = False
  src: str = ""
  tgt: str = ""


# The TFDS datasets whose fields are known (`base_name` of data.tfds_name -> NamedDataset).
NAMED = Registry("TFDS dataset", error=DataError)
NAMED.add("ted_hrlr_translate", NamedDataset(
    "tensorflow_datasets.datasets.ted_hrlr_translate.ted_hrlr_translate_dataset_builder",
    translation=True))
NAMED.add("wmt14_translate", NamedDataset("tensorflow_datasets.translate.wmt14", translation=True))
NAMED.add("cnn_dailymail", NamedDataset("tensorflow_datasets.summarization.cnn_dailymail",
                                        src="article", tgt="highlights"))
NAMED.add("xsum", NamedDataset("tensorflow_datasets.summarization.xsum", src="document",
                               tgt="summary"))
NAMED.add("gigaword", NamedDataset("tensorflow_datasets.summarization.gigaword", src="document",
                                   tgt="summary"))
NAMED.add("aeslc", NamedDataset("tensorflow_datasets.datasets.aeslc.aeslc_dataset_builder",
                                src="email_body", tgt="subject_line"))


def base_name(tfds_name: str) -> str:
  return tfds_name.split("/")[0].split(":")[0]


def fields_for(tfds_name: str, src_lang: str, tgt_lang: str, source_field: str,
               target_field: str) -> tuple[str, str]:
  """(source field, target field): explicit fields win, then the NAMED entry."""
  if source_field and target_field:
    return source_field, target_field
  if base_name(tfds_name) not in NAMED:
    raise DataError(f"TFDS dataset {tfds_name!r} is not one of {', '.join(NAMED.names())}: "
                    "set data.source_field and data.target_field")
  entry = NAMED.get(base_name(tfds_name))
  if entry.translation:
    return source_field or src_lang, target_field or tgt_lang
  return source_field or entry.src, target_field or entry.tgt


def import_builder(tfds_name: str) -> None:
  """Imports the module defining `tfds_name`'s TFDS builder (legacy datasets are unknown to TFDS
  until then); nothing for a dataset outside NAMED."""
  if base_name(tfds_name) not in NAMED:
    return
  module = NAMED.get(base_name(tfds_name)).module
  try:
    importlib.import_module(module)
  except ImportError:
    log.debug("%s: no module %s (moved in this TFDS version?); tfds may still know the name",
              tfds_name, module)


def open_split(tfds_name: str, split: str, data_dir: str | None):
  """Random-access records of one split (dicts of field -> bytes/str)."""
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel

  import_builder(tfds_name)
  where = data_dir or "the TFDS default data_dir"
  try:
    return tfds.data_source(tfds_name, split=split, data_dir=data_dir or None, download=False)
  except Exception as e:  # pylint: disable=broad-except
    raise DataError(f"cannot open TFDS {tfds_name} split {split!r} in {where}: {type(e).__name__}: "
                    f"{str(e).splitlines()[0] if str(e) else ''} (prepare it with `tfds build "
                    f"{tfds_name} --file_format=array_record --data_dir=...`)") from e


def check_fields(tfds_name: str, record: dict, fields: tuple[str, ...]) -> None:
  missing = [f for f in fields if f not in record]
  if missing:
    raise DataError(f"TFDS {tfds_name}: no field(s) {missing} in its records (fields: "
                    f"{', '.join(sorted(record))}); check data.source_field/target_field, "
                    "src/tgt_lang and reference_fields")
