"""Batches from rows of a split: the ids, lengths, gold alignments and source-extended ids of
each row, padded to its bucket's widths (the batch layout is in pipeline.py's docstring)."""

from __future__ import annotations

import numpy as np

from attn.data.base import EOS, PAD, UNK, DataError
from attn.data.splits import SplitData, records
from attn.data.tokenize import Vocab


class Collate:
  """grain map: (bucket, rows) -> batch dict (see module docstring)."""

  def __init__(self, split: SplitData, src_vocab: Vocab, tgt_vocab: Vocab, shapes, read,
               read_alignment=None, extended: bool = False,
               packed: tuple[int, int] | None = None):
    self.split, self.src_vocab, self.tgt_vocab = split, src_vocab, tgt_vocab
    # (Ts, Tt) of packed rows: items are then (k, members [B, P]), k a shape every member fits
    self.packed = packed
    self.shapes, self.read, self.read_alignment = shapes, read, read_alignment
    self.extended = extended  # needs src_vocab is tgt_vocab (DataConfig.validate)

  def __call__(self, item) -> dict[str, np.ndarray]:
    return self._packed(*item) if self.packed else self._rows(*item)

  def _packed(self, k, members) -> dict[str, np.ndarray]:
    """Row r holds the examples members[r, :] (-1: none) one after another, each with its own
    EOS; `*_segments` number them 1, 2, ... along the row (0: padding) and `*_positions` count
    from 0 at each one's start; the lengths are the row's filled slots, and example_id its first
    example's record."""
    ts, tt = self.packed
    flat = members[members >= 0]
    one = self._rows(k, flat)  # every example on a row of its own
    b = members.shape[0]
    batch = {"example_id": np.full((b,), -1, np.int32)}
    for side, width in (("src", ts), ("tgt", tt)):
      batch[side] = np.full((b, width), PAD, np.int32)
      batch[f"{side}_lengths"] = np.zeros((b,), np.int32)
      batch[f"{side}_segments"] = np.zeros((b, width), np.int32)
      batch[f"{side}_positions"] = np.zeros((b, width), np.int32)
    i = 0
    for r in range(b):
      for seg, _ in enumerate(members[r][members[r] >= 0], start=1):
        if seg == 1:
          batch["example_id"][r] = one["example_id"][i]
        for side in ("src", "tgt"):
          n, at = int(one[f"{side}_lengths"][i]), int(batch[f"{side}_lengths"][r])
          batch[side][r, at:at + n] = one[side][i, :n]
          batch[f"{side}_segments"][r, at:at + n] = seg
          batch[f"{side}_positions"][r, at:at + n] = np.arange(n)
          batch[f"{side}_lengths"][r] = at + n
        i += 1
    return batch

  def _rows(self, k, rows) -> dict[str, np.ndarray]:
    ts, tt = self.shapes[k]
    b = rows.size
    sp = self.split
    batch = {
        "src": np.full((b, ts), PAD, np.int32),
        "src_lengths": np.zeros((b,), np.int32),
        "tgt": np.full((b, tt), PAD, np.int32),
        "tgt_lengths": np.zeros((b,), np.int32),
        "example_id": np.full((b,), -1, np.int32),
    }
    if self.read_alignment is not None:
      batch["alignments"] = np.zeros((b, tt, ts), np.float32)
    if self.extended:
      batch["src_ext"] = np.full((b, ts), PAD, np.int32)
      batch["tgt_ext"] = np.full((b, tt), PAD, np.int32)
    valid = np.flatnonzero(rows >= 0)
    recs = records(sp.source, sp.record[rows[valid]])
    for r, rec in zip(valid, recs):
      row = rows[r]
      sl, tl = int(sp.src_len[row]), int(sp.tgt_len[row])
      src_text, tgt_text = self.read(rec)
      if self.extended:
        v = self.src_vocab
        oovs = v.source_oovs(src_text, sl - 1)
        src_ext = np.asarray(v.encode_extended(src_text, oovs)[:sl - 1], np.int32)
        tgt_ext = np.asarray(v.encode_extended(tgt_text, oovs)[:tl - 1], np.int32)
        batch["src_ext"][r, :src_ext.size] = src_ext
        batch["src_ext"][r, sl - 1] = EOS
        batch["tgt_ext"][r, :tgt_ext.size] = tgt_ext
        batch["tgt_ext"][r, tl - 1] = EOS
        # the plain ids are the extended ones with every OOV back to UNK (one tokenization less)
        src_ids = np.where(src_ext >= v.size, UNK, src_ext)
        tgt_ids = np.where(tgt_ext >= v.size, UNK, tgt_ext)
      else:
        src_ids = self.src_vocab.encode(src_text)[:sl - 1]
        tgt_ids = self.tgt_vocab.encode(tgt_text)[:tl - 1]
      if len(src_ids) != sl - 1 or len(tgt_ids) != tl - 1:
        raise DataError(f"{sp.description}: record {sp.record[row]} no longer has the length "
                        "measured at load time (stale lengths cache? delete <workdir>/data_lengths)")
      batch["src"][r, :sl - 1] = src_ids
      batch["src"][r, sl - 1] = EOS
      batch["tgt"][r, :tl - 1] = tgt_ids
      batch["tgt"][r, tl - 1] = EOS
      batch["src_lengths"][r], batch["tgt_lengths"][r] = sl, tl
      batch["example_id"][r] = sp.record[row]
      if self.read_alignment is not None:
        a = batch["alignments"][r]  # [Tt, Ts] view
        pairs = self.read_alignment(rec)
        keep = (pairs[:, 0] < tl - 1) & (pairs[:, 1] < sl - 1)
        a[pairs[keep, 0], pairs[keep, 1]] = 1.0
        a[tl - 1, sl - 1] = 1.0  # EOS -> EOS
        a /= np.maximum(a.sum(1, keepdims=True), 1.0)
    return batch
