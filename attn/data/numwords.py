"""Cardinal numbers 0..999,999,999 written as words in English, French and German, with gold
word -> digit alignments. Used by the built-in `numbers` task (builtin_tasks.py).

Words are space-separated tokens: hyphens become spaces ("forty two", "quatre vingt dix sept") and
German compounds are split into their morphemes ("sieben und neunzig tausend"), so every token is
one number word. Orthography follows current usage: French "et" in 21..71, plural "cents"/"vingts"
only when last in the number or before "millions"; German "eins" only as the final word.

Alignment semantics (language-independent, see `digit_alignment`). The words form a sum of *terms*
(a numeral such as "forty", or a product of numerals such as "quatre vingt" = 80) each shifted by the
scale words that multiply it ("three hundred thousand": the term "three" sits at 10^5), plus *scale*
words ("hundred", "thousand", "million") that only fix positions. Then for digit position p:
  - a non-zero digit aligns to every word of every term with a non-zero digit at p
    (French 97 "quatre vingt dix sept": 9 <- quatre, vingt, dix; 7 <- sept; 17 "dix sept": 1 <- dix);
  - a zero digit aligns to the words of the terms that write that zero ("twenty" -> the 0 of 20);
    otherwise to the scale word with the smallest position above p (107: 0 <- "hundred";
    2007: 0, 0 <- "thousand");
  - connectors ("et", "und") align to nothing.
German tens come after the ones ("sieben und neunzig" -> 97), so alignments are non-monotone there.
"""

from __future__ import annotations

import dataclasses

LANGUAGES = ("en", "fr", "de")
MAX_NUMBER = 999_999_999


@dataclasses.dataclass(frozen=True)
class Word:
  """One source token. term: index into the terms list or None; anchor: absolute digit position a
  scale word fixes (hundred in group g -> 3g+2, thousand -> 3, million -> 6) or None."""
  text: str
  term: int | None = None
  anchor: int | None = None


@dataclasses.dataclass(frozen=True)
class Term:
  """A value written by one or more words, at digit position `shift` (value * 10**shift)."""
  value: int
  shift: int


class _Builder:
  def __init__(self):
    self.words: list[Word] = []
    self.terms: list[Term] = []

  def num(self, value: int, shift: int, *texts: str, anchor: int | None = None):
    """A term written by `texts` (several words = a product such as "quatre vingt")."""
    self.terms.append(Term(value, shift))
    for t in texts:
      self.words.append(Word(t, term=len(self.terms) - 1, anchor=anchor))

  def scale(self, text: str, anchor: int):
    self.words.append(Word(text, anchor=anchor))

  def conn(self, text: str):
    self.words.append(Word(text))


# -- English
_EN_ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
            "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
            "eighteen", "nineteen"]
_EN_TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def _en_group(b: _Builder, v: int, g: int, n: int):
  h, r = divmod(v, 100)
  if h:
    b.num(h, 3 * g + 2, _EN_ONES[h])
    b.scale("hundred", 3 * g + 2)
  if 0 < r < 20:
    b.num(r, 3 * g, _EN_ONES[r])
  elif r:
    t, u = divmod(r, 10)
    b.num(10 * t, 3 * g, _EN_TENS[t])
    if u:
      b.num(u, 3 * g, _EN_ONES[u])
  if g:
    b.scale(("thousand", "million")[g - 1], 3 * g)


# -- French
_FR_ONES = ["zéro", "un", "deux", "trois", "quatre", "cinq", "six", "sept", "huit", "neuf", "dix",
            "onze", "douze", "treize", "quatorze", "quinze", "seize"]
_FR_TENS = ["", "", "vingt", "trente", "quarante", "cinquante", "soixante"]


def _fr_below_20(b: _Builder, r: int, s: int):
  if r <= 16:
    b.num(r, s, _FR_ONES[r])
  else:  # 17..19: dix-sept
    b.num(10, s, "dix")
    b.num(r - 10, s, _FR_ONES[r - 10])


