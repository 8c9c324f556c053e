"""Local corpora: parallel text files and JSON lines, read strictly.

- Parallel text: `<dir>/<split>.<lang>` or `<dir>/<split>.<lang>.gz`, one sentence a line, UTF-8;
  line i of the source file translates line i of the target file.
- JSON lines: `<dir>/<split>.jsonl[.gz]`, one object a line with a source and a target string field
  (and, in eval/test splits, the string fields of any extra references).

Lines are split on "\\n" only (not on the other characters `str.splitlines` treats as breaks, which
would shift the pairing), a trailing "\\r" and a leading BOM are removed, and whitespace is collapsed
(`tokenize.normalize_whitespace`). Problems raise `DataError` with the file and line: a missing
file, different line counts (both files and both counts), bytes that are not UTF-8, a bad JSON line
or a missing/non-string field, a corrupt gzip stream, and a split with no usable pair: empty files,
or every pair with an empty side (TFDS would otherwise fail with an AssertionError on the empty
split, or training would find nothing to train on).
"""

from __future__ import annotations

import gzip
import itertools
import json
import os
from typing import Iterator

from attn.data import downloads_catalog
from attn.data.base import DataError
from attn.data.tokenize import normalize_whitespace


def find_file(directory: str, stem: str) -> str:
  """`<directory>/<stem>` or `<stem>.gz`; DataError listing the directory if neither exists (and
  naming the get_data command that downloads the file, for a file a published dataset has)."""
  for name in (stem, stem + ".gz"):
    path = os.path.join(directory, name)
    if os.path.isfile(path):
      return path
  hint = downloads_catalog.missing_file_hint(directory, stem)
  if not os.path.isdir(directory):
    raise DataError(f"data directory {directory!r} does not exist (set data.dir; the shared corpora "
                    f"live in ../shared/data or $ATTN_SHARED_DATA; it should hold {stem}[.gz])"
                    f"{hint}")
  present = ", ".join(sorted(os.listdir(directory))[:20]) or "nothing"
  raise DataError(f"no file {stem}[.gz] in {directory} (it holds: {present}){hint}")


def _open(path: str):
  return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def read_lines(path: str) -> Iterator[str]:
  """Decoded, whitespace-normalized lines of a text file (plain or gzip)."""
  try:
    with _open(path) as f:
      for lineno, raw in enumerate(f, start=1):
        if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
          raw = raw[3:]
        try:
          text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
          raise DataError(f"{path}:{lineno}: not valid UTF-8 (byte 0x{raw[e.start]:02x} at column "
                          f"{e.start + 1})") from None
        yield normalize_whitespace(text)
  except (OSError, EOFError, gzip.BadGzipFile) as e:
    raise DataError(f"{path}: cannot read ({e})") from e


def count_lines(path: str) -> int:
  """Number of lines (a last line without "\\n" counts), decoding each to catch bad bytes early."""
  return sum(1 for _ in read_lines(path))


def parallel_paths(directory: str, split: str, src_lang: str, tgt_lang: str) -> tuple[str, str]:
  return (find_file(directory, f"{split}.{src_lang}"), find_file(directory, f"{split}.{tgt_lang}"))


def _check_usable(what: str, n: int, n_blank: int, unit: str, sides: str) -> None:
  """A split needs at least one pair with both sides non-empty, whatever its role."""
  if n == 0:
    raise DataError(f"{what}: empty (no {unit}s); a split needs at least one {unit}")
  if n_blank == n:
    raise DataError(f"{what}: no usable {unit}: all {n} have an empty {sides}")


def check_parallel(src_path: str, tgt_path: str) -> int:
  """Reads both files fully; returns the pair count or raises on bad bytes, different counts, empty
  files, or pairs that all have an empty side."""
  n = n_blank = 0
  for s, t in read_parallel(src_path, tgt_path):
    n += 1
    n_blank += not s or not t
  _check_usable(f"{src_path} and {tgt_path}", n, n_blank, "sentence pair",
                "source or target side")
  return n


def read_parallel(src_path: str, tgt_path: str) -> Iterator[tuple[str, str]]:
  """(source, target) pairs; raises DataError naming both line counts if one file ends first."""
  src_it, tgt_it = read_lines(src_path), read_lines(tgt_path)
  # zip_longest, not zip: zip would swallow the source line read before it sees the target end.
  for n, (s, t) in enumerate(itertools.zip_longest(src_it, tgt_it), start=1):
    if s is None or t is None:
      n_src = n - 1 + (s is not None) + sum(1 for _ in src_it)
      n_tgt = n - 1 + (t is not None) + sum(1 for _ in tgt_it)
      raise DataError(f"parallel files differ in length: {src_path} has {n_src} lines, "
                      f"{tgt_path} has {n_tgt}")
    yield s, t


def jsonl_path(directory: str, split: str) -> str:
  return find_file(directory, f"{split}.jsonl")


def read_jsonl(path: str, source_field: str, target_field: str, reference_fields: tuple[str, ...] = ()
               ) -> Iterator[tuple[str, str, tuple[str, ...]]]:
  """(source, target, references) from each line's `source_field`, `target_field` and
  `reference_fields` (references: one string per field, maybe empty). A line without one of these
  fields, or with a non-string value there, is an error, and so is a blank line."""
  if not source_field or not target_field:
    raise DataError("jsonl needs data.source_field and data.target_field (e.g. email, subject)")
  fields = (source_field, target_field, *reference_fields)
  try:
    with _open(path) as f:
      for lineno, raw in enumerate(f, start=1):
        try:
          obj = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
          raise DataError(f"{path}:{lineno}: not valid UTF-8 (byte 0x{raw[e.start]:02x} at column "
                          f"{e.start + 1})") from None
        except ValueError as e:
          raise DataError(f"{path}:{lineno}: not a JSON object ({e})") from None
        if not isinstance(obj, dict):
          raise DataError(f"{path}:{lineno}: not a JSON object")
        texts = []
        for field in fields:
          if field not in obj:
            raise DataError(f"{path}:{lineno}: no field {field!r} (fields: {', '.join(sorted(obj))})")
          if not isinstance(obj[field], str):
            raise DataError(f"{path}:{lineno}: field {field!r} is {type(obj[field]).__name__}, not a string")
          texts.append(normalize_whitespace(obj[field]))
        yield texts[0], texts[1], tuple(texts[2:])
  except (OSError, EOFError, gzip.BadGzipFile) as e:
    raise DataError(f"{path}: cannot read ({e})") from e


def check_jsonl(path: str, source_field: str, target_field: str,
                reference_fields: tuple[str, ...] = ()) -> int:
  """Reads the file fully; returns the record count or raises as `read_jsonl` does, or if the
  file is empty or every record has an empty `source_field` or `target_field`."""
  n = n_blank = 0
  for s, t, _ in read_jsonl(path, source_field, target_field, reference_fields):
    n += 1
    n_blank += not s or not t
  _check_usable(path, n, n_blank, "record", f"{source_field!r} or {target_field!r} field")
  return n
