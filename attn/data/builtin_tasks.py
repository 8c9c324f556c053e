"""Built-in tasks generated from a seed, each example with its gold alignment.

An `Example` is source text, target text and `align`, an [K, 2] int32 array of (target token,
source token) index pairs under the task's tokenizers (`BuiltinTask.src_tokenizer` and
`tgt_tokenizer`): target token t "comes from" the source tokens s of its pairs. EOS->EOS is added by the pipeline; a
target token with no pair (the "-" of an ISO date) has an all-zero alignment row.

Tasks (`BUILTIN_TASKS`, chosen by `data.task`; not to be confused with attn.training's `TASKS`,
what a run trains for):
- `copy`, `reverse`: random strings of `task_vocab_size` symbols ("a".."t"), lengths uniform in
  [min_len, max_len] (default 5..50); target = source, or source reversed. One-to-one alignments;
  reverse puts target t on source L-1-t.
- `dates`: a date between min_year and max_year written in a babel/CLDR locale and format
  ("jeudi 25 juin 2009", "25.06.09", "June 25, 2009", "2009年6月25日") -> ISO "2009-06-25",
  character level. Digit fields align digit by digit from the right ("09" -> the "09" of 2009);
  target digits the source does not write (the "20" of a 2-digit year, the "0" of "6") align to the
  whole source field, as does a month name for both month digits. Locales put day, month and year in
  different orders, so alignments are non-monotone. A string that another active (locale, format)
  would read as a different date ("10/11/2009": en_US vs en_GB) is never generated.
- `numbers`: a cardinal written in words (English, French, German) -> its digits: many-to-one
  ("quatre vingt dix" -> 9) and reordered (German "sieben und neunzig" -> 97) alignments; lengths are
  digit counts, uniform in [min_len, max_len] (default 1..9). See numwords.py for the rules.

Determinism and held-out data: example i of a role is drawn from `np.random.default_rng([seed, role,
i])`, so the same seed gives the same data and a larger size extends a smaller one. Every example
has a key (the symbol string, the date, the number); a fixed hash of the key assigns it to train
(90%), eval (5%) or test (5%), and examples are drawn by rejection within their role. No eval or
test source (nor, for dates and numbers, its value in any wording) occurs in training.
"""

from __future__ import annotations

import abc
import dataclasses
import datetime
import re
import string
import zlib
from typing import Iterator

import numpy as np

from attn.data import numwords
from attn.data.base import ROLES, DataError
from attn.data.config import DataConfig
from attn.registry import Registry

_ROLE_ID = {r: i for i, r in enumerate(ROLES)}
_MAX_TRIES = 10_000
# Bump when generation changes, so cached copies (keyed by BuiltinTask.fingerprint) are written
# again.
GENERATOR_VERSION = 1


@dataclasses.dataclass(frozen=True)
class Example:
  """src, tgt: text. align: [K, 2] int32 (target token, source token) pairs. key: held-out unit."""
  src: str
  tgt: str
  align: np.ndarray
  key: str


def role_of_key(key: str) -> str:
  """Fixed (seed-independent) assignment of a key to train (90%), eval (5%) or test (5%)."""
  h = zlib.crc32(key.encode("utf-8")) % 100
  return "eval" if h < 5 else "test" if h < 10 else "train"


def _pairs(rows: list[list[int]]) -> np.ndarray:
  """[[s...] per target token] -> [K, 2] int32 (t, s)."""
  out = [(t, s) for t, srcs in enumerate(rows) for s in srcs]
  return np.asarray(out, np.int32).reshape(-1, 2)


