"""Published datasets fetched over HTTP(S): pinned files, verified, cached, resumed.

    release = downloads_catalog.RELEASES.get("multi30k")
    directory = downloads.fetch(release, "data")         # -> data/multi30k/train.de.gz, ...

A `Release` lists its files (name, size, SHA-256) and a base URL (base URL + file name = the
file). `fetch` puts them in `<root>/<release name>/`:

- a file already there with the pinned size and SHA-256 is kept: nothing is downloaded;
- a file there that does not match is refused (a DataError naming it), never overwritten or used;
  every present file is checked before anything is downloaded;
- a missing file is downloaded to `<name>.part`. A `.part` left by an interrupted transfer is
  resumed with an HTTP Range request when the server honours it (206) and started over when it
  does not (200). Size and SHA-256 are checked before the `.part` is renamed to its name; a
  transfer that ends with other bytes (truncated, corrupted, too long) is deleted, and so is one
  that cannot be written (disk full). Only a transfer cut off mid-way (network, Ctrl-C) keeps its
  `.part`, for the rerun to resume.

Then the release's `prepare` writes the files the presets read from the downloaded ones (for
AESLC: JSON lines from the zip), each atomically. Standard library only (urllib).
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import http.client
import logging
import os
import urllib.error
import urllib.request
from typing import Callable

from attn.errors import DataError

_log = logging.getLogger(__name__)

_CHUNK = 1 << 16
_REPORT_EVERY = 4 << 20  # a progress line per 4 MiB received
_TIMEOUT_S = 60


@dataclasses.dataclass(frozen=True)
class FileSpec:
  """One published file: its name (under the base URL and in the dataset's directory), its size
  in bytes and its SHA-256 (hex)."""
  name: str
  size: int
  sha256: str


@dataclasses.dataclass(frozen=True)
class Release:
  """A published dataset.

  name: get_data's NAME, and the directory under --dir its files go to.
  title: one line for listings.
  base_url: base URL + file name is each file's address.
  files: the files to download, with their pins.
  licence: one line: the licence and where it is stated.
  provides: the files the data presets read from the directory (the downloaded files, unless
    `prepare` writes others from them).
  prepare: `prepare(directory, progress)` writes `provides` from the verified downloads (each
    atomically; present ones kept), or None.
  """
  name: str
  title: str
  base_url: str
  files: tuple[FileSpec, ...]
  licence: str
  provides: tuple[str, ...] = ()
  prepare: Callable[[str, Callable[[str], None]], None] | None = None

  def provided(self) -> tuple[str, ...]:
    return self.provides or tuple(f.name for f in self.files)

  def select(self, names=()) -> tuple[FileSpec, ...]:
    """The files named in `names` (all when empty); an unknown name is a DataError listing them."""
    known = {f.name: f for f in self.files}
    unknown = [n for n in names if n not in known]
    if unknown:
      raise DataError(f"{self.name} has no file(s) {', '.join(unknown)}; its files: "
                      f"{', '.join(known)}")
    return tuple(known[n] for n in names) if names else self.files


def sha256_of(path: str) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


def mismatch(path: str, spec: FileSpec) -> str | None:
  """How the file at `path` differs from `spec` ("12 bytes, expected 34"; "SHA-256 ab12…,
  expected cd34…, size 34 as expected"), or None when it matches."""
  size = os.path.getsize(path)
  if size != spec.size:
    return f"{size:,} bytes, expected {spec.size:,}"
  got = sha256_of(path)
  if got != spec.sha256:
    return f"SHA-256 {got[:16]}…, expected {spec.sha256[:16]}…, size {size:,} as expected"
  return None


def file_url(base_url: str, name: str) -> str:
  return base_url + ("" if base_url.endswith("/") else "/") + name


def fetch(release: Release, root: str, *, base_url: str | None = None, names=(),
          progress: Callable[[str], None] = _log.info) -> str:
  """Downloads `release`'s files (those in `names`, or all) into `<root>/<release.name>`,
  verified against the pins, then runs its `prepare`; returns the directory. `base_url` replaces
  the release's (a mirror). Raises DataError in one line on any file that cannot be made right."""
  specs = release.select(names)
  directory = os.path.join(root, release.name)
  base = base_url or release.base_url
  # Every present file is judged first: a refusal comes before anything is written.
  present = [s for s in specs if os.path.exists(os.path.join(directory, s.name))]
  for spec in present:
    path = os.path.join(directory, spec.name)
    try:
      problem = mismatch(path, spec) if os.path.isfile(path) else "not a regular file"
    except OSError as e:
      problem = f"cannot be read: {e.strerror or e}"
    if problem:
      raise DataError(f"{path} is not the published {release.name} file ({problem}); it is left "
                      "untouched: delete or move it and rerun to download the published one")
  missing = [s for s in specs if s not in present]
  try:
    os.makedirs(directory, exist_ok=True)
  except OSError as e:
    raise DataError(f"--dir: cannot create {directory} ({e.strerror or e})") from None
  progress(f"{release.name}: {len(present)} of {len(specs)} files already in {directory} and "
           f"verified; {len(missing)} to download from {base}")
  for spec in missing:
    download(file_url(base, spec.name), os.path.join(directory, spec.name), spec, progress)
  if release.prepare is not None and set(specs) == set(release.files):
    release.prepare(directory, progress)
  progress(f"{release.name}: verified in {directory}")
  return directory


def _open_part(part: str):
  """The `.part` file, opened for reading and writing (created if missing) and locked, so that
  two get_data runs never write the same file."""
  try:
    f = os.fdopen(os.open(part, os.O_RDWR | os.O_CREAT, 0o666), "r+b")
  except OSError as e:
    raise DataError(f"cannot write {part} ({e.strerror or e})") from None
  try:
    fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError:
    f.close()
    raise DataError(f"{part} is being written by another process (another get_data?); wait for "
                    "it to finish and rerun") from None
  return f


def _request(url: str, offset: int):
  """The HTTP response for `url` from byte `offset` on (a Range request when offset > 0); a
  server refusing the range (416) is asked for the whole file."""
  headers = {"User-Agent": "attn-get-data"}
  if offset:
    headers["Range"] = f"bytes={offset}-"
  try:
    return urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                  timeout=_TIMEOUT_S)
  except urllib.error.HTTPError as e:
    if e.code == 416 and offset:
      return _request(url, 0)
    raise DataError(f"{url}: HTTP {e.code} {e.reason} (the base URL + file name must serve the "
                    "published file; see --base_url)") from None
  except (OSError, ValueError, http.client.HTTPException) as e:  # URLError is an OSError
    reason = getattr(e, "reason", None) or e
    raise DataError(f"cannot download {url} ({reason})") from None


def _start(response, offset: int) -> int:
  """Where the response's bytes start in the file: `offset` when it answers the Range request
  (206 with a matching Content-Range), else 0 (the whole file: start over)."""
  if offset and getattr(response, "status", None) == 206:
    content_range = response.headers.get("Content-Range", "")
    if content_range.startswith(f"bytes {offset}-"):
      return offset
  return 0


def download(url: str, path: str, spec: FileSpec, progress: Callable[[str], None]) -> None:
  """`url` into `path` through `path.part` (resumed when one is there), verified against `spec`
  before the rename; see the module docstring for what is kept and what is deleted."""
  part = path + ".part"
  with _open_part(part) as f:
    offset = f.seek(0, os.SEEK_END)
    if offset >= spec.size:  # nothing left to ask for: start over
      offset = 0
    try:
      response = _request(url, offset)
    except DataError:
      if not offset:  # the .part was just created: leave nothing behind
        _discard(f, part)
      raise
    with response:
      start = _start(response, offset)
      if offset and not start:
        progress(f"  {spec.name}: the server does not resume (no 206 answer to a Range "
                 f"request): starting over")
      elif start:
        progress(f"  {spec.name}: resuming at {start:,} of {spec.size:,} bytes")
      else:
        progress(f"  {spec.name}: downloading {spec.size:,} bytes from {url}")
      f.seek(start)
      f.truncate()
      length = response.headers.get("Content-Length")
      declared = start + int(length) if length and length.isdigit() else None
      if declared is not None and declared != spec.size:
        _discard(f, part)
        raise DataError(f"{url}: the server sends {declared:,} bytes, the published {spec.name} "
                        f"has {spec.size:,}; nothing kept (is --base_url right?)")
      received = _copy(response, f, start, spec, url, part, progress)
    if declared is not None and received < declared:
      raise DataError(f"{spec.name}: the download from {url} was cut off at {received:,} of "
                      f"{declared:,} bytes; {part} is kept: rerun the same command to resume")
    _flush(f, part)
    problem = mismatch(part, spec)
    if problem:
      _discard(f, part)
      raise DataError(f"{spec.name}: the download from {url} is not the published file "
                      f"({problem}; truncated or corrupted); nothing kept: rerun, or check "
                      "--base_url")
    os.replace(part, path)
  progress(f"  {spec.name}: {spec.size:,} bytes, SHA-256 verified")


def _copy(response, f, received: int, spec: FileSpec, url: str, part: str, progress) -> int:
  """Appends the response body to `f` (at most one byte past the pinned size: enough to know
  it is too long); returns the file's size. A transfer cut off by the network keeps what came
  (rerun resumes); a failed write (disk full) deletes the `.part`."""
  next_report = received + _REPORT_EVERY
  while received <= spec.size:
    try:
      chunk = response.read(min(_CHUNK, spec.size + 1 - received))
    except (OSError, ValueError, http.client.HTTPException) as e:  # reset, timeout, cut off
      _flush(f, part)
      raise DataError(f"{spec.name}: the download from {url} was cut off at {received:,} of "
                      f"{spec.size:,} bytes ({e}); {part} is kept: rerun the same command to "
                      "resume") from None
    if not chunk:
      break
    try:
      f.write(chunk)
    except OSError as e:
      _discard(f, part)
      raise DataError(f"cannot write {part} ({e.strerror or e}) at {received:,} of "
                      f"{spec.size:,} bytes; nothing kept: free space and rerun") from None
    received += len(chunk)
    if received >= next_report and received < spec.size:
      progress(f"  {spec.name}: {received:,} of {spec.size:,} bytes")
      next_report += _REPORT_EVERY
  return received


def _flush(f, part: str) -> None:
  try:
    f.flush()
    os.fsync(f.fileno())
  except OSError as e:
    _discard(f, part)
    raise DataError(f"cannot write {part} ({e.strerror or e}); nothing kept: free space and "
                    "rerun") from None


def _discard(f, part: str) -> None:
  """Empties and deletes the `.part` (the lock is held until `f` closes)."""
  try:
    f.truncate(0)
  except OSError:  # the unlink below is what matters; truncating only frees the space sooner
    pass
  if os.path.exists(part):
    os.unlink(part)
