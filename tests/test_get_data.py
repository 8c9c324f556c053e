"""`python -m experiments.get_data`: pinned downloads over real HTTP from a server on 127.0.0.1
(a thread serving fixture bytes; no mocked client), the AESLC zip reader, and the data presets
reading the layout get_data writes."""

from __future__ import annotations

import dataclasses
import fcntl
import gzip
import hashlib
import http.server
import json
import os
import re
import resource
import signal
import subprocess
import sys
import threading
import zipfile

import pytest

from attn.data import aeslc, corpora, downloads, downloads_catalog
from attn.data.config import DataConfig
from attn.errors import DataError
from experiments.configs import data as data_presets, summarize, translate

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.environ.get(data_presets.SHARED_DATA_ENV, os.path.join(REPO, "..", "shared", "data"))

SMALL = gzip.compress(b"ein Hund .\nzwei Katzen .\n", mtime=0)
BIG = bytes(range(256)) * 1200  # 307,200 bytes: several 64 KiB chunks


def _spec(name, blob):
  return downloads.FileSpec(name, len(blob), hashlib.sha256(blob).hexdigest())


FIXTURE = downloads.Release(
    name="fixture", title="two small files", base_url="http://127.0.0.1:9/never/",
    files=(_spec("small.de.gz", SMALL), _spec("big.bin", BIG)), licence="test data")


@dataclasses.dataclass
class ServerState:
  """What the server serves and how; `requests`: (file name, Range header or None) per GET."""
  files: dict
  ranges: bool = True  # answer a Range request with 206 (False: ignore it, send 200)
  cut_after: int | None = None  # send the full Content-Length, then only this many bytes
  content_length: bool = True
  requests: list = dataclasses.field(default_factory=list)


class _Handler(http.server.BaseHTTPRequestHandler):

  def do_GET(self):  # pylint: disable=invalid-name
    state = self.server.state
    name, wanted = self.path.rsplit("/", 1)[-1], self.headers.get("Range")
    state.requests.append((name, wanted))
    if name not in state.files:
      self.send_error(404)
      return
    body, start = state.files[name], 0
    if wanted and state.ranges:
      start = int(wanted.split("=")[1].rstrip("-"))
      self.send_response(206)
      self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
    else:
      self.send_response(200)
    if state.content_length:
      self.send_header("Content-Length", str(len(body) - start))
    self.end_headers()
    self.wfile.write(body[start:] if state.cut_after is None else body[start:start + state.cut_after])

  def log_message(self, *args):  # keep the test output clean
    del args


@pytest.fixture
def server():
  httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
  httpd.state = ServerState(files={"small.de.gz": SMALL, "big.bin": BIG})
  thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
  thread.start()
  httpd.url = f"http://127.0.0.1:{httpd.server_address[1]}/mirror/"
  yield httpd
  httpd.shutdown()
  httpd.server_close()


def _fetch(release, root, server, lines=None, **kw):
  lines = [] if lines is None else lines
  return downloads.fetch(release, str(root), base_url=server.url, progress=lines.append, **kw)


def _listing(directory):
  return sorted(os.listdir(directory)) if os.path.isdir(directory) else []


# ---------------------------------------------------------------------------------------------
# downloads: verified, cached, resumed, refused


def test_a_fresh_download_is_verified_and_a_second_run_downloads_nothing(tmp_path, server):
  directory = _fetch(FIXTURE, tmp_path, server)
  assert directory == str(tmp_path / "fixture")
  assert (tmp_path / "fixture" / "small.de.gz").read_bytes() == SMALL
  assert (tmp_path / "fixture" / "big.bin").read_bytes() == BIG
  assert _listing(directory) == ["big.bin", "small.de.gz"]  # no .part left
  assert server.state.requests == [("small.de.gz", None), ("big.bin", None)]
  lines = []
  _fetch(FIXTURE, tmp_path, server, lines)
  assert len(server.state.requests) == 2  # the cache: nothing asked of the server
  assert "2 of 2 files already in" in lines[0]


def test_a_subset_of_files_and_an_unknown_file_name(tmp_path, server):
  _fetch(FIXTURE, tmp_path, server, names=("small.de.gz",))
  assert _listing(tmp_path / "fixture") == ["small.de.gz"]
  with pytest.raises(DataError, match=r"^fixture has no file\(s\) nope\.gz; its files: "
                                      r"small\.de\.gz, big\.bin$"):
    _fetch(FIXTURE, tmp_path, server, names=("nope.gz",))