def _fr_group(b: _Builder, v: int, g: int, n: int):
  h, r = divmod(v, 100)
  plural_ok = g != 1  # "cents"/"vingts" stay singular before "mille", take -s at the end or before "millions"
  s = 3 * g
  if h == 1:
    b.num(1, s + 2, "cent", anchor=s + 2)
  elif h:
    b.num(h, s + 2, _FR_ONES[h])
    b.scale("cents" if r == 0 and plural_ok else "cent", s + 2)
  if g == 1 and v == 1:  # "mille", not "un mille"
    b.num(1, s, "mille", anchor=s)
    return
  if 0 < r < 20:
    _fr_below_20(b, r, s)
  elif 20 <= r < 70:
    t, u = divmod(r, 10)
    b.num(10 * t, s, _FR_TENS[t])
    if u == 1:
      b.conn("et")
    if u:
      b.num(u, s, _FR_ONES[u])
  elif 70 <= r < 80:
    b.num(60, s, "soixante")
    if r == 71:
      b.conn("et")
    _fr_below_20(b, r - 60, s)
  elif r >= 80:
    b.num(80, s, "quatre", "vingts" if r == 80 and plural_ok else "vingt")
    if r > 80:
      _fr_below_20(b, r - 80, s)
  if g == 1:
    b.scale("mille", s)
  elif g == 2:
    b.scale("million" if v == 1 else "millions", s)


# -- German
_DE_ONES = ["null", "eins", "zwei", "drei", "vier", "fünf", "sechs", "sieben", "acht", "neun", "zehn",
            "elf", "zwölf", "dreizehn", "vierzehn", "fünfzehn", "sechzehn", "siebzehn", "achtzehn",
            "neunzehn"]
_DE_TENS = ["", "", "zwanzig", "dreißig", "vierzig", "fünfzig", "sechzig", "siebzig", "achtzig",
            "neunzig"]


def _de_group(b: _Builder, v: int, g: int, n: int):
  h, r = divmod(v, 100)
  s = 3 * g
  if h:
    b.num(h, s + 2, "ein" if h == 1 else _DE_ONES[h])
    b.scale("hundert", s + 2)
  if r == 1:
    # "eins" only when it ends the number; "ein tausend", "eine Million"
    b.num(1, s, "eins" if g == 0 else ("ein" if g == 1 else "eine"))
  elif 0 < r < 20:
    b.num(r, s, _DE_ONES[r])
  elif r:
    t, u = divmod(r, 10)
    if u:
      b.num(u, s, "ein" if u == 1 else _DE_ONES[u])
      b.conn("und")
    b.num(10 * t, s, _DE_TENS[t])
  if g == 1:
    b.scale("tausend", s)
  elif g == 2:
    b.scale("Million" if v == 1 else "Millionen", s)


_GROUP_FNS = {"en": _en_group, "fr": _fr_group, "de": _de_group}
_ZERO = {"en": "zero", "fr": "zéro", "de": "null"}


def number_words(n: int, lang: str) -> tuple[list[Word], list[Term]]:
  """The words of `n` in `lang` with their terms; the terms sum to n (checked)."""
  if lang not in _GROUP_FNS:
    raise ValueError(f"numbers: unsupported language {lang!r}; supported: {', '.join(LANGUAGES)}")
  if not 0 <= n <= MAX_NUMBER:
    raise ValueError(f"numbers: {n} outside 0..{MAX_NUMBER}")
  b = _Builder()
  if n == 0:
    b.num(0, 0, _ZERO[lang])
    return b.words, b.terms
  groups = [(n // 10**6) % 1000, (n // 10**3) % 1000, n % 1000]
  for g, v in zip((2, 1, 0), groups):
    if v:
      _GROUP_FNS[lang](b, v, g, n)
  total = sum(t.value * 10**t.shift for t in b.terms)
  assert total == n, (n, lang, b.words, b.terms)
  return b.words, b.terms


def _digit_at(term: Term, p: int) -> int | None:
  """Digit of term.value * 10**term.shift at position p, or None where the term writes nothing."""
  k = p - term.shift
  if k < 0:
    return None
  if term.value == 0:
    return 0 if k == 0 else None
  if 10**k > term.value:
    return None
  return (term.value // 10**k) % 10


def digit_alignment(n: int, words: list[Word], terms: list[Term]) -> list[list[int]]:
  """For each digit of str(n), left to right, the indices of the words it aligns to (see module doc)."""
  digits = str(n)
  out = []
  for t, ch in enumerate(digits):
    p = len(digits) - 1 - t
    d = int(ch)
    term_digit = [(_digit_at(terms[w.term], p) if w.term is not None else None) for w in words]
    if d:
      src = [i for i, x in enumerate(term_digit) if x]
    else:
      src = [i for i, x in enumerate(term_digit) if x == 0]
      if not src:
        above = [w.anchor for w in words if w.anchor is not None and w.anchor > p]
        if above:
          a = min(above)
          src = [i for i, w in enumerate(words) if w.anchor == a]
    out.append(src)
  return out
