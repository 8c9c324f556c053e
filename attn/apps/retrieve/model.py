"""Retrieval, then read: a dot-product retriever picks k passages (stories) of a pool, a
multi-hop MemN2N reader (attn.models.reader's pieces) reads each, and the answer marginalizes over
the retrieved passages (Lewis et al. 2020, "RAG", eq. for RAG-Sequence):

    r_p = sum_i sum_j l_j R x_pij               passage keys,  [B, P, d]
    r_q = sum_j l_j R_q q_j                     question,      [B, d]
    p(z|q) = softmax over top-k(r_q . r_p)      attn.attend, dot score, `topk` scope   [B, P]
    z_1..z_k = the k passages in the scope      [B, k]
    p(a|q, z) = MemN2N over z's sentences, `hops` hops (layer-wise tying: u' = H u + o)  [B, k, A]
    p(a|q) = sum_z p(z|q) p(a|q, z)                                                  [B, A]

The retriever learns end to end through p(z|q) over the retrieved set (the passage whose reading
answers well gains weight) and, with `retrieval_loss`, from the gold passage (see
attn.apps.retrieve.sweep). How passages are chosen is a registered `RETRIEVAL` mode: `retrieve`
(the learned scores), `random` (k passages at random, uniform p(z|q): what retrieval buys over
reading k passages) and `whole_pool` (no retrieval: one reading over every sentence of the pool).

Axis names: B batch, P passages per pool, k retrieved, S sentences per passage, W words, d, A.
A sentence's age counts from the end of its own story (reader.ages), in every mode.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

import attn
from attn.errors import ConfigError
from attn.models.reader import ages, bag_of_words
from attn.registry import Registry


@dataclasses.dataclass(frozen=True)
class Retrieval:
  """How passages are picked. select(e, key) -> (selection scores, p(z|q) logits), both [B, P];
  flat: read the whole pool as one passage (no selection)."""
  select: Callable | None
  flat: bool = False
  doc: str = ""


RETRIEVAL: Registry[Retrieval] = Registry("retrieval mode", error=ConfigError)
RETRIEVAL.add("retrieve", Retrieval(lambda e, key: (e, e), doc="learned dot-product top-k"))
RETRIEVAL.add("random", Retrieval(
    lambda e, key: (jax.random.uniform(key, e.shape), jnp.zeros_like(e)),
    doc="k passages at random, read with equal weight"))
RETRIEVAL.add("whole_pool", Retrieval(None, flat=True, doc="no retrieval: read every sentence"))


@dataclasses.dataclass(frozen=True)
class RetrieverConfig:
  """vocab_size V; num_answers A; max_sentences S (temporal rows); dim d; hops of the reader;
  top_k passages read; mode: a RETRIEVAL name; init_scale: normal init std (MemN2N: 0.1)."""
  vocab_size: int
  num_answers: int
  max_sentences: int
  dim: int = 32
  hops: int = 2
  top_k: int = 2
  mode: str = "retrieve"
  init_scale: float = 0.1

  def __post_init__(self):
    RETRIEVAL.get(self.mode)
    if min(self.vocab_size, self.num_answers, self.max_sentences, self.dim, self.hops,
           self.top_k) < 1:
      raise ConfigError(f"retriever sizes must be positive, got {self}")

  def to_dict(self):
    return dataclasses.asdict(self)


class RetrieveOut(NamedTuple):
  """log_probs [B, A]: log p(a|q); passage_scores [B, P]: r_q . r_p (zeros for whole_pool);
  passage_weights [B, P]: p(z|q), 0 outside the retrieved set (whole_pool: 1/P, everything is
  read); retrieved [B, Z] passage indices read (Z = k; whole_pool: Z = 1, index 0);
  sentence_weights [B, Z, hops, S'] each hop's reader
  weights inside passage z (S' = S, or P * S for whole_pool); answer_log_probs [B, Z, A]:
  log p(a|q, z)."""
  log_probs: jax.Array
  passage_scores: jax.Array
  passage_weights: jax.Array
  retrieved: jax.Array
  sentence_weights: jax.Array
  answer_log_probs: jax.Array


class RetrieveReader(nnx.Module):
  """Retriever + multi-hop reader (see the module docstring)."""

  def __init__(self, cfg: RetrieverConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    init = nnx.initializers.normal(cfg.init_scale)
    V, d, S = cfg.vocab_size, cfg.dim, cfg.max_sentences
    embed = lambda: nnx.Embed(V, d, embedding_init=init, rngs=rngs)  # noqa: E731
    self.embed_passages, self.embed_retrieval_query = embed(), embed()  # R, R_q
    self.embed_keys, self.embed_values, self.embed_question = embed(), embed(), embed()  # A, C, B
    self.temporal_keys = nnx.Param(init(rngs.params(), (S, d)))  # T_A
    self.temporal_values = nnx.Param(init(rngs.params(), (S, d)))  # T_C
    self.hop = nnx.Linear(d, d, use_bias=False, kernel_init=init, rngs=rngs)  # H
    self.answer = nnx.Linear(d, cfg.num_answers, use_bias=False, kernel_init=init, rngs=rngs)

  def passage_scores(self, passages, question):
    """passages [B, P, S, W], question [B, Wq] -> r_q . r_p [B, P] (attn's `dot` score)."""
    r_p = jnp.sum(bag_of_words(self.embed_passages, passages), axis=-2)  # [B, P, d]
    r_q = bag_of_words(self.embed_retrieval_query, question)  # [B, d]
    return attn.score("dot", None, r_q[:, None, :], r_p)[:, 0]  # [B, P]

  def read(self, story, story_mask, question, temperature=1.0, intervene=None, at=0):
    """story [B, Z, S', W], story_mask [B, Z, S'] bool, question [B, Wq] -> (log p(a|q, z)
    [B, Z, A], per-hop weights [B, Z, hops, S']). Ages restart at every story boundary of
    S = max_sentences sentences (whole_pool concatenates stories). With `intervene`
    (attn.inspection.interventions), hop `at` (1-based) reads with intervene(w, mask, at)."""
    cfg = self.cfg
    B, Z, T = story_mask.shape
    age = ages(story_mask.reshape(B, Z, T // cfg.max_sentences, cfg.max_sentences),
               cfg.max_sentences).reshape(B, Z, T)
    m = bag_of_words(self.embed_keys, story) + self.temporal_keys[...][age]  # [B, Z, S', d]
    c = bag_of_words(self.embed_values, story) + self.temporal_values[...][age]  # [B, Z, S', d]
    u = jnp.broadcast_to(bag_of_words(self.embed_question, question)[:, None],
                         (B, Z, cfg.dim))  # [B, Z, d]
    weights = []
    for hop in range(1, cfg.hops + 1):
      o, w = attn.attend(None, u[..., None, :], m, c, score="dot", mask=story_mask[..., None, :],
                         temperature=temperature)  # [B, Z, 1, d], [B, Z, 1, S']
      if intervene is not None:  # at hop `at` (traced: one program for every stage)
        w = jnp.where(hop == at, intervene(w, story_mask[..., None, :], hop), w)
        o = jnp.where(hop == at, jnp.einsum("...qk,...kd->...qd", w, c.astype(w.dtype)
                                            ).astype(o.dtype), o)
      u = self.hop(u) + o[..., 0, :]  # MemN2N Sec. 2.2, layer-wise tying
      weights.append(w[..., 0, :])
    logits = self.answer(u).astype(jnp.float32)  # [B, Z, A]
    return jax.nn.log_softmax(logits), jnp.stack(weights, axis=2)

  def __call__(self, passages, passage_mask, question, *, key=None, temperature=1.0,
               intervene=None, at=0):
    """passages [B, P, S, W] ids; passage_mask [B, P, S] bool; question [B, Wq] ids; key: for
    the `random` mode. top_k is capped at P. With `intervene(weights, mask, draw) -> weights`
    (an attn.inspection.interventions entry), stage `at` (an int, may be traced) runs on
    replaced weights: 0 p(z|q)
    over the retrieved passages (mask: the scope), h >= 1 the reader's hop h in every passage
    read (a whole_pool model has no stage 0)."""
    cfg = self.cfg
    mode = RETRIEVAL.get(cfg.mode)
    B, P, S, W = passages.shape
    if mode.flat:
      lp, w = self.read(passages.reshape(B, 1, P * S, W), passage_mask.reshape(B, 1, P * S),
                        question, temperature, intervene, at)
      zeros = jnp.zeros((B, P), jnp.float32)
      return RetrieveOut(lp[:, 0], zeros, zeros + 1.0 / P, jnp.zeros((B, 1), jnp.int32), w, lp)
    e = self.passage_scores(passages, question)  # [B, P]
    select, logits = mode.select(e, key)
    k = min(cfg.top_k, P)
    # attn's top-k scope keeps the k best passages; p(z|q) is the softmax of `logits` inside it.
    in_scope = retrieval_scope(select, k)  # [B, P]
    p_z = attn.normalize(logits[:, None, :], in_scope[:, None, :], "softmax",
                         temperature)[:, 0]  # [B, P]
    if intervene is not None:
      p_z = jnp.where(at == 0, intervene(p_z[:, None], in_scope[:, None], 0)[:, 0], p_z)
    idx = jax.lax.top_k(jnp.where(in_scope, select, -jnp.inf), k)[1]  # [B, k]
    take = functools.partial(jnp.take_along_axis, axis=1)
    lp, w = self.read(take(passages, idx[:, :, None, None]), take(passage_mask, idx[:, :, None]),
                      question, temperature, intervene, at)  # [B, k, A], [B, k, hops, S]
    log_pz = jnp.log(jnp.maximum(take(p_z, idx), 1e-30))  # [B, k]
    log_probs = jax.nn.logsumexp(log_pz[..., None] + lp, axis=1)  # [B, A]
    return RetrieveOut(log_probs, e, p_z, idx, w, lp)


def retrieval_scope(scores, k: int):
  """The passages each question keeps: attn's `topk` scope over scores [B, P] -> bool [B, P]
  (ties at the k-th score all kept)."""
  scope = attn.get("topk", "scope").fn
  mask = jnp.ones(scores.shape, bool)[:, None, :]
  return scope(None, None, scores[:, None, :], mask, top_k=k)[0][:, 0]


def build(cfg: RetrieverConfig, seed: int = 0) -> RetrieveReader:
  return RetrieveReader(cfg, rngs=nnx.Rngs(seed))


@functools.partial(jax.jit, static_argnums=0)
def apply(graphdef, state, passages, passage_mask, question, key, temperature=1.0) -> RetrieveOut:
  """The pure model: (nnx.split(model)) + arrays -> RetrieveOut (temperature traced)."""
  return nnx.merge(graphdef, state)(passages, passage_mask, question, key=key,
                                    temperature=temperature)