def test_a_present_file_that_does_not_match_is_refused_and_left_untouched(tmp_path, server):
  (tmp_path / "fixture").mkdir()
  mine = tmp_path / "fixture" / "big.bin"
  mine.write_bytes(b"my own notes")
  with pytest.raises(DataError) as e:
    _fetch(FIXTURE, tmp_path, server)
  message = str(e.value)
  assert "\n" not in message
  assert message.startswith(f"{mine} is not the published fixture file (12 bytes, expected "
                            "307,200); it is left untouched: delete or move it and rerun")
  assert mine.read_bytes() == b"my own notes"
  assert server.state.requests == []  # refused before anything was downloaded
  mine.write_bytes(BIG[:-1] + b"\x00")  # right size, other bytes
  with pytest.raises(DataError, match=r"big\.bin is not the published fixture file \(SHA-256 "
                                      r"[0-9a-f]{16}…, expected [0-9a-f]{16}…, size 307,200 as expected\)"):
    _fetch(FIXTURE, tmp_path, server)


@pytest.mark.parametrize("ranges", [True, False])
def test_an_interrupted_download_resumes_with_range_or_starts_over(tmp_path, server, ranges):
  server.state.cut_after = 100_000
  with pytest.raises(DataError) as e:
    _fetch(FIXTURE, tmp_path, server)
  part = tmp_path / "fixture" / "big.bin.part"
  assert str(e.value) == (f"big.bin: the download from {server.url}big.bin was cut off at 100,000 "
                          f"of 307,200 bytes; {part} is kept: rerun the same command to resume")
  assert part.read_bytes() == BIG[:100_000]
  assert not (tmp_path / "fixture" / "big.bin").exists()
  server.state.cut_after, server.state.ranges = None, ranges
  lines = []
  _fetch(FIXTURE, tmp_path, server, lines)
  assert server.state.requests[-1] == ("big.bin", "bytes=100000-")
  assert (tmp_path / "fixture" / "big.bin").read_bytes() == BIG
  assert not part.exists()
  said = "resuming at 100,000 of 307,200 bytes" if ranges else "the server does not resume"
  assert any(said in line for line in lines), lines


def test_a_truncated_response_is_refused_and_nothing_is_kept(tmp_path, server):
  server.state.files["big.bin"] = BIG[:50_000]  # a server whose file is cut short
  with pytest.raises(DataError, match=r"^http://127\.0\.0\.1:\d+/mirror/big\.bin: the server sends "
                                      r"50,000 bytes, the published big\.bin has 307,200; nothing "
                                      r"kept \(is --base_url right\?\)$"):
    _fetch(FIXTURE, tmp_path, server)
  assert _listing(tmp_path / "fixture") == ["small.de.gz"]
  server.state.content_length = False  # no length announced: found short after the transfer
  with pytest.raises(DataError, match=r"^big\.bin: the download from .* is not the published file "
                                      r"\(50,000 bytes, expected 307,200; truncated or corrupted\); "
                                      r"nothing kept"):
    _fetch(FIXTURE, tmp_path, server)
  assert _listing(tmp_path / "fixture") == ["small.de.gz"]


def test_a_corrupted_download_is_refused_and_deleted(tmp_path, server):
  server.state.files["big.bin"] = BIG[:-1] + b"\x00"
  with pytest.raises(DataError) as e:
    _fetch(FIXTURE, tmp_path, server)
  expected = hashlib.sha256(BIG).hexdigest()[:16]
  got = hashlib.sha256(BIG[:-1] + b"\x00").hexdigest()[:16]
  assert str(e.value) == (f"big.bin: the download from {server.url}big.bin is not the published "
                          f"file (SHA-256 {got}…, expected {expected}…, size 307,200 as expected; "
                          "truncated or corrupted); nothing kept: rerun, or check --base_url")
  assert _listing(tmp_path / "fixture") == ["small.de.gz"]
  # a kept .part whose bytes are not the file's start: the resumed whole fails and is deleted
  server.state.files["big.bin"] = BIG
  (tmp_path / "fixture" / "big.bin.part").write_bytes(b"\xff" * 1000)
  with pytest.raises(DataError, match=r"^big\.bin: the download .*\(SHA-256"):
    _fetch(FIXTURE, tmp_path, server)
  assert _listing(tmp_path / "fixture") == ["small.de.gz"]
  _fetch(FIXTURE, tmp_path, server)  # the rerun starts afresh
  assert (tmp_path / "fixture" / "big.bin").read_bytes() == BIG


