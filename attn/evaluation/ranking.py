"""Ranking metrics of next-item recommendation over the full item set.

    r = ranks(scores, targets)       # [U] 1-based rank of each user's held-out item
    hit_rate(r, 10), ndcg(r, 10)     # Hit-rate@10, NDCG@10 (one relevant item per user)

With one relevant item, NDCG@k of an item at rank r is 1 / log2(r + 1) when r <= k, else 0
(the ideal DCG is 1), as SASRec (Kang & McAuley 2018, section IV-B) computes it.
"""

from __future__ import annotations

import numpy as np


def ranks(scores, targets) -> np.ndarray:
  """scores: [U, V] of every item for each user; targets: [U] item ids. Returns [U] int: 1 + the
  number of items scored strictly higher than the target (ties are resolved in the target's
  favour; -inf scores, e.g. padding, never rank above a finite target)."""
  scores = np.asarray(scores)
  target_scores = np.take_along_axis(scores, np.asarray(targets)[:, None], axis=1)  # [U, 1]
  return 1 + np.sum(scores > target_scores, axis=1)


def hit_rate(r, k: int = 10) -> float:
  """The share of users whose held-out item ranks in the top k."""
  r = np.asarray(r)
  return float(np.mean(r <= k)) if r.size else float("nan")


def ndcg(r, k: int = 10) -> float:
  """Mean over users of 1 / log2(rank + 1) for ranks <= k (0 below)."""
  r = np.asarray(r, np.float64)
  if not r.size:
    return float("nan")
  return float(np.mean(np.where(r <= k, 1.0 / np.log2(r + 1.0), 0.0)))