class BuiltinTask(abc.ABC):
  """A built-in task generating examples from a seed. Subclasses define `sample(rng, role) ->
  Example | None` (None = reject, draw again)."""
  name = ""
  src_tokenizer = "space"
  tgt_tokenizer = "space"

  def __init__(self, cfg: DataConfig):
    self.cfg = cfg

  def lengths(self, role: str, default: tuple[int, int]) -> tuple[int, int]:
    lo, hi = self.cfg.min_len or default[0], self.cfg.max_len or default[1]
    if role != "train":
      lo, hi = self.cfg.eval_min_len or lo, self.cfg.eval_max_len or hi
    if not 1 <= lo <= hi:
      raise DataError(f"{self.name}: bad length range {lo}..{hi} for {role}")
    return lo, hi

  @abc.abstractmethod
  def sample(self, rng: np.random.Generator, role: str) -> Example | None:
    """Implemented by each subclass."""

  def example(self, role: str, i: int) -> Example:
    """Example i of `role` (a pure function of seed, role and i)."""
    rng = np.random.default_rng([self.cfg.seed, _ROLE_ID[role], i])
    for _ in range(_MAX_TRIES):
      ex = self.sample(rng, role)
      if ex is not None and role_of_key(ex.key) == role:
        return ex
    raise DataError(f"{self.name}: no {role} example in {_MAX_TRIES} draws; the task's space is too "
                    "small for a held-out split (raise the lengths or the vocabulary)")

  def generate(self, role: str, size: int) -> Iterator[Example]:
    for i in range(size):
      yield self.example(role, i)

  def fingerprint(self) -> dict:
    """The settings generation depends on (the TFDS cache key)."""
    c = self.cfg
    return dict(task=self.name, version=GENERATOR_VERSION, seed=c.seed, min_len=c.min_len, max_len=c.max_len,
                eval_min_len=c.eval_min_len, eval_max_len=c.eval_max_len,
                task_vocab_size=c.task_vocab_size, languages=list(c.languages),
                date_formats=list(c.date_formats), min_year=c.min_year, max_year=c.max_year)


# The value of `data.task` -> the built-in task's class.
BUILTIN_TASKS = Registry("built-in task", error=DataError)


def register_builtin_task(name: str):
  """Class decorator registering a built-in task under `name`; the class learns its name."""

  def decorator(cls):
    BUILTIN_TASKS.add(name, cls)
    cls.name = name
    return cls

  return decorator


def builtin_task(cfg: DataConfig) -> BuiltinTask:
  """The built-in task `cfg.task`, set up with `cfg`."""
  return BUILTIN_TASKS.get(cfg.task)(cfg)


# ---------------------------------------------------------------------------------------------
# copy / reverse


def symbols(n: int) -> list[str]:
  """n distinct symbols: "a".."z", then two letters "aa", "ab", ..."""
  letters = string.ascii_lowercase
  if n <= 26:
    return list(letters[:n])
  if n > 26 * 26:
    raise DataError(f"task_vocab_size={n} > {26 * 26}")
  return [a + b for a in letters for b in letters][:n]


class _SymbolTask(BuiltinTask):
  reverse = False

  def __init__(self, cfg):
    super().__init__(cfg)
    if cfg.task_vocab_size < 2:
      raise DataError("task_vocab_size must be >= 2")
    self.symbols = symbols(cfg.task_vocab_size)

  def sample(self, rng, role):
    lo, hi = self.lengths(role, (5, 50))
    n = int(rng.integers(lo, hi + 1))
    src = [self.symbols[j] for j in rng.integers(0, len(self.symbols), n)]
    order = list(range(n))[::-1] if self.reverse else list(range(n))
    tgt = [src[s] for s in order]
    return Example(" ".join(src), " ".join(tgt), _pairs([[s] for s in order]), " ".join(src))


@register_builtin_task("copy")
class CopyTask(_SymbolTask):
  """Target = source."""


@register_builtin_task("reverse")
class ReverseTask(_SymbolTask):
  """Target = source reversed."""
  reverse = True


# ---------------------------------------------------------------------------------------------
# dates

DEFAULT_DATE_LOCALES = ("en_US", "en_GB", "fr_FR", "de_DE", "es_ES", "ja_JP")
# CLDR standard formats and skeletons (a skeleton a locale lacks is skipped for that locale).
DEFAULT_DATE_FORMATS = ("short", "medium", "long", "full", "yMd", "yMMMd", "yMMMEd", "yMMMMd")
_STANDARD = ("short", "medium", "long", "full")
_TEXT_FIELDS = {"E", "c", "e", "G"}  # weekday, era: written but aligned to nothing