def test_http_errors_and_a_file_being_written_by_another_process(tmp_path, server):
  del server.state.files["big.bin"]
  with pytest.raises(DataError, match=r"^http://127\.0\.0\.1:\d+/mirror/big\.bin: HTTP 404 Not Found "
                                      r"\(the base URL \+ file name must serve the published file"):
    _fetch(FIXTURE, tmp_path, server)
  assert _listing(tmp_path / "fixture") == ["small.de.gz"]  # no empty .part left
  server.state.files["big.bin"] = BIG
  part = tmp_path / "fixture" / "big.bin.part"
  with open(part, "wb") as other:
    fcntl.flock(other.fileno(), fcntl.LOCK_EX)
    with pytest.raises(DataError, match=r"big\.bin\.part is being written by another process"):
      _fetch(FIXTURE, tmp_path, server)


def test_a_full_disk_while_downloading_deletes_the_part_file(tmp_path, server):
  # A real failing write: the child may write no file past 200 kB (EFBIG, as ENOSPC would).
  code = ("import sys; sys.path.insert(0, 'tests'); from attn.errors import DataError\n"
          "import test_get_data as t; from attn.data import downloads\n"
          f"try: downloads.fetch(t.FIXTURE, {str(tmp_path)!r}, base_url={server.url!r})\n"
          "except DataError as e: print(e); sys.exit(2)\n")

  def limit():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))

  out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                       preexec_fn=limit, timeout=120, check=False)
  assert out.returncode == 2, out.stderr[-2000:]
  part = tmp_path / "fixture" / "big.bin.part"
  assert re.fullmatch(rf"cannot write {re.escape(str(part))} \(File too large\) at [\d,]+ of "
                      r"307,200 bytes; nothing kept: free space and rerun", out.stdout.strip())
  assert _listing(tmp_path / "fixture") == ["small.de.gz"]


# ---------------------------------------------------------------------------------------------
# the command line


def _get_data(*args):
  return subprocess.run([sys.executable, "-m", "experiments.get_data", *args], cwd=REPO,
                        capture_output=True, text=True, timeout=120, check=False)


def test_the_command_line_refuses_in_one_line_with_exit_status_2(tmp_path, server):
  out = _get_data("multi30kk", f"--dir={tmp_path}")
  assert (out.returncode, out.stderr) == (2, "error: unknown dataset 'multi30kk'; known: aeslc, "
                                             "multi30k\n")
  out = _get_data(f"--dir={tmp_path}")
  assert (out.returncode, out.stderr.count("\n")) == (2, 1)
  assert out.stderr.startswith("error: give one dataset NAME")
  # the fixture's bytes are not Multi30k's: refused, nothing written
  server.state.files["val.de.gz"] = SMALL
  out = _get_data("multi30k", f"--dir={tmp_path}", f"--base_url={server.url}",
                  "--files=val.de.gz")
  assert out.returncode == 2
  assert out.stderr == (f"error: {server.url}val.de.gz: the server sends {len(SMALL)} bytes, the "
                        "published val.de.gz has 24,681; nothing kept (is --base_url right?)\n")
  assert _listing(tmp_path / "multi30k") == []


def test_multi30k_from_a_mirror_of_the_published_files(tmp_path, server):
  shared = os.path.join(SHARED, "multi30k")
  if not os.path.isdir(shared):
    pytest.skip(f"shared corpora absent: no {shared} (set $ATTN_SHARED_DATA)")
  names = sorted(os.listdir(shared))
  for name in names:
    with open(os.path.join(shared, name), "rb") as f:
      server.state.files[name] = f.read()
  out = _get_data("multi30k", f"--dir={tmp_path}", f"--base_url={server.url}",
                  "--files=" + ",".join(names))
  assert out.returncode == 0, out.stderr
  assert _listing(tmp_path / "multi30k") == names
  cfg = DataConfig.from_config(data_presets.get_config("multi30k"))
  for split in (cfg.train_split, cfg.eval_split, cfg.test_split):  # what the preset reads
    corpora.parallel_paths(str(tmp_path / "multi30k"), split, cfg.src_lang, cfg.tgt_lang)


# ---------------------------------------------------------------------------------------------
# AESLC: the release zip read as records, written as the JSON lines the preset reads

_DEV_FILE = ("Hi Phillip,  This message is to confirm our meeting.\nAttendees will be Monica.\n"
             "Thanks,\n\n@subject\nConfirmation: Risk Meeting 10/30/01\n\n@ann0\nmeeting "
             "confimation - tues\n\n@ann1\nmeeting confirmation\n\n@ann2\nmeeting confirmed\n")
