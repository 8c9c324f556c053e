"""Tokenizers and vocabularies with reserved ids PAD=0, BOS=1, EOS=2, UNK=3.

Tokenizers (`TOKENIZERS`, chosen by `data.tokenizer`; built-in tasks fix their own):
- `word`: words (`\\w+`) and single punctuation marks, reversible. A token written without a space
  before it carries the joiner mark "￭" on the side where the space is missing ("dog." ->
  ["dog", "￭."], "l'eau" -> ["l", "'￭", "eau"]), the joiner annotation of the OpenNMT Tokenizer, so
  `detokenize(tokenize(x)) == x` for whitespace-normalized x and sacreBLEU scores real sentences.
- `space`: split on whitespace, join with one space.
- `char`: every character a token (spaces included), joined back exactly.
- `sentencepiece`: a unigram model trained on the training split (needs the `sentencepiece` package).

Optional lowercasing happens before tokenization (so decoding gives lowercase text: score it against
references with sacreBLEU's `lowercase=True`).

A `Vocab` saves to one JSON file (a sentencepiece model travels inside it, base64) so a resumed run
reuses exactly the ids it trained with.
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import hashlib
import io
import json
import os
import re
from typing import Callable, Iterable, Sequence

import numpy as np

from attn.common.files import write_json
from attn.common.joiner import JOINER  # "￭", OpenNMT Tokenizer's joiner (plots strip it)
from attn.data.base import BOS, EOS, PAD, SPECIAL_TOKENS, UNK, DataError
from attn.registry import Registry

_WORD_RE = re.compile(r"\w+|[^\w\s]")
VOCAB_FORMAT = 1
_SPM_MAX_SENTENCES = 2_000_000


def _is_word(tok: str) -> bool:
  return bool(re.match(r"\w", tok))


def word_tokenize(text: str) -> list[str]:
  """Words and punctuation marks with joiner marks where no space separated them."""
  tokens: list[str] = []
  prev_end, prev_word = -1, False
  for m in _WORD_RE.finditer(text):
    tok, word = m.group(), _is_word(m.group())
    if m.start() == prev_end:  # glued to the previous token
      if word and not prev_word:
        tokens[-1] += JOINER  # "'" in "l'eau": the mark goes on the punctuation
      else:
        tok = JOINER + tok
    tokens.append(tok)
    prev_end, prev_word = m.end(), word
  return tokens


def word_detokenize(tokens: Sequence[str]) -> str:
  """Inverse of `word_tokenize`: one space between tokens except where a joiner says none."""
  out: list[str] = []
  glue_next = True  # no space before the first token
  for tok in tokens:
    left = tok.startswith(JOINER)
    right = tok.endswith(JOINER) and len(tok) > 1
    core = tok[1 if left else 0:len(tok) - (1 if right else 0)]
    if not (glue_next or left):
      out.append(" ")
    out.append(core)
    glue_next = right
  return "".join(out)


def _space_tokenize(text: str) -> list[str]:
  return text.split()


def _space_detokenize(tokens: Sequence[str]) -> str:
  return " ".join(tokens)


def _char_tokenize(text: str) -> list[str]:
  return list(text)


def _char_detokenize(tokens: Sequence[str]) -> str:
  return "".join(tokens)


@dataclasses.dataclass(frozen=True)
class Tokenizer:
  """A tokenizer: `tokenize`/`detokenize` for a rule-based one (`Vocab`); learned=True for one
  trained on the training split's sentences (sentencepiece: `SentencePieceVocab` tokenizes)."""
  tokenize: Callable[[str], list[str]] | None = None
  detokenize: Callable[[Sequence[str]], str] | None = None
  learned: bool = False


# The value of `data.tokenizer` -> its Tokenizer.
TOKENIZERS = Registry("tokenizer", error=DataError)
TOKENIZERS.add("word", Tokenizer(word_tokenize, word_detokenize))
TOKENIZERS.add("space", Tokenizer(_space_tokenize, _space_detokenize))
TOKENIZERS.add("char", Tokenizer(_char_tokenize, _char_detokenize))
TOKENIZERS.add("sentencepiece", Tokenizer(learned=True))


