"""What a trained retriever + reader (attn.apps.retrieve.model) scores on a set of pools:
recall@k, answer accuracy and hop hits (the sentence each hop weighs most is its gold fact)."""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from attn.apps.retrieve import data as pools
from attn.apps.retrieve import model as retriever


def run_model(model, data: pools.PoolSet, seed: int = 0,
              batch: int = 250) -> retriever.RetrieveOut:
  """The model over every question of `data`, in batches; numpy RetrieveOut."""
  graphdef, state = nnx.split(model)
  outs = []
  for start in range(0, len(data.answer), batch):
    rows = np.arange(start, min(start + batch, len(data.answer)))
    p, m, q, _, _ = pools.batch_arrays(data, rows)
    key = jax.random.fold_in(jax.random.PRNGKey(seed), start)
    outs.append(retriever.apply(graphdef, state, p, m, q, key))
  return retriever.RetrieveOut(*(np.concatenate([np.asarray(o[i]) for o in outs])
                                 for i in range(len(outs[0]))))


def hop_hits(out: retriever.RetrieveOut, data: pools.PoolSet, max_sentences: int,
             flat: bool) -> list[float]:
  """Per hop: fraction of questions whose most-weighted sentence (over every sentence read,
  weighted by p(z|q)) is the hop's gold fact (hop 1: the pick-up; hop 2 on: the last move)."""
  B, Z, H, T = out.sentence_weights.shape
  if flat:  # whole_pool: one passage of P stories, in pool order
    pz, passage = np.ones((B, 1)), None
  else:
    pz, passage = np.take_along_axis(out.passage_weights, out.retrieved, axis=1), out.retrieved
  hits = []
  for h in range(H):
    flat = (pz[:, :, None] * out.sentence_weights[:, :, h]).reshape(B, Z * T).argmax(-1)
    z, s = flat // T, flat % T
    story = s // max_sentences if passage is None else passage[np.arange(B), z]
    fact = data.supports[:, min(h, 1)]
    hits.append(float(np.mean((story == data.gold) & (s % max_sentences == fact))))
  return hits


def measure(model, data: pools.PoolSet, seed: int, max_sentences: int) -> dict:
  """recall@k (1.0 for whole_pool, which reads everything), answer accuracy and hop hits on
  `data` (seed: the `random` mode's draws, as run_model; max_sentences: S of the stories)."""
  out = run_model(model, data, seed)
  flat = retriever.RETRIEVAL.get(model.cfg.mode).flat
  return {"passages": int(data.pool.shape[1]),
          "recall_at_k": 1.0 if flat else float(np.mean((out.retrieved == data.gold[:, None]
                                                         ).any(-1))),
          "answer_accuracy": float(np.mean(out.log_probs.argmax(-1) == data.answer)),
          "hop_hits": hop_hits(out, data, max_sentences, flat)}

