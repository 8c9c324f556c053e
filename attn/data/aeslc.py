"""The AESLC release (Zhang & Tetreault, ACL 2019) read from its zip, and written as the JSON lines
the `aeslc` data preset reads.

The zip (github.com/ryanzhumich/AESLC, master.zip) holds one file per email,
`<top>/enron_subject_line/<split>/<id>.subject` for split train, dev and test:

    <email body, several lines>
                                      (blank)
    @subject
    <the subject line the sender wrote>
                                      (blank)
    @ann0                             (dev and test only: three subject lines written by
    <annotation>                       annotators, @ann0, @ann1, @ann2)
    ...

A record is {"email", "subject", "id"} (each section's lines joined by "\\n", stripped; id: the
file name without .subject), plus "ann0", "ann1", "ann2" where the file has them, in file-name
order. `write_jsonl` writes `<split>.jsonl.gz` per split (data.reference_fields=ann0,ann1,ann2
scores dev/test against the annotations, and the sender's subject apart: the summarize preset
aeslc_test, attn/apps/summarize/task.py).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import zipfile
from typing import Callable, Iterator

from attn.common.files import atomic_path
from attn.errors import DataError

SPLITS = ("train", "dev", "test")
ZIP_NAME = "master.zip"
_MEMBER = re.compile(r"^[^/]+/enron_subject_line/(\w+)/([^/]+)\.subject$")
_SECTION = re.compile(r"^@(subject|ann\d+)$")


def parse(text: str, where: str) -> dict[str, str]:
  """{"email": ..., "subject": ..., ["ann0": ..., ...]} of one .subject file's text; `where`
  names it in errors."""
  sections, name, lines = {}, "email", []
  for line in text.split("\n"):
    marker = _SECTION.match(line.rstrip("\r"))
    if not marker:
      lines.append(line.rstrip("\r"))
      continue
    sections[name] = "\n".join(lines).strip()
    name, lines = marker.group(1), []
    if name in sections:
      raise DataError(f"{where}: section @{name} appears twice")
  sections[name] = "\n".join(lines).strip()
  if "subject" not in sections:
    raise DataError(f"{where}: no @subject line (not an AESLC .subject file)")
  return sections


def _members(archive: zipfile.ZipFile) -> dict[str, list[tuple[str, str]]]:
  """split -> [(member name, id)] in file-name order."""
  out: dict[str, list[tuple[str, str]]] = {s: [] for s in SPLITS}
  for name in sorted(archive.namelist()):
    m = _MEMBER.match(name)
    if m and m.group(1) in out:
      out[m.group(1)].append((name, m.group(2)))
  return out


def records(zip_path: str, split: str) -> Iterator[dict[str, str]]:
  """The records of `split` (train, dev, test) of the release zip at `zip_path`."""
  if split not in SPLITS:
    raise DataError(f"AESLC has no split {split!r}; its splits: {', '.join(SPLITS)}")
  try:
    with zipfile.ZipFile(zip_path) as archive:
      members = _members(archive)[split]
      if not members:
        raise DataError(f"{zip_path}: no enron_subject_line/{split}/*.subject files (not the "
                        "AESLC release zip)")
      for name, ident in members:
        where = f"{zip_path}:{name}"
        try:
          text = archive.read(name).decode("utf-8")
        except UnicodeDecodeError as e:
          raise DataError(f"{where}: not valid UTF-8 (byte {e.start})") from None
        sections = parse(text, where)
        email, subject = sections.pop("email"), sections.pop("subject")
        yield {"email": email, "subject": subject, "id": ident, **dict(sorted(sections.items()))}
  except (zipfile.BadZipFile, OSError, EOFError) as e:
    raise DataError(f"{zip_path}: cannot read the zip ({e})") from None


def jsonl_name(split: str) -> str:
  return f"{split}.jsonl.gz"


def write_jsonl(directory: str, progress: Callable[[str], None] = lambda _: None) -> None:
  """`<directory>/<split>.jsonl.gz` for each split, from `<directory>/master.zip`; a file
  already there is kept, a new one appears whole or not at all (gzip without a timestamp, so the
  same zip gives the same bytes)."""
  zip_path = os.path.join(directory, ZIP_NAME)
  for split in SPLITS:
    path = os.path.join(directory, jsonl_name(split))
    if os.path.exists(path):
      continue
    n = 0
    try:
      with atomic_path(path) as tmp, open(tmp, "wb") as raw, \
          gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as out:
        for record in records(zip_path, split):
          out.write((json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))
          n += 1
    except OSError as e:
      raise DataError(f"cannot write {path} ({e.strerror or e}); nothing kept: free space and "
                      "rerun") from None
    progress(f"  {jsonl_name(split)}: {n:,} records from {ZIP_NAME}")
