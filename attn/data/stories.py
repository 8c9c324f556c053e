"""bAbI-style stories and questions (Weston et al. 2015, tasks 1 and 2), seeded, numpy only.

Actors move between places and take or drop objects; each example is one story and one question:

    Mary went to the kitchen.          "Where is Mary?"  -> kitchen; evidence: the last sentence
    John took the apple.                moving Mary (task 1, "single supporting fact").
    John journeyed to the garden.      "Where is the apple?" -> garden; evidence: the last pick-up
    Mary travelled to the hallway.      of the apple and the last move of its holder (task 2, "two
                                        supporting facts").

`support` is the one sentence a one-hop reader should attend to: for actor questions the last move
of the actor; for object questions the *final* supporting fact, the holder's last move (the
pick-up is the other gold fact, kept in `supports`). Object questions are only asked about an
object someone holds after having moved somewhere, so the answer is always well defined.

Vocabulary: lowercased words, punctuation stripped, ids from attn.data.tokens (PAD = 0,
UNK = 3); it is built from the config's word lists (not from a sample), so train, test and typed
stories share it. Answers index `config.places`.

Arrays (`encode`): story [N, S, W] word ids (PAD past each sentence and story), story_mask [N, S]
bool (True = a sentence), question [N, Wq], answer [N] (index into places), support [N] (sentence
index of the final supporting fact), kind [N] (index into KINDS).
"""

from __future__ import annotations

import dataclasses
import re
from typing import NamedTuple

import numpy as np

from attn.config.configurable import option
from attn.data.tokens import PAD, SPECIAL_TOKENS, UNK
from attn.errors import ConfigError

KINDS = ("actor", "object")
# bAbI's verbs: several surface forms per action, so the reader must learn that they mean the same.
MOVE_VERBS = ("went to", "journeyed to", "travelled to", "moved to", "went back to")
TAKE_VERBS = ("took", "picked up", "got", "grabbed")
DROP_VERBS = ("dropped", "discarded", "put down", "left")
QUESTION_WORDS = ("where", "is", "the")


@dataclasses.dataclass(frozen=True)
class StoryConfig:
  """What the generator draws from. Story lengths are uniform in [min_sentences, max_sentences];
  a story with no object eligible for a question gets an actor question; a sentence that is
  neither a pick-up nor a drop (or where none is possible) is a move."""
  actors: tuple[str, ...] = option(("Mary", "John", "Sandra", "Daniel"), "Who moves.")
  places: tuple[str, ...] = option(
      ("kitchen", "garden", "hallway", "bathroom", "bedroom", "office"),
      "Where they go (the answers).")
  objects: tuple[str, ...] = option(("apple", "football", "milk"), "What they take and drop.")
  min_sentences: int = option(4, "Shortest story (sentences).")
  max_sentences: int = option(12, "Longest story (sentences).")
  object_questions: float = option(
      0.0, "Fraction of 'Where is the apple?' questions (two supporting facts); the rest ask "
      "about an actor (one supporting fact).")
  p_take: float = option(0.2, "Chance that a sentence is a pick-up (when one is possible).")
  p_drop: float = option(0.1, "Chance that a sentence is a drop (when one is possible).")

  def __post_init__(self):
    if not 1 <= self.min_sentences <= self.max_sentences:
      raise ConfigError(f"story lengths need 1 <= min_sentences <= max_sentences, got "
                        f"{self.min_sentences}..{self.max_sentences}")
    if not 0.0 <= self.object_questions <= 1.0:
      raise ConfigError(f"object_questions is a fraction in [0, 1], got {self.object_questions}")
    if not (0 <= self.p_take and 0 <= self.p_drop and self.p_take + self.p_drop < 1):
      raise ConfigError(f"p_take and p_drop must be >= 0 with a sum < 1 (moves need the rest), "
                        f"got {self.p_take}, {self.p_drop}")
    if len(self.actors) < 1 or len(self.places) < 2:
      raise ConfigError("stories need at least one actor and two places")


class Example(NamedTuple):
  """One story and one question. supports: every gold supporting sentence (ascending);
  support: the final supporting fact (the one a one-hop reader should pick)."""
  sentences: list[str]
  question: str
  answer: str
  supports: tuple[int, ...]
  support: int
  kind: str


def tokenize(text: str) -> list[str]:
  """Lowercased words, punctuation stripped: "Where is Mary?" -> ["where", "is", "mary"]."""
  return re.findall(r"[a-z0-9]+", text.lower())


def split_sentences(text: str) -> list[str]:
  """A typed story into sentences: one per line and/or ended by '.', '!' or '?'; wordless ones
  are dropped."""
  parts = re.split(r"(?<=[.!?])\s+|\n+", text.strip())
  return [p.strip() for p in parts if tokenize(p)]


class Vocab:
  """Word <-> id; PAD and UNK from attn.data.tokens, unknown words map to UNK."""

  def __init__(self, words):
    self.words = list(SPECIAL_TOKENS) + sorted(set(words) - set(SPECIAL_TOKENS))
    self.ids = {w: i for i, w in enumerate(self.words)}
    self._encoded = {}  # text -> ids: generated stories repeat a few hundred sentences

  @classmethod
  def for_config(cls, config: StoryConfig) -> "Vocab":
    text = " ".join(config.actors + config.places + config.objects + MOVE_VERBS + TAKE_VERBS
                    + DROP_VERBS + QUESTION_WORDS)
    return cls(tokenize(text))

  def __len__(self):
    return len(self.words)

  def encode(self, text: str) -> list[int]:
    ids = self._encoded.get(text)
    if ids is None:
      ids = self._encoded[text] = tuple(self.ids.get(w, UNK) for w in tokenize(text))
    return list(ids)

  def unknown(self, text: str) -> list[str]:
    """The words of `text` that are not in the vocabulary (each once, in order)."""
    return list(dict.fromkeys(w for w in tokenize(text) if w not in self.ids))


