"""A split's records after the policies: reading records in chunks, the cached token counts
of every record, and the drop/truncate/error policies that decide which records are kept (at what
width). `SplitData` is the outcome; pipeline.py buckets and batches it."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
from typing import Iterator

import numpy as np

from attn.common.files import atomic_path
from attn.data.base import DataError
from attn.data.config import DataConfig
from attn.data.tokenize import Vocab

log = logging.getLogger(__name__)

_CHUNK = 1024  # records read per call when scanning a split


def records(ds, indices) -> list:
  indices = [int(i) for i in indices]
  if hasattr(ds, "__getitems__"):
    return list(ds.__getitems__(indices))
  return [ds[i] for i in indices]


def scan(ds, read) -> Iterator[tuple[str, str]]:
  """(src, tgt) text of every record in order, read in chunks."""
  n = len(ds)
  for start in range(0, n, _CHUNK):
    for rec in records(ds, range(start, min(n, start + _CHUNK))):
      yield read(rec)


@dataclasses.dataclass
class SplitData:
  """One split after the policies. Arrays are [N] over the kept examples, in record order.

  record: index of the example in the split's data source (= example_id).
  src_len, tgt_len: widths incl. EOS, after truncation.  bucket: index into DataBundle.shapes.
  counts: read, kept, dropped_empty, dropped_long, truncated.
  """
  role: str
  name: str
  description: str
  source: object
  record: np.ndarray
  src_len: np.ndarray
  tgt_len: np.ndarray
  bucket: np.ndarray
  counts: dict

  def __len__(self) -> int:
    return int(self.record.size)


def token_counts(source, role: str, src_vocab: Vocab, tgt_vocab: Vocab,
                  workdir: str | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Per record: source tokens, target tokens (no EOS), and whether a side is empty. Cached in
  <workdir>/data_lengths keyed by the records and vocabularies."""
  key = hashlib.sha1("|".join([source.fingerprint(), role, src_vocab.fingerprint(),
                               tgt_vocab.fingerprint()]).encode()).hexdigest()[:16]
  path = os.path.join(workdir, "data_lengths", f"{role}-{key}.npz") if workdir else None
  if path and os.path.exists(path):
    with np.load(path) as z:
      return z["src"], z["tgt"], z["empty"]
  src_n, tgt_n, empty = [], [], []
  for s, t in scan(source.data_source(role), source.read):
    src_n.append(len(src_vocab.encode(s)))
    tgt_n.append(len(tgt_vocab.encode(t)))
    empty.append(not s.strip() or not t.strip())
  out = (np.asarray(src_n, np.int32), np.asarray(tgt_n, np.int32), np.asarray(empty, bool))
  if path:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with atomic_path(path, suffix=".npz") as tmp:  # np.savez appends .npz to other names
      np.savez(tmp, src=out[0], tgt=out[1], empty=out[2])
  return out


def apply_policies(cfg: DataConfig, source, role: str, src_n, tgt_n, empty, caps) -> SplitData:
  """Drop/truncate/raise per config (training) or keep-and-truncate (eval/test); log the counts."""
  src_cap, tgt_cap = caps
  desc = source.describe(role)
  src_len, tgt_len = src_n + 1, tgt_n + 1  # EOS
  too_long = (src_len > src_cap) | (tgt_len > tgt_cap)
  keep = np.ones(src_n.shape, bool)
  counts = dict(read=int(src_n.size), dropped_empty=0, dropped_long=0, truncated=0)
  if role == "train":
    if empty.any():
      if cfg.empty == "error":
        i = int(np.flatnonzero(empty)[0])
        raise DataError(f"{desc}: pair {i} (line {i + 1}) has an empty side ({int(empty.sum())} such "
                        "pairs); set data.empty=drop to skip them")
      keep &= ~empty
      counts["dropped_empty"] = int(empty.sum())
    long_kept = too_long & keep
    if long_kept.any():
      if cfg.too_long == "error":
        i = int(np.flatnonzero(long_kept)[0])
        raise DataError(f"{desc}: pair {i} (line {i + 1}) is {src_len[i]}/{tgt_len[i]} tokens with EOS, over "
                        f"max_src_len={src_cap}/max_tgt_len={tgt_cap} ({int(long_kept.sum())} such "
                        "pairs); set data.too_long=drop or truncate")
      if cfg.too_long == "drop":
        keep &= ~too_long
        counts["dropped_long"] = int(long_kept.sum())
      else:
        counts["truncated"] = int(long_kept.sum())
  else:
    counts["truncated"] = int(too_long.sum())
  counts["kept"] = int(keep.sum())
  name = source.splits()[role]
  log.debug("data %s (%s): %d pairs, kept %d, dropped %d empty and %d too long, truncated %d",
               role, desc, counts["read"], counts["kept"], counts["dropped_empty"],
               counts["dropped_long"], counts["truncated"])
  record = np.flatnonzero(keep).astype(np.int64)
  return SplitData(role, name, desc, source.data_source(role), record,
                   np.minimum(src_len[keep], src_cap).astype(np.int32),
                   np.minimum(tgt_len[keep], tgt_cap).astype(np.int32),
                   np.zeros(record.size, np.int32), counts)
