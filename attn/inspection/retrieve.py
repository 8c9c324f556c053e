"""Retrieval, then read: train attn.models.retriever on two-hop questions in pools of distractor
stories (attn.inspection.pools), one model per retrieval mode and number of distractors; measure
retrieval recall@k, answer accuracy and where each hop looks; save the table, the plot and the
models the page serves.

    results = retrieve.train_and_evaluate(RetrieveConfig(), "workdirs/retrieve")

Training signal (loss per question): -log p(a|q), the answer marginalized over the retrieved
passages (end to end: the retriever gets gradient through p(z|q) over the retrieved set only),
plus `retrieval_loss` times -log softmax(r_q . r_p)[gold] over the whole pool (supervision from
the gold passage). The supervision is on by default because the end-to-end signal is blind to a
gold passage outside the top k: early in training the reader is no better than chance on any
passage, so nothing pulls the gold one in. `--retrieval_loss=0` trains end to end only.

Metrics on the held-out pools, per mode and number of distractors:
- recall@k: the gold story is among the k passages read (whole_pool reads every passage: 1);
- answer accuracy (chance: 1 / places);
- hop hits: the sentence hop h weighs most (over every sentence read, weighted by p(z|q)) is its
  gold fact: hop 1 the pick-up of the object, hop 2 the holder's last move.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from attn.common import files
from attn.common.tables import markdown_table
from attn.config.configurable import option
from attn.errors import ConfigError
from attn.inspection import pools, stories
from attn.models import reader, retriever

MODEL_FILE = "model.json"  # story config, vocabulary, the served model's config, sample pools
RESULTS_FILE = "retrieve.json"
TABLE_FILE = "retrieve.md"
PLOT_FILE = "retrieve.png"
PAGE_FILE = "retrieve.html"
SERVED_PARAMS = "retriever.npz"  # the `retrieve` model trained with the most distractors


@dataclasses.dataclass(frozen=True)
class RetrieveConfig:
  """The experiment's settings (`python -m experiments.retrieve` takes one flag per field, the
  stories' fields included); the defaults run the whole sweep in a few minutes on 2 CPU cores."""
  stories: stories.StoryConfig = option(pools.POOL_STORIES, "What the stories are drawn from.")
  distractors: tuple[int, ...] = option((0, 4, 16, 64), "Distractor stories per pool (the sweep).")
  modes: tuple[str, ...] = option(("retrieve", "random", "whole_pool"),
                                  "Retrieval modes to train (attn.models.retriever.RETRIEVAL).")
  top_k: int = option(2, "Passages (stories) read per question.")
  hops: int = option(2, "Reader hops (the questions need two supporting facts).")
  dim: int = option(32, "Embedding size d.")
  retrieval_loss: float = option(1.0, "Weight of the gold-passage loss (0: end to end only).")
  steps: int = option(1500, "Adam steps per model.")
  batch_size: int = option(32, "Questions per Adam step.")
  learning_rate: float = option(0.01, "Adam learning rate.")
  train_size: int = option(4000, "Training questions (each with its own pool).")
  test_size: int = option(500, "Test questions.")
  num_samples: int = option(8, "Test pools offered on the page.")
  page_distractors: int = option(4, "Distractors in the page's sample pools.")
  seed: int = option(0, "Random seed (stories, pools and initialization).")

  def __post_init__(self):
    if not self.distractors or min(self.distractors) < 0:
      raise ConfigError(f"distractors: name counts >= 0, got {list(self.distractors)}")
    if not self.modes or len(set(self.modes)) != len(self.modes):
      raise ConfigError(f"modes: name each mode once, got {list(self.modes)}")
    for m in self.modes:
      retriever.RETRIEVAL.get(m)
    for name in ("top_k", "hops", "dim", "steps", "batch_size", "train_size", "test_size"):
      if getattr(self, name) < 1:
        raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
    if self.retrieval_loss < 0 or not self.learning_rate > 0:
      raise ConfigError(f"retrieval_loss must be >= 0 and learning_rate > 0, got "
                        f"{self.retrieval_loss}, {self.learning_rate}")
    if self.num_samples < 0 or self.page_distractors < 0:
      raise ConfigError("num_samples and page_distractors must be >= 0")
    if self.stories.object_questions <= 0 or len(self.stories.objects) < 2:
      raise ConfigError("the pools need object questions (object_questions > 0) and at least "
                        "two objects")

  def model_config(self, mode: str, vocab_size: int) -> retriever.RetrieverConfig:
    return retriever.RetrieverConfig(
        vocab_size=vocab_size, num_answers=len(self.stories.places),
        max_sentences=self.stories.max_sentences, dim=self.dim, hops=self.hops,
        top_k=self.top_k, mode=mode)


