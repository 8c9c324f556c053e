"""Length buckets, batch plans and padding accounting (pure numpy; no grain, no TFDS).

A bucket is a shape (Ts, Tt): source and target widths, EOS included. Every batch of a bucket has
exactly that shape (and, per bucket, a fixed batch size), so a jitted step compiles once per bucket.
An example goes to the fitting bucket of least width Ts + Tt.

`choose_buckets` picks K shapes for the length distribution: it starts from the shape covering
everything and adds, greedily, the candidate (multiples of `multiple`) that removes the most padding,
then swaps shapes while that helps (local search). Because source and target widths are chosen
together, a bucket of long sources keeps short targets short (summarization), and a few target
outliers do not widen every bucket. How much each corpus pads: docs/data.md.
"""

from __future__ import annotations

import numpy as np


def round_up(x, m: int):
  return -(-np.asarray(x) // m) * m


def choose_buckets(src_len: np.ndarray, tgt_len: np.ndarray, num_buckets: int,
                   multiple: int = 1) -> list[tuple[int, int]]:
  """Up to `num_buckets` shapes (Ts, Tt), sorted, covering every (src_len[i], tgt_len[i]).

  src_len, tgt_len: [N] int widths (EOS included). Minimizes the padded slots sum of (Ts + Tt)
  over examples, each in its narrowest fitting shape.
  """
  src_len, tgt_len = np.asarray(src_len, np.int64), np.asarray(tgt_len, np.int64)
  if src_len.size == 0:
    raise ValueError("choose_buckets: no examples")
  keys, counts = np.unique(np.stack([src_len, tgt_len], 1), axis=0, return_counts=True)  # [n, 2]
  s_max, t_max = int(round_up(src_len.max(), multiple)), int(round_up(tgt_len.max(), multiple))
  cs = np.arange(multiple, s_max + 1, multiple)
  ct = np.arange(multiple, t_max + 1, multiple)
  cand = np.stack(np.meshgrid(cs, ct, indexing="ij"), -1).reshape(-1, 2)  # [C, 2]
  fits = (keys[:, None, 0] <= cand[None, :, 0]) & (keys[:, None, 1] <= cand[None, :, 1])  # [n, C]
  width = np.where(fits, cand.sum(1)[None, :].astype(np.float64), np.inf)  # [n, C]
  w = counts.astype(np.float64)[:, None]

  top = len(cand) - 1  # (s_max, t_max) covers everything
  chosen = [top]
  best_width = width[:, top].copy()  # [n]
  for _ in range(num_buckets - 1):
    trial = np.minimum(best_width[:, None], width)  # [n, C]
    totals = (trial * w).sum(0)
    j = int(np.argmin(totals))
    if totals[j] >= (best_width * w[:, 0]).sum():
      break  # nothing left to gain
    chosen.append(j)
    best_width = trial[:, j]

  total = (best_width * w[:, 0]).sum()
  for _ in range(20):  # local search: replace one shape at a time (never the covering one)
    improved = False
    for pos in range(1, len(chosen)):
      others = [c for i, c in enumerate(chosen) if i != pos]
      base = width[:, others].min(1)
      totals = (np.minimum(base[:, None], width) * w).sum(0)
      j = int(np.argmin(totals))
      if totals[j] < total - 1e-9 and j not in chosen:
        chosen[pos], total, improved = j, totals[j], True
    if not improved:
      break
  return sorted({(int(cand[c, 0]), int(cand[c, 1])) for c in chosen})


def assign(src_len: np.ndarray, tgt_len: np.ndarray, shapes) -> np.ndarray:
  """[N] bucket index: the fitting shape of least Ts + Tt (first on ties); -1 if none fits."""
  shapes = np.asarray(shapes, np.int64).reshape(-1, 2)
  fits = (np.asarray(src_len)[:, None] <= shapes[None, :, 0]) & (
      np.asarray(tgt_len)[:, None] <= shapes[None, :, 1])  # [N, K]
  width = np.where(fits, shapes.sum(1)[None, :], np.iinfo(np.int64).max)
  out = np.argmin(width, axis=1)
  out[~fits.any(1)] = -1
  return out.astype(np.int32)


def batch_sizes(shapes, batch_size: int, tokens_per_batch: int = 0) -> list[int]:
  """Per-bucket batch size: fixed, or tokens_per_batch // (Ts + Tt) (at least 1)."""
  if tokens_per_batch <= 0:
    return [batch_size] * len(shapes)
  return [max(1, tokens_per_batch // (s + t)) for s, t in shapes]


def train_plan(bucket: np.ndarray, sizes: list[int], rng: np.random.Generator) -> list[tuple[int, np.ndarray]]:
  """One epoch of training batches: [(bucket k, rows [sizes[k]] int64)], in random order.

  Each bucket's examples are shuffled and cut into batches; its last, partial batch is filled with
  examples from the start of the same shuffled order, so every example appears at least once and
  every batch is full.
  """
  batches = []
  for k, size in enumerate(sizes):
    rows = np.flatnonzero(bucket == k)
    if rows.size == 0:
      continue
    rows = rng.permutation(rows)
    n_batches = -(-rows.size // size)
    padded = np.resize(rows, n_batches * size)  # np.resize repeats from the start
    batches.extend((k, padded[i * size:(i + 1) * size]) for i in range(n_batches))
  order = rng.permutation(len(batches))
  return [batches[i] for i in order]


def unbucketed_batches(src_len: np.ndarray, tgt_len: np.ndarray, size: int,
                       rng: np.random.Generator) -> list[tuple[int, int, np.ndarray]]:
  """One epoch batched without buckets: [(Ts, Tt, rows)], the examples shuffled and cut into
  batches of `size` (the last one shorter), each padded to its longest source and target. How a
  loader that does not group by length batches (JoeyNMT's shuffled sentence batches, for one);
  set against train_plan it shows what the buckets save."""
  rows = rng.permutation(len(src_len))
  return [(int(src_len[r].max()), int(tgt_len[r].max()), r)
          for r in (rows[i:i + size] for i in range(0, rows.size, size))]


def pack_rows(src_len: np.ndarray, tgt_len: np.ndarray, widths: tuple[int, int],
              rng: np.random.Generator, chunk: int = 4096) -> list[np.ndarray]:
  """One epoch's examples packed into rows of `widths` (Ts, Tt): [rows] int64 arrays of example
  indices, each row's sources summing to at most Ts slots and its targets to at most Tt.

  The examples are shuffled, then packed a chunk at a time, longest (src + tgt) first, each into
  the first row of the chunk with room on both sides (first-fit decreasing; the row widths:
  `pack_widths`). Which
  examples share a row changes every epoch with `rng`; every example is in exactly one row.
  """
  src_len, tgt_len = np.asarray(src_len, np.int64), np.asarray(tgt_len, np.int64)
  ts, tt = widths
  if (src_len > ts).any() or (tgt_len > tt).any():
    raise ValueError(f"pack_rows: an example is wider than the rows {widths}")
  out = []
  order = rng.permutation(src_len.size)
  for lo in range(0, order.size, chunk):
    part = order[lo:lo + chunk]
    part = part[np.argsort(-(src_len[part] + tgt_len[part]), kind="stable")]
    free_s = np.empty(part.size, np.int64)  # at most one row per example
    free_t = np.empty(part.size, np.int64)
    members: list[list[int]] = []
    for i in part:
      s, t = src_len[i], tgt_len[i]
      n = len(members)
      fits = np.flatnonzero((free_s[:n] >= s) & (free_t[:n] >= t))
      j = int(fits[0]) if fits.size else n
      if j == n:
        members.append([])
        free_s[j], free_t[j] = ts, tt
      members[j].append(int(i))
      free_s[j] -= s
      free_t[j] -= t
    out.extend(np.asarray(m, np.int64) for m in members)
  return out


def pack_plan(src_len: np.ndarray, tgt_len: np.ndarray, widths: tuple[int, int], rows: int,
              rng: np.random.Generator, bucket: int = 0,
              n_batches: int | None = None) -> list[tuple[int, np.ndarray]]:
  """One epoch of packed training batches: [(bucket, members [rows, P] int64)], row r of a
  batch holding the examples members[r, :] (-1 past its last one); `bucket` is the index of the
  shape `widths` among the bundle's shapes.

  `pack_rows`, the rows shuffled and cut into batches of `rows`; the last, partial batch is
  filled with rows from the start of the same order, as train_plan fills a bucket's.
  n_batches: the epoch's length, fixed (the training plan maps a step to an epoch and a batch
  with it); each epoch's packing needs a slightly different number of rows, so a few rows are
  then repeated from the start, or left to the next epoch's draw. None: as many as needed.
  """
  packed = pack_rows(src_len, tgt_len, widths, rng)
  packed = [packed[i] for i in rng.permutation(len(packed))]
  if n_batches is None:
    n_batches = -(-len(packed) // rows)
  packed = [packed[i % len(packed)] for i in range(n_batches * rows)]
  batches = []
  for b in range(n_batches):
    group = packed[b * rows:(b + 1) * rows]
    members = np.full((rows, max(m.size for m in group)), -1, np.int64)
    for r, m in enumerate(group):
      members[r, :m.size] = m
    batches.append((bucket, members))
  return batches


def pack_widths(src_len: np.ndarray, tgt_len: np.ndarray, widest: tuple[int, int],
                multiple: int = 1) -> tuple[int, int]:
  """The (Ts, Tt) of packed rows: the widest bucket's, with the side that would fill first
  widened (to the nearest multiple of `multiple`) until the two sides' room is in proportion
  to the mean source and target lengths, so neither side's slots are left empty by rows the
  other side has filled (e.g. (48, 44) -> (48, 48) for mean lengths 13.6 and 14.1)."""
  ts, tt = widest
  ratio = float(np.mean(tgt_len)) / float(np.mean(src_len))  # target slots per source slot
  near = lambda x: max(multiple, int(round(x / multiple)) * multiple)
  if tt < ts * ratio:
    tt = max(tt, near(ts * ratio))
  else:
    ts = max(ts, near(tt / ratio))
  return ts, tt


def packed_rows_per_batch(src_len: np.ndarray, tgt_len: np.ndarray, widths: tuple[int, int],
                          batch_size: int, tokens_per_batch: int = 0) -> int:
  """Rows of `widths` a packed batch holds: tokens_per_batch // (Ts + Tt) if set, else as many
  slots as `batch_size` examples of the mean length fill (so a step sees about batch_size
  examples, the same tokens as a bucketed batch of that size)."""
  ts, tt = widths
  if tokens_per_batch > 0:
    return max(1, tokens_per_batch // (ts + tt))
  mean = float(np.mean(np.asarray(src_len) + np.asarray(tgt_len)))
  return max(1, int(round(batch_size * mean / (ts + tt))))


def eval_plan(bucket: np.ndarray, sizes: list[int], shapes, src_len: np.ndarray,
              tgt_len: np.ndarray) -> list[tuple[int, np.ndarray]]:
  """Every example exactly once, in full batches but the last; -1 rows fill that one.

  Buckets are visited narrowest first; the examples left over after a bucket's full batches move on
  to the next bucket they fit, so at most one batch (the widest bucket's) is part filler.
  """
  batches = []
  carried = np.zeros(0, np.int64)
  order = sorted(range(len(shapes)), key=lambda k: (shapes[k][0] + shapes[k][1], shapes[k]))
  for n, k in enumerate(order):
    ts, tt = shapes[k]
    fit = (src_len[carried] <= ts) & (tgt_len[carried] <= tt)
    rows = np.concatenate([carried[fit], np.flatnonzero(bucket == k)])
    carried = carried[~fit]
    size = sizes[k]
    full = rows.size // size * size
    batches.extend((k, rows[i:i + size]) for i in range(0, full, size))
    rest = rows[full:]
    if n == len(order) - 1 and rest.size:
      batches.append((k, np.concatenate([rest, -np.ones(size - rest.size, np.int64)])))
    else:
      carried = np.concatenate([carried, rest])
  assert carried.size == 0, "the widest bucket must fit every example"
  return batches


def padding_fraction(plan, shapes, src_len: np.ndarray, tgt_len: np.ndarray) -> float:
  """Fraction of source + target slots of the plan's batches that are padding (filler rows too)."""
  return batches_padding_fraction([(*shapes[k], rows) for k, rows in plan], src_len, tgt_len)


def batches_padding_fraction(batches, src_len: np.ndarray, tgt_len: np.ndarray) -> float:
  """padding_fraction of batches [(Ts, Tt, rows)]: rows [B] examples, or [B, P] the examples
  of packed rows (-1: none)."""
  slots = real = 0
  for ts, tt, rows in batches:
    slots += len(rows) * (ts + tt)
    r = rows[rows >= 0]
    real += int(src_len[r].sum() + tgt_len[r].sum())
  return 1.0 - real / slots if slots else 0.0