@dataclasses.dataclass(frozen=True)
class DatePattern:
  locale: str
  pattern: str
  tokens: tuple  # babel.dates.tokenize_pattern output
  reader: re.Pattern | None  # regex reading (y, M, d) back, for numeric-month patterns


def _pattern_reader(tokens) -> re.Pattern | None:
  """A regex with groups y, M, d matching what a numeric-month pattern writes; None otherwise."""
  parts = []
  for kind, val in tokens:
    if kind == "chars":
      parts.append(re.escape(val))
      continue
    ch, n = val
    if ch in ("M", "L") and n > 2:
      return None  # month names cannot be misread as another date
    if ch == "y":
      parts.append(r"(?P<y>\d{2})" if n == 2 else r"(?P<y>\d{4})")
    elif ch in ("M", "L"):
      parts.append(r"(?P<M>\d{2})" if n == 2 else r"(?P<M>\d{1,2})")
    elif ch == "d":
      parts.append(r"(?P<d>\d{2})" if n == 2 else r"(?P<d>\d{1,2})")
    else:  # weekday / era text: any non-empty text (conservative: may reject an unambiguous string)
      parts.append(r".+?")
  return re.compile("".join(parts))


@register_builtin_task("dates")
class DatesTask(BuiltinTask):
  """Human-written dates (babel/CLDR, several locales and formats) -> ISO 8601."""
  src_tokenizer = "char"
  tgt_tokenizer = "char"

  def __init__(self, cfg):
    super().__init__(cfg)
    import babel  # pylint: disable=import-outside-toplevel
    from babel import dates as bdates  # pylint: disable=import-outside-toplevel

    self._bdates = bdates
    if not 1000 <= cfg.min_year <= cfg.max_year <= 9999:
      raise DataError(f"dates: years {cfg.min_year}..{cfg.max_year} must be 4-digit")
    self.first = datetime.date(cfg.min_year, 1, 1).toordinal()
    self.last = datetime.date(cfg.max_year, 12, 31).toordinal()
    short_years_ok = cfg.max_year - cfg.min_year < 100
    self.locales = {}
    self.patterns: list[DatePattern] = []
    for loc in cfg.languages or DEFAULT_DATE_LOCALES:
      try:
        locale = babel.Locale.parse(loc)
      except (ValueError, babel.UnknownLocaleError) as e:
        raise DataError(f"dates: unknown locale {loc!r} ({e})") from e
      self.locales[loc] = locale
      seen = set()
      for fmt in cfg.date_formats or DEFAULT_DATE_FORMATS:
        if fmt in _STANDARD:
          pattern = bdates.get_date_format(fmt, locale).pattern
        elif fmt in locale.datetime_skeletons:
          pattern = locale.datetime_skeletons[fmt].pattern
        else:
          continue
        tokens = tuple(bdates.tokenize_pattern(pattern))
        fields = [v for k, v in tokens if k == "field"]
        if any(ch not in {"y", "M", "L", "d"} | _TEXT_FIELDS for ch, _ in fields):
          continue  # e.g. a cyclic-year field: no clean ISO reading
        if not {"y", "d"} <= {ch for ch, _ in fields} or not {"M", "L"} & {ch for ch, _ in fields}:
          continue
        if any(ch == "y" and n == 2 for ch, n in fields) and not short_years_ok:
          continue
        if pattern not in seen:
          seen.add(pattern)
          self.patterns.append(DatePattern(loc, pattern, tokens, _pattern_reader(tokens)))
    if not self.patterns:
      raise DataError("dates: no usable (locale, format) pair; check data.languages/date_formats")
    self._by_locale = {loc: [p for p in self.patterns if p.locale == loc] for loc in self.locales}
    self._readers = [p.reader for p in self.patterns if p.reader is not None]

  def _two_digit_year(self, yy: int) -> int | None:
    """The year of the range ending in yy (patterns with 2-digit years are on only if unique)."""
    years = [y for y in range(self.cfg.min_year, self.cfg.max_year + 1) if y % 100 == yy]
    return years[0] if len(years) == 1 else None

  def readings(self, text: str) -> set[datetime.date]:
    """Every date a numeric-month pattern of the active set reads from `text`."""
    out = set()
    for reader in self._readers:
      m = reader.fullmatch(text)
      if not m:
        continue
      y = int(m["y"])
      if len(m["y"]) == 2:
        y = self._two_digit_year(y)
        if y is None:
          continue
      try:
        out.add(datetime.date(y, int(m["M"]), int(m["d"])))
      except ValueError:
        continue  # the pattern matched but names no real day (e.g. 31.02): not a reading
    return out

  def render(self, date: datetime.date, p: DatePattern) -> tuple[str, list[tuple[str, int, int]]]:
    """Text and field spans [(field char, start, end)] of `date` in pattern `p`."""
    fmt = self._bdates.DateTimeFormat(date, self.locales[p.locale])
    text, spans = [], []
    pos = 0
    for kind, val in p.tokens:
      piece = val if kind == "chars" else fmt[val[0] * val[1]]
      if kind == "field":
        spans.append((val[0], pos, pos + len(piece)))
      text.append(piece)
      pos += len(piece)
    return "".join(text), spans

  def example_for(self, date: datetime.date, p: DatePattern) -> Example:
    src, spans = self.render(date, p)
    tgt = date.isoformat()  # YYYY-MM-DD
    rows: list[list[int]] = [[] for _ in tgt]
    target_fields = {"y": range(0, 4), "M": range(5, 7), "d": range(8, 10)}
    for ch, start, end in spans:
      key = "M" if ch == "L" else ch
      if key not in target_fields:
        continue
      t_pos = list(target_fields[key])
      field_text = src[start:end]
      if field_text.isdigit():
        # right-aligned digit by digit; target digits the source does not write -> whole field
        for k, t in enumerate(reversed(t_pos)):
          rows[t] = [end - 1 - k] if k < end - start else list(range(start, end))
      else:  # month name
        for t in t_pos:
          rows[t] = list(range(start, end))
    return Example(src, tgt, _pairs(rows), tgt)

  def sample(self, rng, role):
    date = datetime.date.fromordinal(int(rng.integers(self.first, self.last + 1)))
    if role_of_key(date.isoformat()) != role:
      return None
    loc = list(self.locales)[int(rng.integers(len(self.locales)))]
    pats = self._by_locale[loc]
    p = pats[int(rng.integers(len(pats)))]
    ex = self.example_for(date, p)
    if p.reader is not None and self.readings(ex.src) - {date}:
      return None  # another active locale/format reads this string as a different date
    return ex


