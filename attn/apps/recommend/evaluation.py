"""Evaluation of a next-item recommender and the files of its run: full-item-set ranking
(Hit-rate@10, NDCG@10; attn.evaluation.ranking), both also by history length, the final
position's attention on the planted trigger (the gold key), attention.npz
(attn.inspection.viewer's format) and results.json. (config.json and model.json are the
training loop's: attn.training.resume.Records.)
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attn.common import files
from attn.evaluation import ranking
from attn.training import distributed

K = 10  # the cut-off of HR@K and NDCG@K
EVAL_BATCH = 256  # users per evaluation call (the last batch is padded to it: one compilation)
NUM_BUCKETS = 4  # history-length buckets of the by-length figures


@functools.partial(jax.jit, static_argnums=0)
def _final_position(graphdef, state, inputs, lengths, gold):
  """Scores of every item at each user's final position [B, V]; the final position's weight on
  key `gold` per layer, averaged over heads [B, L], and whether `gold` is that head-average's
  largest weight [B, L] (zeros without attention)."""
  model, _ = nnx.merge(graphdef, state)
  h, w = model(inputs, lengths)  # [B, T, d], [B, L, H, T, T] or None
  rows = jnp.arange(inputs.shape[0])
  last = jnp.maximum(lengths - 1, 0)
  scores = model.logits(h[rows, last])  # [B, V]
  if w is None:
    zeros = jnp.zeros((inputs.shape[0], 1), jnp.float32)
    return scores, zeros, zeros
  final = w.mean(axis=2)[rows, :, last]  # [B, L, T]
  on_gold = jnp.take_along_axis(final, jnp.maximum(gold, 0)[:, None, None], axis=2)[..., 0]
  return scores, on_gold, (jnp.argmax(final, axis=-1) == gold[:, None]).astype(jnp.float32)


def final_positions(graphdef, state, split):
  """(scores [U, V] at each user's final position, attention on gold [U, L], gold is the
  argmax [U, L]; the last two NaN where the split's gold is unknown) over the whole split, in
  batches of EVAL_BATCH."""
  U = len(split.lengths)
  parts = []
  for lo in range(0, U, EVAL_BATCH):
    rows = np.resize(np.arange(lo, min(lo + EVAL_BATCH, U)), EVAL_BATCH)
    out = _final_position(graphdef, state, split.inputs[rows], split.lengths[rows],
                          split.gold[rows])
    parts.append([np.asarray(x)[:min(EVAL_BATCH, U - lo)] for x in out])
  scores, on_gold, argmax = (np.concatenate(p) for p in zip(*parts))
  on_gold, argmax = on_gold.astype(np.float64), argmax.astype(np.float64)
  on_gold[split.gold < 0] = argmax[split.gold < 0] = np.nan
  return scores, on_gold, argmax


def rank_split(graphdef, state, split) -> dict:
  """hr10 and ndcg10 of the split's held-out items, and per user: ranks [U], top1 [U],
  on_gold [U, L], gold_is_argmax [U, L]."""
  scores, on_gold, argmax = final_positions(graphdef, state, split)
  r = ranking.ranks(scores, split.last)
  return {"hr10": ranking.hit_rate(r, K), "ndcg10": ranking.ndcg(r, K), "ranks": r,
          "top1": np.argmax(scores, axis=1), "on_gold": on_gold, "gold_is_argmax": argmax}


def length_buckets(lengths, lo: int, hi: int, n: int = NUM_BUCKETS):
  """(labels, bucket of each length): `n` equal-width bins of history lengths lo..hi."""
  edges = np.linspace(lo, hi + 1, n + 1).round().astype(int)
  labels = [f"{a}-{b - 1}" for a, b in zip(edges[:-1], edges[1:])]
  return labels, np.clip(np.searchsorted(edges, lengths, side="right") - 1, 0, n - 1)


def by_length(values, lengths, lo: int, hi: int) -> dict:
  """{bucket label: mean of `values` over its users (NaN-ignoring; None if empty)}."""
  labels, b = length_buckets(lengths, lo, hi)
  values = np.asarray(values, np.float64)
  out = {}
  for i, label in enumerate(labels):
    v = values[(b == i) & np.isfinite(values)]
    out[label] = float(v.mean()) if v.size else None
  return out


def _attention_npz(run, split, ev, samples: int) -> dict:
  """The run viewer's arrays (attn.inspection.viewer) for the first `samples` test users: rows
  are positions (labelled by the item that follows each), columns the history's items (labelled
  by id); weights [L, H, n, n] over the user's n input items. Raw scores are stored as
  log(weights), -inf where masked: softmax is shift-invariant per row, so softmax(log w / T) is
  exactly what the scores behind w give at temperature T (only stored for softmax)."""
  n_users = min(samples, len(split.lengths))
  arrays = {"example_ids": np.arange(n_users), "normalizer": np.array(run.mc.normalizer),
            "temperature": np.float32(1.0), "decoder": np.array(run.mc.kind),
            "score": np.array(run.mc.score if run.mc.has_attention else "none")}
  sources, preds, refs = [], [], []
  if n_users:
    model = nnx.merge(run.graphdef, run.state)[0]  # the restored parameters
    _, w = model(jnp.asarray(split.inputs[:n_users]), jnp.asarray(split.lengths[:n_users]))
    w = None if w is None else np.asarray(w, np.float32)  # [N, L, H, T, T]
  for u in range(n_users):
    n = int(split.lengths[u])
    items = split.inputs[u, :n]
    nxt = np.append(items[1:], split.last[u])
    sources.append(" ".join(map(str, items)))
    preds.append(str(int(ev["top1"][u])))
    refs.append(str(int(split.last[u])))
    weights = (np.zeros((1, 1, n, n), np.float32) if w is None else w[u, :, :, :n, :n])
    arrays[f"weights_{u}"] = weights
    if w is not None and run.mc.normalizer == "softmax":
      with np.errstate(divide="ignore"):
        arrays[f"scores_{u}"] = np.log(weights)
    arrays[f"src_tokens_{u}"] = np.array([str(i) for i in items])
    arrays[f"tgt_tokens_{u}"] = np.array([f"->{i}" for i in nxt])
  arrays.update(sources=np.array(sources, dtype=str), predictions=np.array(preds, dtype=str),
                references=np.array(refs, dtype=str))
  return arrays


def write_results(run, splits, trained: dict) -> dict:
  """Ranks the test split with the restored (best) state, writes attention.npz, then
  results.json (last: its presence means the run finished; process 0 alone writes); returns
  the results. run: an attn.training.loop.Run of the recommend task (its bundle's `config`: the
  InteractionConfig); trained: params, step and wall_s of the whole run."""
  test = splits["test"]
  dc = run.bundle.config
  ev = rank_split(run.graphdef, run.state, test)
  lo, hi = dc.min_len - 1, dc.max_input_len
  results = {"model": run.mc.kind, "decoder": run.mc.kind, "split": "test",
             "hr10": ev["hr10"], "ndcg10": ev["ndcg10"],
             "random_hr10": K / dc.num_items, "users": int(len(test.lengths)),
             "hr10_by_length": by_length(ev["ranks"] <= K, test.lengths, lo, hi),
             "ndcg10_by_length": by_length(
                 np.where(ev["ranks"] <= K, 1 / np.log2(ev["ranks"] + 1.0), 0.0),
                 test.lengths, lo, hi),
             **trained, "best_step": run.progress.best_step, "best_eval": run.progress.best_eval,
             "model_config": run.mc.record()["recommender"]}
  if run.mc.has_attention:
    last_layer = ev["on_gold"][:, -1]
    results.update(
        attention_on_gold=float(np.nanmean(last_layer)),
        attention_on_gold_by_layer=[float(v) for v in np.nanmean(ev["on_gold"], axis=0)],
        attention_on_gold_by_length=by_length(last_layer, test.lengths, lo, hi),
        attention_on_gold_by_layer_and_length=[
            by_length(ev["on_gold"][:, l], test.lengths, lo, hi)
            for l in range(ev["on_gold"].shape[1])],
        gold_is_argmax_by_layer=[float(v) for v in np.nanmean(ev["gold_is_argmax"], axis=0)])
  arrays = _attention_npz(run, test, ev, run.tc.attention_samples)
  if distributed.is_primary():
    with files.atomic_path(os.path.join(run.workdir, "attention.npz"), suffix=".npz") as tmp:
      np.savez(tmp, **arrays)
    files.write_json(os.path.join(run.workdir, "results.json"), results)
  return results