def _story(rng, config: StoryConfig, n: int):
  """n sentences and the world's history: per sentence (kind, actor, object or place)."""
  where = {}  # actor -> place (absent until the actor first moves)
  holder = {}  # object -> actor holding it
  dropped_at = {}  # object -> place where it was dropped
  sentences, events = [], []
  for _ in range(n):
    actor = config.actors[rng.integers(len(config.actors))]
    held = [o for o in config.objects if holder.get(o) == actor]
    takeable = [o for o in config.objects if o not in holder
                and dropped_at.get(o, where.get(actor)) == where.get(actor)]
    r = rng.random()
    if r < config.p_take and actor in where and takeable:
      obj = takeable[rng.integers(len(takeable))]
      holder[obj] = actor
      dropped_at.pop(obj, None)
      verb = TAKE_VERBS[rng.integers(len(TAKE_VERBS))]
      sentences.append(f"{actor} {verb} the {obj}.")
      events.append(("take", actor, obj))
    elif config.p_take <= r < config.p_take + config.p_drop and held:
      obj = held[rng.integers(len(held))]
      del holder[obj]
      dropped_at[obj] = where[actor]
      verb = DROP_VERBS[rng.integers(len(DROP_VERBS))]
      sentences.append(f"{actor} {verb} the {obj}.")
      events.append(("drop", actor, obj))
    else:
      place = config.places[rng.integers(len(config.places))]
      where[actor] = place
      verb = MOVE_VERBS[rng.integers(len(MOVE_VERBS))]
      sentences.append(f"{actor} {verb} the {place}.")
      events.append(("move", actor, place))
  return sentences, events, where, holder


def _last(events, kind, actor, obj=None):
  """Index of the last event of `kind` by `actor` (about `obj` when given), or None."""
  for i in range(len(events) - 1, -1, -1):
    k, a, x = events[i]
    if k == kind and a == actor and (obj is None or x == obj):
      return i
  return None


def generate(num: int, seed: int, config: StoryConfig = StoryConfig()) -> list[Example]:
  """`num` examples, a deterministic function of (num, seed, config)."""
  rng = np.random.default_rng(seed)
  examples = []
  while len(examples) < num:
    n = int(rng.integers(config.min_sentences, config.max_sentences + 1))
    sentences, events, where, holder = _story(rng, config, n)
    # Objects held by someone who has moved: "Where is the apple?" has an answer and 2 facts.
    askable = [o for o in config.objects if o in holder and holder[o] in where]
    if askable and rng.random() < config.object_questions:
      obj = askable[rng.integers(len(askable))]
      actor = holder[obj]
      take, move = _last(events, "take", actor, obj), _last(events, "move", actor)
      examples.append(Example(sentences, f"Where is the {obj}?", where[actor],
                              tuple(sorted((take, move))), move, "object"))
      continue
    moved = [a for a in config.actors if a in where]
    if not moved:  # every sentence was a pick-up or drop: impossible (those need a move first)
      continue
    actor = moved[rng.integers(len(moved))]
    move = _last(events, "move", actor)
    examples.append(Example(sentences, f"Where is {actor}?", where[actor], (move,), move, "actor"))
  return examples


class Arrays(NamedTuple):
  """Padded arrays (see the module docstring for shapes)."""
  story: np.ndarray
  story_mask: np.ndarray
  question: np.ndarray
  answer: np.ndarray
  support: np.ndarray
  kind: np.ndarray


def pad_stories(stories: list[list[list[int]]], num_sentences: int | None = None,
                num_words: int | None = None) -> tuple[np.ndarray, np.ndarray]:
  """Word ids per sentence per story -> story [N, S, W] int32, story_mask [N, S] bool.
  S and W default to the longest story / sentence; longer inputs are an error, not truncated."""
  S = max(len(s) for s in stories) if num_sentences is None else num_sentences
  W = max((len(x) for s in stories for x in s), default=1) if num_words is None else num_words
  if any(len(s) > S for s in stories) or any(len(x) > W for s in stories for x in s):
    raise ValueError(f"a story is longer than the padded size [{S} sentences, {W} words]")
  story = np.full((len(stories), S, max(W, 1)), PAD, np.int32)
  mask = np.zeros((len(stories), S), bool)
  for i, s in enumerate(stories):
    mask[i, :len(s)] = True
    for j, words in enumerate(s):
      story[i, j, :len(words)] = words
  return story, mask


def pad_questions(questions: list[list[int]], num_words: int | None = None) -> np.ndarray:
  """Word ids per question -> [N, Wq] int32, PAD past each question."""
  W = max(len(q) for q in questions) if num_words is None else num_words
  out = np.full((len(questions), max(W, 1)), PAD, np.int32)
  for i, q in enumerate(questions):
    out[i, :len(q)] = q
  return out


def encode(examples: list[Example], vocab: Vocab, config: StoryConfig) -> Arrays:
  """Examples -> padded arrays; S = config.max_sentences so every batch has one shape."""
  stories = [[vocab.encode(s) for s in ex.sentences] for ex in examples]
  story, mask = pad_stories(stories, num_sentences=config.max_sentences)
  question = pad_questions([vocab.encode(ex.question) for ex in examples])
  answer = np.array([config.places.index(ex.answer) for ex in examples], np.int32)
  support = np.array([ex.support for ex in examples], np.int32)
  kind = np.array([KINDS.index(ex.kind) for ex in examples], np.int32)
  return Arrays(story, mask, question, answer, support, kind)