# ---------------------------------------------------------------------------------------------
# numbers


@register_builtin_task("numbers")
class NumbersTask(BuiltinTask):
  """Cardinal numbers in words (en/fr/de) -> digits."""
  src_tokenizer = "space"
  tgt_tokenizer = "char"

  def __init__(self, cfg):
    super().__init__(cfg)
    self.languages = tuple(cfg.languages or numwords.LANGUAGES)
    bad = [l for l in self.languages if l not in numwords.LANGUAGES]
    if bad:
      raise DataError(f"numbers: unsupported languages {bad}; supported: {', '.join(numwords.LANGUAGES)}")
    for role in ROLES:
      lo, hi = self.lengths(role, (1, 9))
      if hi > 9:
        raise DataError(f"numbers: at most 9 digits (got max length {hi})")

  def example_for(self, n: int, lang: str) -> Example:
    words, terms = numwords.number_words(n, lang)
    rows = numwords.digit_alignment(n, words, terms)
    return Example(" ".join(w.text for w in words), str(n), _pairs(rows), str(n))

  def sample(self, rng, role):
    lo, hi = self.lengths(role, (1, 9))
    k = int(rng.integers(lo, hi + 1))
    n = int(rng.integers(0 if k == 1 else 10**(k - 1), 10**k))
    if role_of_key(str(n)) != role:
      return None
    lang = self.languages[int(rng.integers(len(self.languages)))]
    return self.example_for(n, lang)