TINY = {  # member -> text, the release's layout
    "train/allen-p_inbox_20.subject": "Greg/Phillip,  Attached is the agreement.\n<<doc>>\n\n"
                                      "@subject\nService Agreement\n",
    "train/allen-p_inbox_3.subject": "Lunch?\r\n\r\n@subject\r\nre: lunch\r\n",
    "dev/allen-p_inbox_29.subject": _DEV_FILE,
    "test/allen-p_inbox_24.subject": "Could you do me a favor?\n\n@subject\nHuntley/question\n\n"
                                     "@ann0\nfavor\n\n@ann1\ntitle policy\n\n@ann2\ncopy of title "
                                     "policy\n",
}
EXPECTED = {
    "train": [{"email": "Greg/Phillip,  Attached is the agreement.\n<<doc>>",
               "subject": "Service Agreement", "id": "allen-p_inbox_20"},
              {"email": "Lunch?", "subject": "re: lunch", "id": "allen-p_inbox_3"}],
    "dev": [{"email": "Hi Phillip,  This message is to confirm our meeting.\nAttendees will be "
                      "Monica.\nThanks,", "subject": "Confirmation: Risk Meeting 10/30/01",
             "id": "allen-p_inbox_29", "ann0": "meeting confimation - tues",
             "ann1": "meeting confirmation", "ann2": "meeting confirmed"}],
    "test": [{"email": "Could you do me a favor?", "subject": "Huntley/question", "ann0": "favor",
              "id": "allen-p_inbox_24", "ann1": "title policy", "ann2": "copy of title policy"}]}


def write_zip(path, members, top="AESLC-master"):
  with zipfile.ZipFile(path, "w") as z:
    z.writestr(f"{top}/", b"")
    z.writestr(f"{top}/README.md", b"# AESLC\n")
    for name, text in members.items():
      z.writestr(f"{top}/enron_subject_line/{name}", text.encode("utf-8"))
  return str(path)


def test_the_aeslc_zip_reads_as_records_with_the_annotations(tmp_path):
  path = write_zip(tmp_path / "master.zip", TINY)
  for split, records in EXPECTED.items():
    assert list(aeslc.records(path, split)) == records


def test_a_broken_aeslc_zip_is_one_line_naming_the_member(tmp_path):
  path = write_zip(tmp_path / "master.zip", {**TINY, "dev/x_1.subject": "no subject marker\n"})
  with pytest.raises(DataError, match=r"master\.zip:AESLC-master/enron_subject_line/dev/x_1\.subject: "
                                      r"no @subject line \(not an AESLC \.subject file\)$"):
    list(aeslc.records(path, "dev"))
  (tmp_path / "not.zip").write_bytes(b"PK nothing")
  with pytest.raises(DataError, match=r"not\.zip: cannot read the zip \(File is not a zip file\)$"):
    list(aeslc.records(str(tmp_path / "not.zip"), "train"))
  empty = write_zip(tmp_path / "empty.zip", {})
  with pytest.raises(DataError, match=r"no enron_subject_line/test/\*\.subject files"):
    list(aeslc.records(empty, "test"))


def _aeslc_fixture(tmp_path, server):
  blob = open(write_zip(tmp_path / "master.zip", TINY), "rb").read()
  server.state.files["master.zip"] = blob
  return dataclasses.replace(downloads_catalog.RELEASES.get("aeslc"),
                             files=(_spec("master.zip", blob),))


def test_aeslc_downloads_into_the_layout_the_preset_reads(tmp_path, server):
  from attn import data  # pylint: disable=import-outside-toplevel
  release = _aeslc_fixture(tmp_path, server)
  directory = _fetch(release, tmp_path / "data", server)
  assert _listing(directory) == ["dev.jsonl.gz", "master.zip", "test.jsonl.gz", "train.jsonl.gz"]
  for split, records in EXPECTED.items():
    with gzip.open(os.path.join(directory, f"{split}.jsonl.gz")) as f:
      assert [json.loads(line) for line in f] == records
  stamps = [os.stat(os.path.join(directory, n)).st_mtime_ns for n in _listing(directory)]
  _fetch(release, tmp_path / "data", server)  # cached: nothing rewritten
  assert [os.stat(os.path.join(directory, n)).st_mtime_ns for n in _listing(directory)] == stamps
  cfg = data_presets.get_config("aeslc")
  cfg.update(dir=directory, cache_dir=str(tmp_path / "cache"), test_split="test", batch_size=2,
             num_buckets=1, reference_fields=("ann0", "ann1", "ann2"))
  bundle = data.load(cfg, str(tmp_path / "work"))
  assert bundle.references("test") == ["Huntley/question"]
  assert bundle.annotations("test") == [["favor", "title policy", "copy of title policy"]]