@dataclasses.dataclass(frozen=True)
class TokenizerSpec:
  """What turns text into tokens; stored with the vocabulary and checked on resume."""
  kind: str = "word"
  lowercase: bool = False

  def __post_init__(self):
    TOKENIZERS.get(self.kind)  # an unknown name: DataError listing the known ones

  @property
  def learned(self) -> bool:
    """The tokenizer is trained on the training split's sentences (not counted from tokens)."""
    return TOKENIZERS.get(self.kind).learned


def normalize_whitespace(text: str) -> str:
  """Strips and collapses every run of whitespace to one space (applied when corpora are read)."""
  return " ".join(text.split())


class Vocab:
  """Token <-> id map with the reserved ids PAD=0, BOS=1, EOS=2, UNK=3 first.

  encode(text) -> list[int] without BOS/EOS; unknown tokens map to UNK.
  decode(ids) -> str: stops at the first EOS, skips PAD and BOS, writes UNK as "<unk>", detokenizes.

  Source-extended ids, for copying models (the pointer-generator's extended vocabulary, See et
  al. 2017 sec. 2.2): `source_oovs(src)` lists the distinct out-of-vocabulary tokens of a source
  in order of first appearance; with that list `oovs`, token oovs[k] has id size + k in
  `encode_extended` (of the source or of its target; other unknown tokens stay UNK) and back in
  `decode_extended` / `labels_extended`.
  """

  def __init__(self, tokens: Sequence[str], spec: TokenizerSpec = TokenizerSpec()):
    """tokens: the ordinary tokens (no specials), in id order from 4."""
    if spec.learned:
      raise DataError(f"use SentencePieceVocab for {spec.kind}")
    self.spec = spec
    self._itos = list(SPECIAL_TOKENS) + [t for t in tokens]
    self._stoi = {t: i for i, t in enumerate(self._itos)}
    if len(self._stoi) != len(self._itos):
      raise DataError("vocabulary tokens are not unique (or collide with a special token)")
    tokenizer = TOKENIZERS.get(spec.kind)
    self._tokenize, self._detokenize = tokenizer.tokenize, tokenizer.detokenize

  # -- sizes and lookups
  @property
  def size(self) -> int:
    return len(self._itos)

  def __len__(self) -> int:
    return len(self._itos)

  def id_to_token(self, i: int) -> str:
    return self._itos[i]

  def token_to_id(self, tok: str) -> int:
    return self._stoi.get(tok, UNK)

  @property
  def tokens(self) -> list[str]:
    """Ordinary tokens in id order (ids 4..size-1)."""
    return self._itos[len(SPECIAL_TOKENS):]

  # -- text <-> tokens <-> ids
  def tokenize(self, text: str) -> list[str]:
    return self._tokenize(text.lower() if self.spec.lowercase else text)

  def detokenize(self, tokens: Sequence[str]) -> str:
    return self._detokenize(tokens)

  def encode(self, text: str) -> list[int]:
    get = self._stoi.get
    return [get(t, UNK) for t in self.tokenize(text)]

  def decode(self, ids: Iterable[int]) -> str:
    return self.detokenize(self.decode_tokens(ids))

  def _token(self, i: int, oovs: Sequence[str] = ()) -> str:
    """Token of id i; ids from size on index `oovs`; anything else is "<unk>"."""
    if 0 <= i < len(self._itos):
      return self._itos[i]
    k = i - len(self._itos)
    return oovs[k] if 0 <= k < len(oovs) else SPECIAL_TOKENS[UNK]

  def decode_tokens(self, ids: Iterable[int], oovs: Sequence[str] = ()) -> list[str]:
    """Tokens of `ids` up to the first EOS, without PAD/BOS (ids >= size: see decode_extended)."""
    out = []
    for i in np.asarray(ids, dtype=np.int64).reshape(-1).tolist():
      if i == EOS:
        break
      if i in (PAD, BOS):
        continue
      out.append(self._token(i, oovs))
    return out

  def labels(self, ids: Iterable[int]) -> list[str]:
    """One printable label per id, specials included, so heatmap axes match attention rows and
    columns one to one. Sentencepiece's word marker U+2581 (missing from common fonts) shows as _."""
    return self.labels_extended(ids, ())

  # -- source-extended ids (see the class docstring)
  def source_oovs(self, text: str, limit: int | None = None) -> list[str]:
    """Distinct tokens of `text` missing from the vocabulary, in order of first appearance,
    among its first `limit` tokens (None: all). oovs[k] gets the extended id size + k."""
    seen: dict[str, None] = {}
    for tok in self.tokenize(text)[:limit]:
      if tok not in self._stoi:
        seen.setdefault(tok)
    return list(seen)

  def encode_extended(self, text: str, oovs: Sequence[str]) -> list[int]:
    """`encode(text)`, except that a token missing from the vocabulary that is oovs[k] gets
    size + k (other unknown tokens stay UNK). For a source, pass `source_oovs` of that source;
    for its target, the same list (a target token is copyable only if the source has it)."""
    ext = {t: self.size + k for k, t in enumerate(oovs)}
    stoi = self._stoi
    return [stoi[t] if t in stoi else ext.get(t, UNK) for t in self.tokenize(text)]

  def decode_extended(self, ids: Iterable[int], oovs: Sequence[str]) -> str:
    """`decode` for extended ids: id size + k is oovs[k]; ids past the list read "<unk>"."""
    return self.detokenize(self.decode_tokens(ids, oovs))

  def labels_extended(self, ids: Iterable[int], oovs: Sequence[str]) -> list[str]:
    """`labels` for extended ids (id size + k is oovs[k]; past the list "<unk>")."""
    return [self._token(i, oovs).replace("\u2581", "_")
            for i in np.asarray(ids, dtype=np.int64).reshape(-1).tolist()]

  # -- persistence
  def to_json(self) -> dict:
    return {"format": VOCAB_FORMAT, "tokenizer": dataclasses.asdict(self.spec),
            "specials": list(SPECIAL_TOKENS), "tokens": self.tokens}

  def fingerprint(self) -> str:
    blob = json.dumps(self.to_json(), ensure_ascii=False, sort_keys=True).encode()
    return hashlib.sha1(blob).hexdigest()[:12]

  def save(self, path: str) -> None:
    """Writes the vocabulary as JSON (atomically: a killed run never leaves half a file)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_json(path, self.to_json(), ensure_ascii=False, indent=0)

  def __repr__(self) -> str:
    return f"{type(self).__name__}(size={self.size}, tokenizer={self.spec.kind!r}, lowercase={self.spec.lowercase})"


class SentencePieceVocab(Vocab):
  """A sentencepiece model behind the Vocab interface; ids 0-3 are PAD, BOS, EOS, UNK too."""

  def __init__(self, model_proto: bytes, spec: TokenizerSpec):
    spm = _import_sentencepiece()
    self.spec = spec
    self.model_proto = model_proto
    self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
    n = self._sp.get_piece_size()
    self._itos = [self._sp.id_to_piece(i) for i in range(n)]
    self._itos[:len(SPECIAL_TOKENS)] = SPECIAL_TOKENS
    self._stoi = {t: i for i, t in enumerate(self._itos)}

  def tokenize(self, text: str) -> list[str]:
    return self._sp.encode(text.lower() if self.spec.lowercase else text, out_type=str)

  def detokenize(self, tokens: Sequence[str]) -> str:
    return self._sp.decode_pieces(list(tokens))

  def encode(self, text: str) -> list[int]:
    return self._sp.encode(text.lower() if self.spec.lowercase else text)

  def decode(self, ids: Iterable[int]) -> str:
    out = []
    for i in np.asarray(ids, dtype=np.int64).reshape(-1).tolist():
      if i == EOS:
        break
      if i not in (PAD, BOS):
        out.append(i if 0 <= i < self.size else UNK)  # sentencepiece raises on unknown ids
    return self._sp.decode(out)

  # Pieces cover every string the model was trained on, so a source has no OOV tokens to copy
  # and the extended ids are the ordinary ones. (A character never seen in training still encodes
  # to UNK and stays UNK: train with byte fallback to avoid those.)
  def source_oovs(self, text: str, limit: int | None = None) -> list[str]:
    del text, limit
    return []

  def encode_extended(self, text: str, oovs: Sequence[str]) -> list[int]:
    if oovs:
      raise ValueError("a sentencepiece vocabulary has no OOV tokens (source_oovs is empty)")
    return self.encode(text)

  def decode_extended(self, ids: Iterable[int], oovs: Sequence[str]) -> str:
    if oovs:
      raise ValueError("a sentencepiece vocabulary has no OOV tokens (source_oovs is empty)")
    return self.decode(ids)

  def to_json(self) -> dict:
    return {"format": VOCAB_FORMAT, "tokenizer": dataclasses.asdict(self.spec),
            "specials": list(SPECIAL_TOKENS),
            "sentencepiece_model": base64.b64encode(self.model_proto).decode("ascii")}


def _import_sentencepiece():
  try:
    import sentencepiece  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise DataError("data.tokenizer='sentencepiece' needs the sentencepiece package "
                    "(pip install sentencepiece==0.2.3)") from e
  return sentencepiece


def load_vocab(path: str) -> Vocab:
  """Reads a vocabulary written by `Vocab.save`."""
  try:
    with open(path, encoding="utf-8") as f:
      d = json.load(f)
  except (OSError, ValueError) as e:
    raise DataError(f"cannot read vocabulary {path}: {e}") from e
  if d.get("format") != VOCAB_FORMAT or tuple(d.get("specials", ())) != SPECIAL_TOKENS:
    raise DataError(f"{path}: not a vocabulary of format {VOCAB_FORMAT} with specials {SPECIAL_TOKENS}")
  spec = TokenizerSpec(**d["tokenizer"])
  if spec.learned:
    return SentencePieceVocab(base64.b64decode(d["sentencepiece_model"]), spec)
  return Vocab(d["tokens"], spec)


def count_tokens(texts: Iterable[str], spec: TokenizerSpec) -> collections.Counter:
  tokenize = Vocab([], spec).tokenize
  counts: collections.Counter = collections.Counter()
  for t in texts:
    counts.update(tokenize(t))
  return counts


def build_vocab(texts: Iterable[str], spec: TokenizerSpec, *, min_freq: int = 1, max_size: int = 0,
                seed: int = 0) -> Vocab:
  """Vocabulary of the tokens of `texts` (the training split).

  Tokens seen fewer than `min_freq` times are left out; `max_size` > 0 caps the size, specials
  included. Order: frequency descending, then the token (so the same data gives the same ids).
  For sentencepiece, `max_size` is the model's vocabulary size (8000 when 0) and `min_freq` is unused.
  """
  if spec.learned:
    return _train_sentencepiece(texts, spec, max_size or 8000, seed)
  return vocab_from_counts(count_tokens(texts, spec), spec, min_freq=min_freq, max_size=max_size)


def vocab_from_counts(counts: collections.Counter, spec: TokenizerSpec, *, min_freq: int = 1,
                      max_size: int = 0) -> Vocab:
  """`build_vocab` from token counts already taken (so one pass can count both sides)."""
  items = sorted(((c, t) for t, c in counts.items() if c >= min_freq and t not in SPECIAL_TOKENS),
                 key=lambda ct: (-ct[0], ct[1]))
  if max_size:
    items = items[:max(0, max_size - len(SPECIAL_TOKENS))]
  return Vocab([t for _, t in items], spec)


def _train_sentencepiece(texts: Iterable[str], spec: TokenizerSpec, vocab_size: int,
                         seed: int) -> SentencePieceVocab:
  spm = _import_sentencepiece()
  sentences = [t.lower() if spec.lowercase else t for t in texts if t.strip()]
  if not sentences:
    raise DataError("cannot train sentencepiece on an empty training split")
  if len(sentences) > _SPM_MAX_SENTENCES:  # a seeded sample keeps memory bounded on big corpora
    keep = np.random.default_rng(seed).choice(len(sentences), _SPM_MAX_SENTENCES, replace=False)
    sentences = [sentences[i] for i in np.sort(keep)]
  model = io.BytesIO()
  # Single-threaded and unshuffled so that the same sentences give the same model.
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(sentences), model_writer=model, vocab_size=vocab_size,
      model_type="unigram", character_coverage=1.0, hard_vocab_limit=False,
      pad_id=PAD, bos_id=BOS, eos_id=EOS, unk_id=UNK, normalization_rule_name="identity",
      shuffle_input_sentence=False, num_threads=1, minloglevel=2)
  return SentencePieceVocab(model.getvalue(), spec)
