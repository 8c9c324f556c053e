"""Multi-hop questions mixed into pools of distractor stories (retrieval, then read), seeded, numpy.

Every question is bAbI task 2's "Where is the apple?" (attn.data.stories): two supporting
facts in its own story, the last pick-up of the apple and the last move of its holder:

    John took the apple.              <- fact 1 (names the holder)
    Mary went to the kitchen.
    John journeyed to the garden.     <- fact 2 (the answer: garden)

Its story (the gold passage) is shuffled into a pool of `distractors` other stories drawn from a
bank. Distractors share the actors and places of the gold story but never mention the question's
object: the object word is what identifies the gold passage (a lexical match a retriever can
learn), while the second hop cannot be done on the pool as a whole, because "John journeyed to
..." occurs in most distractors too; only reading inside the right story gives John's last move.

A passage is one story. Stories are stored once in a bank and pools are indices into it, so a pool
of 64 distractors costs 65 integers, not 65 padded stories:

    PoolSet.stories   [M, S, W] int32 word ids (every story of the bank, gold stories first)
    PoolSet.story_mask[M, S]    bool, True = a sentence
    PoolSet.pool      [N, P]    int32 bank rows of each question's pool, P = distractors + 1
    PoolSet.gold      [N]       int32 position of the gold story within its pool
    PoolSet.question  [N, Wq]   int32;  answer [N] int32 index into places
    PoolSet.supports  [N, 2]    int32 sentence indices of the two facts in the gold story
                                (the pick-up, the holder's last move)
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from attn.config.configurable import option
from attn.errors import ConfigError
from attn.data import stories

@dataclasses.dataclass(frozen=True)
class PoolStoryConfig(stories.StoryConfig):
  """Stories for pools: more objects than the focus demo (a distractor must be able to avoid the
  question's object and still hold objects of its own), more pick-ups, every question two-hop."""
  objects: tuple[str, ...] = option(("apple", "football", "milk", "book", "key", "box"),
                                    "What they take and drop.")
  max_sentences: int = option(10, "Longest story (sentences).")
  object_questions: float = option(1.0, "Fraction of object questions (pools keep only those).")
  p_take: float = option(0.3, "Chance that a sentence is a pick-up (when one is possible).")


POOL_STORIES = PoolStoryConfig()


class PoolSet(NamedTuple):
  """Questions, each with a pool of passages (see the module docstring for shapes)."""
  stories: np.ndarray
  story_mask: np.ndarray
  pool: np.ndarray
  gold: np.ndarray
  question: np.ndarray
  answer: np.ndarray
  supports: np.ndarray


@dataclasses.dataclass(frozen=True)
class Pools:
  """A PoolSet and the text it was made from: examples[i] is question i with its gold story;
  bank_sentences[m] the sentences of bank row m (gold stories first)."""
  arrays: PoolSet
  examples: list
  bank_sentences: list

  def passages(self, i: int) -> list[list[str]]:
    """The sentences of each passage of question i's pool, in pool order."""
    return [self.bank_sentences[m] for m in self.arrays.pool[i]]


def two_hop_questions(num: int, seed: int, config: stories.StoryConfig) -> list[stories.Example]:
  """`num` object questions (two supporting facts); stories.generate asks about an actor when no
  object is askable, and those are skipped."""
  if config.object_questions <= 0:
    raise ConfigError("pools need object questions (object_questions > 0)")
  out, rng = [], np.random.default_rng(seed)
  while len(out) < num:
    batch = stories.generate(num, int(rng.integers(2**31)), config)
    out += [ex for ex in batch if ex.kind == "object"]
  return out[:num]


def _mentions(sentences, obj: str) -> bool:
  return any(obj in stories.tokenize(s) for s in sentences)


def _eligible(bank, objects) -> dict:
  """object -> bank rows of the stories that never mention it."""
  return {o: np.array([j for j, s in enumerate(bank) if not _mentions(s, o)], np.int64)
          for o in objects}


def build(num: int, distractors: int, seed: int, config: stories.StoryConfig = POOL_STORIES,
          vocab: stories.Vocab | None = None, bank_size: int | None = None) -> Pools:
  """`num` questions, each in a pool of its own story and `distractors` bank stories that do not
  mention its object; the gold story's position in the pool is uniform. A deterministic function
  of the arguments. The bank holds bank_size stories (default max(4 * distractors, 64))."""
  if num < 1 or distractors < 0:
    raise ConfigError(f"pools need num >= 1 and distractors >= 0, got {num}, {distractors}")
  if len(config.objects) < 2:
    raise ConfigError("pools need at least two objects (distractors avoid the question's one)")
  vocab = vocab or stories.Vocab.for_config(config)
  rng = np.random.default_rng(seed)
  gold = two_hop_questions(num, int(rng.integers(2**31)), config)
  bank_size = bank_size or max(4 * distractors, 64)
  bank = [ex.sentences for ex in stories.generate(bank_size, int(rng.integers(2**31)), config)]
  eligible = _eligible(bank, config.objects)
  while min(map(len, eligible.values())) < distractors:  # objects in most stories: grow the bank
    if len(bank) > 64 * max(bank_size, distractors):
      raise ConfigError(f"stories without each object are too rare for {distractors} "
                        f"distractors: use more objects or fewer distractors")
    bank += [ex.sentences for ex in stories.generate(len(bank), int(rng.integers(2**31)),
                                                     config)]
    eligible = _eligible(bank, config.objects)
  P = distractors + 1
  pool = np.zeros((num, P), np.int32)
  position = rng.integers(P, size=num).astype(np.int32)
  for i, ex in enumerate(gold):
    obj = stories.tokenize(ex.question)[-1]
    picked = num + rng.choice(eligible[obj], distractors, replace=False)
    pool[i] = np.insert(picked, position[i], i)
  sentences = [ex.sentences for ex in gold] + bank
  x, mask = stories.pad_stories([[vocab.encode(s) for s in st] for st in sentences],
                                num_sentences=config.max_sentences)
  arrays = PoolSet(
      stories=x, story_mask=mask, pool=pool, gold=position,
      question=stories.pad_questions([vocab.encode(ex.question) for ex in gold]),
      answer=np.array([config.places.index(ex.answer) for ex in gold], np.int32),
      supports=np.array([(min(set(ex.supports) - {ex.support}, default=ex.support), ex.support)
                         for ex in gold], np.int32))
  return Pools(arrays, gold, sentences)


def recall_at_k(scores: np.ndarray, gold: np.ndarray, k: int) -> float:
  """Fraction of questions whose gold passage is among the k highest scores.

  scores: [N, P] (one row per question's pool); gold: [N] positions. Ties at the k-th score
  count against the gold passage (it must beat them: rank = 1 + number of strictly higher
  scores + number of equal scores at earlier positions)."""
  scores = np.asarray(scores, np.float64)
  g = np.take_along_axis(scores, gold[:, None], axis=1)  # [N, 1]
  earlier = np.arange(scores.shape[1])[None, :] < gold[:, None]
  rank = 1 + np.sum(scores > g, axis=1) + np.sum((scores == g) & earlier, axis=1)
  return float(np.mean(rank <= k))


def held_out_pools(size: int, distractors: int, seed: int, sc: stories.StoryConfig,
                   vocab: stories.Vocab) -> PoolSet:
  """The held-out pools of a run with `seed` (what its table is measured on; the diagnosis
  rebuilds them from retrieve.json)."""
  return build(size, distractors, seed + 1_000_003, sc, vocab).arrays


def batch_arrays(data: PoolSet, idx):
  """Questions idx [B] -> (passages [B, P, S, W], passage_mask [B, P, S], question, answer,
  gold): the pools gathered from the bank (numpy or jax arrays)."""
  rows = data.pool[idx]  # [B, P]
  return (data.stories[rows], data.story_mask[rows], data.question[idx], data.answer[idx],
          data.gold[idx])