def test_an_interrupted_aeslc_conversion_leaves_no_half_written_file(tmp_path, server, monkeypatch):
  release = _aeslc_fixture(tmp_path, server)
  real = aeslc.records

  def failing(zip_path, split):
    if split == "test":
      raise KeyboardInterrupt
    return real(zip_path, split)

  monkeypatch.setattr(aeslc, "records", failing)
  with pytest.raises(KeyboardInterrupt):
    _fetch(release, tmp_path, server)
  assert _listing(tmp_path / "aeslc") == ["dev.jsonl.gz", "master.zip", "train.jsonl.gz"]
  monkeypatch.setattr(aeslc, "records", real)
  _fetch(release, tmp_path, server)  # the rerun writes what is missing
  assert "test.jsonl.gz" in _listing(tmp_path / "aeslc")


def _shared_aeslc():
  directory = os.path.join(SHARED, "aeslc")
  if not os.path.isdir(directory):
    pytest.skip(f"shared corpora absent: no {directory} (set $ATTN_SHARED_DATA)")
  return directory


def _head(path, n):
  with gzip.open(path) as f:
    return [json.loads(line) for _, line in zip(range(n), f)]


def test_aeslc_files_written_as_released_read_back_as_the_shared_copy(tmp_path):
  """Real emails (spaces, several lines, punctuation) through the release's file format."""
  shared = _shared_aeslc()
  members, expected = {}, {}
  for split in ("train", "dev"):
    expected[split] = _head(os.path.join(shared, f"{split}.jsonl.gz"), 40)
    for r in expected[split]:
      members[f"{split}/{r['id']}.subject"] = f"{r['email']}\n\n@subject\n{r['subject']}\n"
  path = write_zip(tmp_path / "master.zip", members)
  for split in ("train", "dev"):
    assert list(aeslc.records(path, split)) == sorted(expected[split], key=lambda r: r["id"])


def test_the_release_zip_reads_as_the_shared_copy():
  """With the real zip at $ATTN_AESLC_ZIP (get_data aeslc writes DIR/aeslc/master.zip)."""
  shared = _shared_aeslc()
  path = os.environ.get("ATTN_AESLC_ZIP", "")
  if not os.path.isfile(path):
    pytest.skip("no AESLC release zip: set $ATTN_AESLC_ZIP to compare it with the shared copy")
  for split in ("train", "dev"):
    expected = _head(os.path.join(shared, f"{split}.jsonl.gz"), 300)
    got = [{k: r[k] for k in ("email", "subject", "id")} for r in aeslc.records(path, split)]
    assert got[:300] == expected
  assert {"ann0", "ann1", "ann2"} <= set(next(aeslc.records(path, "test")))


# ---------------------------------------------------------------------------------------------
# the presets read what get_data writes; a missing file names the command


def _files_read(cfg) -> set[str]:
  c = DataConfig.from_config(cfg)
  splits = [s for s in (c.train_split, c.eval_split, c.test_split) if s]
  if c.task == "jsonl":
    return {f"{s}.jsonl.gz" for s in splits}
  return {f"{s}.{lang}.gz" for s in splits for lang in (c.src_lang, c.tgt_lang)}


@pytest.mark.parametrize("config", [
    lambda: data_presets.get_config("multi30k"), lambda: data_presets.get_config("multi30k_en_de"),
    lambda: data_presets.get_config("aeslc"), lambda: translate.get_config("multi30k").data,
    lambda: translate.get_config("multi30k_transformer").data,
    lambda: summarize.get_config("aeslc").data])
def test_each_local_corpus_preset_reads_files_get_data_writes(config):
  cfg = config()
  release = downloads_catalog.RELEASES.get(os.path.basename(cfg.dir))
  assert _files_read(cfg) <= set(release.provided())


def test_a_missing_corpus_file_names_the_get_data_command(tmp_path):
  (tmp_path / "multi30k").mkdir()
  (tmp_path / "multi30k" / "train.de.gz").write_bytes(SMALL)
  with pytest.raises(DataError) as e:
    corpora.parallel_paths(str(tmp_path / "multi30k"), "train", "de", "en")
  assert str(e.value) == (f"no file train.en[.gz] in {tmp_path}/multi30k (it holds: train.de.gz); "
                          f"`python -m experiments.get_data multi30k --dir={tmp_path}` downloads "
                          f"the published files to {tmp_path}/multi30k")
  with pytest.raises(DataError) as e:
    corpora.jsonl_path(str(tmp_path / "mail"), "dev")
  assert str(e.value).endswith(f"it should hold dev.jsonl[.gz]); `python -m experiments.get_data "
                               f"aeslc --dir={tmp_path}` downloads the published files to "
                               f"{tmp_path}/aeslc (then set data.dir={tmp_path}/aeslc)")