# ----------------------------------------------------------------------------- training

def batch_arrays(data: pools.PoolSet, idx):
  """Questions idx [B] -> (passages [B, P, S, W], passage_mask [B, P, S], question, answer,
  gold): the pools gathered from the bank (numpy or jax arrays)."""
  rows = data.pool[idx]  # [B, P]
  return (data.stories[rows], data.story_mask[rows], data.question[idx], data.answer[idx],
          data.gold[idx])


def _loss(model, batch, key, retrieval_loss):
  passages, mask, question, answer, gold = batch
  out = model(passages, mask, question, key=key)
  nll = -jnp.take_along_axis(out.log_probs, answer[:, None], axis=-1)[:, 0]  # [B]
  if retriever.RETRIEVAL.get(model.cfg.mode).flat:  # no passage scores to supervise
    return jnp.mean(nll)
  gold_lp = jnp.take_along_axis(jax.nn.log_softmax(out.passage_scores), gold[:, None], axis=-1)
  return jnp.mean(nll) - retrieval_loss * jnp.mean(gold_lp)


@functools.partial(jax.jit, static_argnums=(0, 5, 6), donate_argnums=1)
def _train_chunk(graphdef, state, data, key, n, chunk, batch_size, retrieval_loss):
  """n <= chunk Adam steps in one compiled loop (as attn.inspection.focus); `data` is an
  argument, not a closure, so it is not folded into the program as constants."""

  def step(i, carry):
    state, losses = carry
    model, optimizer = nnx.merge(graphdef, state)
    k1, k2 = jax.random.split(jax.random.fold_in(key, i))
    idx = jax.random.randint(k1, (batch_size,), 0, data.answer.shape[0])
    loss, grads = nnx.value_and_grad(_loss)(model, batch_arrays(data, idx), k2, retrieval_loss)
    optimizer.update(model, grads)
    return nnx.state((model, optimizer)), losses.at[i].set(loss)

  return jax.lax.fori_loop(0, n, step, (state, jnp.zeros((chunk,), jnp.float32)))


def train(cfg: RetrieveConfig, mode: str, data: pools.PoolSet, vocab_size: int, chunk: int = 250):
  """Trains one model. Returns (model, losses [steps] as numpy)."""
  model = retriever.build(cfg.model_config(mode, vocab_size), seed=cfg.seed)
  optimizer = nnx.Optimizer(model, optax.adam(cfg.learning_rate), wrt=nnx.Param)
  graphdef, state = nnx.split((model, optimizer))
  data = jax.tree.map(jnp.asarray, data)
  key = jax.random.fold_in(jax.random.PRNGKey(cfg.seed), 1)
  chunk, losses, done = min(chunk, cfg.steps), [], 0
  while done < cfg.steps:
    n = min(chunk, cfg.steps - done)
    state, loss = _train_chunk(graphdef, state, data, jax.random.fold_in(key, done), n, chunk,
                               cfg.batch_size, cfg.retrieval_loss)
    losses.append(np.asarray(loss)[:n])
    done += n
  model, _ = nnx.merge(graphdef, state)
  return model, np.concatenate(losses)


# ----------------------------------------------------------------------------- evaluation

def run_model(model, data: pools.PoolSet, seed: int = 0, batch: int = 250) -> retriever.RetrieveOut:
  """The model over every question of `data`, in batches; numpy RetrieveOut."""
  graphdef, state = nnx.split(model)
  outs = []
  for start in range(0, len(data.answer), batch):
    p, m, q, _, _ = batch_arrays(data, np.arange(start, min(start + batch, len(data.answer))))
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


def evaluate(model, data: pools.PoolSet, cfg: RetrieveConfig) -> dict:
  out = run_model(model, data, cfg.seed)
  flat = retriever.RETRIEVAL.get(model.cfg.mode).flat
  return {"passages": int(data.pool.shape[1]),
          "recall_at_k": 1.0 if flat else float(np.mean((out.retrieved == data.gold[:, None]
                                                         ).any(-1))),
          "answer_accuracy": float(np.mean(out.log_probs.argmax(-1) == data.answer)),
          "hop_hits": hop_hits(out, data, cfg.stories.max_sentences, flat)}
