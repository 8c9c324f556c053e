"""A one-hop attention reader over a story's sentences (end-to-end memory network, Sukhbaatar et
al. 2015, "MemN2N", with one hop), its attention computed by `attn.attend` with a registered
score and normalizer.

Axis names: B batch, S sentences, W words per sentence, Wq question words, d embedding size,
A answers, V vocabulary.

    m_i = sum_j l_j * A x_ij + T_A(age_i)      keys,   [B, S, d]   (MemN2N eq. 1 with PE and TE)
    c_i = sum_j l_j * C x_ij + T_C(age_i)      values, [B, S, d]
    u   = sum_j l_j * B q_j                    query,  [B, d]
    p   = normalize(score(u, m) / T)           weights over valid sentences, [B, S]   (eq. 1)
    o   = sum_i p_i c_i                        [B, d]                                  (eq. 2)
    a   = log_softmax(W (o + u))               [B, A]                                  (eq. 3)

l_j is MemN2N's position encoding (Sec. 4.1), so "Mary went to the kitchen" and "the kitchen went
to Mary" differ. age_i counts sentences from the *end* of the story (the last sentence has age 0),
so a learned temporal embedding can prefer the most recent move of an actor whatever the story's
length. PAD and UNK words contribute nothing (UNK never occurs in training, so its embedding would
be untrained noise). T is the inference temperature, the demo's focus slider.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import attn
from attn.errors import ConfigError
from attn.models.params import as_params, values
from attn.data.tokens import PAD, UNK


@dataclasses.dataclass(frozen=True)
class ReaderConfig:
  """vocab_size: V; num_answers: A; max_sentences: the longest story (temporal embedding rows,
  and the `location` score's max_len); dim: d; score / normalizer: registry names; d_attn: the
  additive score's hidden size; init_scale: std of the normal initializer (MemN2N uses 0.1)."""
  vocab_size: int
  num_answers: int
  max_sentences: int
  dim: int = 32
  # (declared registry names: a `model` section built by configurable.from_config is checked
  # before this class is; __post_init__ checks a reader built directly)
  score: str = dataclasses.field(default="dot", metadata={"names": attn.VARIANTS["score"]})
  normalizer: str = dataclasses.field(default="softmax",
                                      metadata={"names": attn.VARIANTS["normalizer"]})
  d_attn: int = 32
  init_scale: float = 0.1

  def __post_init__(self):
    for kind in ("score", "normalizer"):
      name = getattr(self, kind)
      if name not in attn.names(kind):
        raise ConfigError(f"unknown {kind} {name!r}; known: {', '.join(attn.names(kind))}")
    if min(self.vocab_size, self.num_answers, self.max_sentences, self.dim, self.d_attn) < 1:
      raise ConfigError(f"reader sizes must be positive, got {self}")

  def to_dict(self):
    return dataclasses.asdict(self)

  def record(self) -> dict:
    """The settings a training run's model.json records (attn.training.workdir.check_model)."""
    return self.to_dict()


class ReadOut(NamedTuple):
  """log_probs: [B, A] answer log-probabilities; weights: [B, S] attention (0 on padding);
  scores: [B, S] raw scores e before the temperature (meaningless on padding)."""
  log_probs: jax.Array
  weights: jax.Array
  scores: jax.Array


def position_encoding(lengths, W: int, d: int):
  """MemN2N Sec. 4.1: l_kj = (1 - j/J) - (k/d)(1 - 2j/J), j = 1..J words, k = 1..d.

  lengths: [...] int, J per sentence. Returns [..., W, d] float32, zero for j > J.
  """
  j = jnp.arange(1, W + 1, dtype=jnp.float32)[:, None]  # [W, 1]
  k = jnp.arange(1, d + 1, dtype=jnp.float32)[None, :]  # [1, d]
  J = jnp.maximum(lengths, 1).astype(jnp.float32)[..., None, None]  # [..., 1, 1]
  l = (1.0 - j / J) - (k / d) * (1.0 - 2.0 * j / J)  # [..., W, d]
  return jnp.where(j <= lengths[..., None, None], l, 0.0)


def bag_of_words(embed: nnx.Embed, ids):
  """Position-encoded bag of words: ids [..., W] (PAD after the words) -> [..., d]."""
  lengths = jnp.sum(ids != PAD, axis=-1)  # [...]
  known = ((ids != PAD) & (ids != UNK))[..., None]  # [..., W, 1]
  l = position_encoding(lengths, ids.shape[-1], embed.features)  # [..., W, d]
  return jnp.sum(jnp.where(known, l * embed(ids), 0.0), axis=-2)  # [..., d]


def ages(story_mask, max_sentences: int):
  """Sentence age counted from the story's end: [B, S] int, the last valid sentence 0; padding
  and sentences beyond max_sentences - 1 from the end get the largest row."""
  n = jnp.sum(story_mask, axis=-1, keepdims=True)  # [B, 1]
  i = jnp.arange(story_mask.shape[-1])[None, :]  # [1, S]
  return jnp.clip(n - 1 - i, 0, max_sentences - 1)


class Reader(nnx.Module):
  """One-hop MemN2N reader (see the module docstring)."""

  def __init__(self, cfg: ReaderConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    init = nnx.initializers.normal(cfg.init_scale)
    V, d, S = cfg.vocab_size, cfg.dim, cfg.max_sentences
    self.embed_keys = nnx.Embed(V, d, embedding_init=init, rngs=rngs)  # A
    self.embed_values = nnx.Embed(V, d, embedding_init=init, rngs=rngs)  # C
    self.embed_question = nnx.Embed(V, d, embedding_init=init, rngs=rngs)  # B
    self.temporal_keys = nnx.Param(init(rngs.params(), (S, d)))  # T_A
    self.temporal_values = nnx.Param(init(rngs.params(), (S, d)))  # T_C
    self.answer = nnx.Linear(d, cfg.num_answers, use_bias=False, kernel_init=init, rngs=rngs)  # W
    self.score_params = as_params(attn.init_score(cfg.score, rngs.params(), d, d,
                                                   d_attn=cfg.d_attn, max_len=S))

  def __call__(self, story, story_mask, question, *, temperature=1.0) -> ReadOut:
    """story: [B, S, W] ids; story_mask: [B, S] bool; question: [B, Wq] ids; temperature: a
    scalar (may be traced). S <= max_sentences for the `location` score."""
    cfg = self.cfg
    age = ages(story_mask, cfg.max_sentences)  # [B, S]
    m = bag_of_words(self.embed_keys, story) + self.temporal_keys[...][age]  # [B, S, d]
    c = bag_of_words(self.embed_values, story) + self.temporal_values[...][age]  # [B, S, d]
    u = bag_of_words(self.embed_question, question)  # [B, d]
    q = u[:, None, :]  # [B, 1, d]
    params = values(self.score_params)
    o, w = attn.attend(params, q, m, c, score=cfg.score, normalizer=cfg.normalizer,
                       mask=story_mask[:, None, :], temperature=temperature)  # [B, 1, d], [B, 1, S]
    e = attn.score(cfg.score, params, q, m)  # [B, 1, S], the same score attend normalized
    logits = self.answer(o[:, 0] + u)  # [B, A]
    return ReadOut(jax.nn.log_softmax(logits.astype(jnp.float32)), w[:, 0], e[:, 0])


def build(cfg: ReaderConfig, seed: int = 0) -> Reader:
  return Reader(cfg, rngs=nnx.Rngs(seed))


@functools.partial(jax.jit, static_argnums=0)
def read(graphdef, state, story, story_mask, question, temperature=1.0) -> ReadOut:
  """The pure reader: (nnx.split(model)) + arrays -> ReadOut. temperature is traced (moving the
  focus slider does not recompile)."""
  return nnx.merge(graphdef, state)(story, story_mask, question, temperature=temperature)


def save_params(path: str, model: Reader):
  """The model's parameters as an .npz keyed by their pytree paths."""
  leaves = jax.tree_util.tree_flatten_with_path(nnx.state(model, nnx.Param))[0]
  with open(path, "wb") as f:
    np.savez(f, **{jax.tree_util.keystr(p): np.asarray(x) for p, x in leaves})


def load_params(path: str, cfg: ReaderConfig) -> Reader:
  """A Reader of `cfg` with the parameters save_params wrote (shapes must match)."""
  return restore_params(path, build(cfg))


def restore_params(path: str, model: nnx.Module) -> nnx.Module:
  """`model` (any module, updated in place and returned) with the parameters save_params wrote;
  a ConfigError when a name is missing or a shape differs."""
  cfg = model.cfg
  state = nnx.state(model, nnx.Param)
  leaves, treedef = jax.tree_util.tree_flatten_with_path(state)
  with np.load(path) as saved:
    names = [jax.tree_util.keystr(p) for p, _ in leaves]
    missing = [n for n in names if n not in saved.files]
    if missing or len(saved.files) != len(names):
      raise ConfigError(f"{path} does not hold the parameters of {cfg} (missing {missing})")
    new = []
    for name, (_, x) in zip(names, leaves):
      if saved[name].shape != x.shape:
        raise ConfigError(f"{path}: {name} has shape {saved[name].shape}, the config needs "
                          f"{x.shape}")
      new.append(jnp.asarray(saved[name]))
  nnx.update(model, jax.tree_util.tree_unflatten(treedef, new))
  return model
