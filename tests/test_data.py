"""Tests of attn.data: tokenization, built-in tasks and their alignments, corpora and bad input,
named TFDS datasets (mock_data), the bucketed pipeline, and the shared corpora.

The shared corpora are read from $ATTN_SHARED_DATA or ../shared/data (relative to the repository
root); the tests that need them skip with a message when that directory is absent.
"""

from __future__ import annotations

import datetime
import gzip
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from attn import data
from attn.data import bucketing, builtin_tasks, corpora, numwords
from attn.data.config import DataConfig
from data_configs import corpus_config
from experiments.configs import data as data_presets
from attn.data.tokenize import (JOINER, TokenizerSpec, Vocab, build_vocab, load_vocab,
                                normalize_whitespace, word_detokenize, word_tokenize)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.environ.get(data_presets.SHARED_DATA_ENV, os.path.join(REPO, "..", "shared", "data"))
MULTI30K = os.path.join(SHARED, "multi30k")
AESLC = os.path.join(SHARED, "aeslc")
needs_multi30k = pytest.mark.skipif(
    not os.path.isdir(MULTI30K), reason=f"shared corpora absent: no {MULTI30K} (set $ATTN_SHARED_DATA)")
needs_aeslc = pytest.mark.skipif(
    not os.path.isdir(AESLC), reason=f"shared corpora absent: no {AESLC} (set $ATTN_SHARED_DATA)")

# Padding bound for a bucketed Multi30k training epoch with the default buckets (8 shapes, widths in
# multiples of 4). Measured 13.6% (docs/data.md); unbucketed it is ~70%.
MULTI30K_PADDING_BOUND = 0.16


def small(preset: str, tmp, **overrides):
  cfg = data_presets.get_config(preset)
  cfg.cache_dir = str(tmp)
  for k, v in overrides.items():
    setattr(cfg, k, v)
  return cfg


def write_lines(path, lines, gz=False):
  blob = "".join(l + "\n" for l in lines).encode("utf-8")
  with (gzip.open(path, "wb") if gz else open(path, "wb")) as f:
    f.write(blob)


def parallel_corpus(tmp, train_src, train_tgt, *, gz=True, extra_splits=True):
  """A tiny corpus dir with train (given), val and test_2016_flickr (fixed) in de/en."""
  d = tmp / "corpus"
  d.mkdir(exist_ok=True)
  suffix = ".gz" if gz else ""
  write_lines(d / f"train.de{suffix}", train_src, gz)
  write_lines(d / f"train.en{suffix}", train_tgt, gz)
  if extra_splits:
    for split in ("val", "test_2016_flickr"):
      write_lines(d / f"{split}.de{suffix}", ["ein Hund .", "zwei Katzen ."], gz)
      write_lines(d / f"{split}.en{suffix}", ["a dog .", "two cats ."], gz)
  return d


def text_config(tmp, d, **overrides):
  return corpus_config("multi30k", tmp, d, **{"min_freq": 1, "num_buckets": 2, **overrides})


# ---------------------------------------------------------------------------------------------
# tokenization and vocabularies


def test_word_tokenizer_marks_joins_and_inverts():
  s = 'Ein Mann, der "Hallo" sagt: l\'eau.'
  toks = word_tokenize(s)
  J = JOINER
  assert toks == ["Ein", "Mann", J + ",", "der", '"' + J, "Hallo", J + '"', "sagt", J + ":", "l",
                  J + "'" + J, "eau", J + "."]
  assert word_detokenize(toks) == s


_TEXT = st.text(alphabet=st.sampled_from(list("abcXYZ019 .,;:'\"-()!?éüßж日本\t\u00a0")),
                max_size=60)


@settings(max_examples=300, deadline=None)
@given(_TEXT)
def test_tokenize_detokenize_round_trip(text):
  text = normalize_whitespace(text)
  for kind in ("word", "space", "char"):
    v = Vocab([], TokenizerSpec(kind))
    assert v.detokenize(v.tokenize(text)) == text, kind


@settings(max_examples=100, deadline=None)
@given(st.lists(_TEXT, min_size=1, max_size=8))
def test_vocab_decode_inverts_encode_for_known_tokens(texts):
  texts = [normalize_whitespace(t) for t in texts]
  for kind in ("word", "char"):
    v = build_vocab(texts, TokenizerSpec(kind), min_freq=1)
    for t in texts:
      ids = v.encode(t)
      assert data.UNK not in ids
      assert v.decode(ids + [data.EOS, 7, 9]) == t  # stops at EOS
      assert v.decode([data.BOS] + ids + [data.PAD, data.PAD]) == t  # skips BOS and PAD


def test_vocab_specials_limits_and_persistence(tmp_path):
  texts = ["a b b c c c", "c d"]
  v = build_vocab(texts, TokenizerSpec("space"), min_freq=2)
  assert [v.id_to_token(i) for i in range(4)] == list(data.SPECIAL_TOKENS)
  assert (data.PAD, data.BOS, data.EOS, data.UNK) == (0, 1, 2, 3)
  assert v.tokens == ["c", "b"]  # frequency order; a and d are below min_freq
  assert v.encode("c a b") == [4, data.UNK, 5]
  assert v.decode([4, data.UNK, 5]) == "c <unk> b"
  assert len(build_vocab(texts, TokenizerSpec("space"), max_size=5)) == 5  # cap incl. specials
  path = tmp_path / "vocab.json"
  v.save(str(path))
  w = load_vocab(str(path))
  assert w.tokens == v.tokens and w.spec == v.spec and w.fingerprint() == v.fingerprint()
  lower = build_vocab(["The Dog"], TokenizerSpec("word", lowercase=True))
  assert lower.decode(lower.encode("THE DOG")) == "the dog"


def test_sentencepiece_vocab(tmp_path):
  pytest.importorskip("sentencepiece", reason="optional: pip install sentencepiece==0.2.3")
  texts = [f"the {w} sat on the mat near {n} dogs ." for w in ("cat", "dog", "bird") for n in range(40)]
  v = build_vocab(texts, TokenizerSpec("sentencepiece"), max_size=60)
  assert [v.id_to_token(i) for i in range(4)] == list(data.SPECIAL_TOKENS)
  for t in texts[:10]:
    ids = v.encode(t)
    assert min(ids) > data.UNK
    assert v.decode([data.BOS] + ids + [data.EOS, 9]) == t
  v.save(str(tmp_path / "sp.json"))
  w = load_vocab(str(tmp_path / "sp.json"))
  assert w.encode(texts[0]) == v.encode(texts[0])
  assert build_vocab(texts, TokenizerSpec("sentencepiece"), max_size=60).fingerprint() == v.fingerprint()


def test_sentencepiece_through_the_pipeline(tmp_path):
  pytest.importorskip("sentencepiece", reason="optional: pip install sentencepiece==0.2.3")
  src = [f"der Hund {i} läuft über die Wiese ." for i in range(60)]
  tgt = [f"the dog {i} runs across the meadow ." for i in range(60)]
  d = parallel_corpus(tmp_path, src, tgt)
  cfg = text_config(tmp_path, d, tokenizer="sentencepiece", vocab_size=64, shared_vocab=True)
  work = tmp_path / "work"
  b = data.load(cfg, str(work))
  assert b.src_vocab is b.tgt_vocab and os.path.exists(work / "vocab.shared.json")
  ids = b.tgt_vocab.encode(tgt[7])
  assert b.tgt_vocab.decode(ids) == tgt[7]
  again = data.load(cfg, str(work))
  assert again.src_vocab.encode(src[3]) == b.src_vocab.encode(src[3])


# ---------------------------------------------------------------------------------------------
# built-in tasks: alignments on hand-checked examples


def test_reverse_batches_have_antidiagonal_alignment(tmp_path):
  cfg = small("smoke", tmp_path, min_len=4, max_len=4, eval_min_len=4, eval_max_len=4,
              task_vocab_size=6, train_size=40, eval_size=8, test_size=8)
  bundle = data.load(cfg)
  batch = next(bundle.train_iter())
  ts, tt = batch["src"].shape[1], batch["tgt"].shape[1]
  assert batch["alignments"].shape == (batch["src"].shape[0], tt, ts)
  expected = np.zeros((tt, ts), np.float32)
  for t in range(4):
    expected[t, 3 - t] = 1.0  # target t comes from source L-1-t
  expected[4, 4] = 1.0  # EOS -> EOS
  for i in range(batch["src"].shape[0]):
    assert batch["src_lengths"][i] == batch["tgt_lengths"][i] == 5
    np.testing.assert_array_equal(batch["tgt"][i, :4], batch["src"][i, 3::-1])
    assert batch["src"][i, 4] == batch["tgt"][i, 4] == data.EOS
    np.testing.assert_array_equal(batch["alignments"][i], expected)


def test_copy_alignment_is_identity_and_tasks_are_deterministic():
  t = builtin_tasks.builtin_task(DataConfig(task="copy", seed=3))
  ex = t.example("train", 0)
  n = len(ex.src.split())
  np.testing.assert_array_equal(ex.align, np.stack([np.arange(n), np.arange(n)], 1))
  assert ex.src == ex.tgt
  again = builtin_tasks.builtin_task(DataConfig(task="copy", seed=3)).example("train", 0)
  other = builtin_tasks.builtin_task(DataConfig(task="copy", seed=4)).example("train", 0)
  assert again.src == ex.src and other.src != ex.src


def _rows(ex):
  rows = [[] for _ in range(len(ex.tgt))]
  for t, s in ex.align:
    rows[t].append(int(s))
  return rows


def _date_pattern(task, locale, pattern):
  return next(p for p in task.patterns if p.locale == locale and p.pattern == pattern)


def test_dates_hand_written_alignments():
  task = builtin_tasks.builtin_task(DataConfig(task="dates"))
  d = datetime.date(2009, 6, 25)
  ex = task.example_for(d, _date_pattern(task, "fr_FR", "EEEE d MMMM y"))
  assert (ex.src, ex.tgt) == ("jeudi 25 juin 2009", "2009-06-25")
  juin = [9, 10, 11, 12]
  assert _rows(ex) == [[14], [15], [16], [17], [], juin, juin, [], [6], [7]]

  ex = task.example_for(d, _date_pattern(task, "en_US", "M/d/yy"))
  assert ex.src == "6/25/09"
  # "20" of the year is not written: it aligns to the whole 2-digit field; "0" of "06" to the "6"
  assert _rows(ex) == [[5, 6], [5, 6], [5], [6], [], [0], [0], [], [2], [3]]

  ex = task.example_for(datetime.date(2009, 6, 5), _date_pattern(task, "ja_JP", "y年M月d日"))
  assert ex.src == "2009年6月5日"
  assert _rows(ex) == [[0], [1], [2], [3], [], [5], [5], [], [7], [7]]

  ex = task.example_for(d, _date_pattern(task, "de_DE", "dd.MM.yy"))
  assert ex.src == "25.06.09"
  assert _rows(ex) == [[6, 7], [6, 7], [6], [7], [], [3], [4], [], [0], [1]]


def test_dates_never_ambiguous_and_month_names_unambiguous():
  task = builtin_tasks.builtin_task(DataConfig(task="dates"))
  # en_US reads "10/11/2009" as October 11, en_GB/fr as 10 November: such strings are never made
  assert task.readings("10/11/2009") == {datetime.date(2009, 10, 11), datetime.date(2009, 11, 10)}
  numeric = 0
  for i in range(3000):
    ex = task.example("train", i)
    date = datetime.date.fromisoformat(ex.tgt)
    readings = task.readings(ex.src)
    assert readings <= {date}, ex.src
    numeric += bool(readings)
    assert builtin_tasks.role_of_key(ex.key) == "train"
  assert numeric > 500  # numeric formats are common, and each reads back as its own date
  # across the default locales a month name never names two months
  months = {}
  for loc in task.locales.values():
    for ctx in ("format", "stand-alone"):
      for width in ("abbreviated", "wide"):
        for m, name in loc.months[ctx][width].items():
          assert months.setdefault(name, m) == m, name


def _words_to_number(words: list[str], lang: str) -> int:
  """An independent reader of number words (the oracle for numwords)."""
  ones = {"en": numwords._EN_ONES, "fr": numwords._FR_ONES, "de": numwords._DE_ONES}[lang]
  tens = {"en": numwords._EN_TENS, "fr": numwords._FR_TENS, "de": numwords._DE_TENS}[lang]
  value = {w: i for i, w in enumerate(ones)}
  value.update({w: 10 * i for i, w in enumerate(tens) if w})
  value.update({"ein": 1, "eine": 1})
  total = cur = 0  # total: finished thousands/millions; cur: the group being read
  prev = None
  for w in words:
    if w in ("et", "und"):
      prev = w  # connectors ("soixante et onze", "sieben und neunzig") add nothing
      continue
    if w in ("vingt", "vingts") and prev == "quatre":
      cur += 80 - 4  # quatre-vingt = 4 x 20
    elif w in ("hundred", "cent", "cents", "hundert"):
      cur = (cur or 1) * 100  # hundreds open a group, so cur is the multiplier
    elif w in ("thousand", "mille", "tausend"):
      total, cur = total + (cur or 1) * 1000, 0
    elif w in ("million", "millions", "Million", "Millionen"):
      total, cur = total + cur * 10**6, 0
    else:
      cur += value[w]
    prev = w
  return total + cur


def test_numbers_hand_checked_alignments():
  def rows(n, lang):
    words, terms = numwords.number_words(n, lang)
    return [w.text for w in words], [[words[i].text for i in r]
                                     for r in numwords.digit_alignment(n, words, terms)]

  assert rows(97, "fr") == (["quatre", "vingt", "dix", "sept"],
                            [["quatre", "vingt", "dix"], ["sept"]])
  assert rows(97, "de") == (["sieben", "und", "neunzig"], [["neunzig"], ["sieben"]])  # reordered
  assert rows(71, "fr") == (["soixante", "et", "onze"], [["soixante", "onze"], ["onze"]])
  assert rows(2007, "en")[1] == [["two"], ["thousand"], ["thousand"], ["seven"]]
  assert rows(342107, "en") == ("three hundred forty two thousand one hundred seven".split(),
                                [["three"], ["forty"], ["two"], ["one"], ["hundred"], ["seven"]])
  assert rows(200, "fr")[0] == ["deux", "cents"] and rows(200000, "fr")[0] == ["deux", "cent", "mille"]
  assert rows(1001001, "de")[0] == ["eine", "Million", "ein", "tausend", "eins"]


@settings(max_examples=300, deadline=None)
@given(st.integers(0, numwords.MAX_NUMBER), st.sampled_from(numwords.LANGUAGES))
def test_numbers_words_read_back_and_every_digit_aligned(n, lang):
  words, terms = numwords.number_words(n, lang)
  assert _words_to_number([w.text for w in words], lang) == n
  rows = numwords.digit_alignment(n, words, terms)
  assert len(rows) == len(str(n)) and all(rows)


def test_builtin_splits_are_held_out_and_sizes_exact(tmp_path):
  for preset in ("dates", "numbers", "copy"):
    cfg = small(preset, tmp_path, train_size=600, eval_size=50, test_size=50)
    bundle = data.load(cfg)
    train = set(bundle.references("train"))
    for role in ("eval", "test"):
      refs = bundle.references(role)
      assert len(refs) == 50
      assert not train & set(refs), preset  # targets are the held-out keys (string, date, number)
    assert bundle.has_alignments and len(bundle.splits["train"]) == 600


# ---------------------------------------------------------------------------------------------
# pipeline: determinism, resume, fixed shapes, one exact eval pass


@pytest.fixture(scope="module")
def dates_bundle(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("dates")
  return data.load(small("dates", tmp, train_size=3000, batch_size=32), str(tmp / "work"))


def _take(it, n):
  return [next(it) for _ in range(n)]


def test_same_seed_same_batches_and_resume(dates_bundle, tmp_path):
  b = dates_bundle
  first = _take(b.train_iter(), 2 * b.steps_per_epoch + 3)  # crosses two epoch boundaries
  # a fresh cache, and batches made in the caller's thread instead of grain threads
  again = data.load(small("dates", tmp_path, train_size=3000, batch_size=32, num_threads=0))
  for x, y in zip(first, _take(again.train_iter(), len(first))):
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])
  k = b.steps_per_epoch - 2
  for x, y in zip(first[k:], _take(b.train_iter(start_step=k), 5)):
    np.testing.assert_array_equal(x["example_id"], y["example_id"])
  other = data.load(small("dates", tmp_path, train_size=3000, batch_size=32, seed=1))
  assert not np.array_equal(next(other.train_iter())["src"], first[0]["src"])
  # each epoch visits every training example, in a different order
  e0 = np.concatenate([x["example_id"] for x in first[:b.steps_per_epoch]])
  e1 = np.concatenate([x["example_id"] for x in first[b.steps_per_epoch:2 * b.steps_per_epoch]])
  assert set(e0) == set(e1) == set(range(3000))
  assert not np.array_equal(e0[:100], e1[:100])


def test_fixed_shapes_per_bucket_and_exact_eval_pass(dates_bundle):
  b = dates_bundle
  allowed = {(bs, ts, tt) for bs, (ts, tt) in zip(b.train_batch_sizes, b.shapes)}
  seen = set()
  for x in _take(b.train_iter(), b.steps_per_epoch):
    seen.add((x["src"].shape[0], x["src"].shape[1], x["tgt"].shape[1]))
    assert (x["src_lengths"] > 0).all()
  assert seen <= allowed and len(b.shapes) <= b.config.num_buckets
  for role in ("eval", "test"):
    ids = []
    for x in b.batches(role):
      assert (x["src"].shape[0], x["src"].shape[1], x["tgt"].shape[1]) in allowed
      real = x["example_id"] >= 0
      ids.extend(x["example_id"][real].tolist())
      # padding rows: no tokens, no lengths, no alignment mass
      assert (x["src"][~real] == data.PAD).all() and (x["src_lengths"][~real] == 0).all()
      assert (x["alignments"][~real] == 0).all()
      # padded positions are PAD, EOS is the last real token, aligned rows sum to 1
      for i in np.flatnonzero(real):
        sl, tl = x["src_lengths"][i], x["tgt_lengths"][i]
        assert x["src"][i, sl - 1] == x["tgt"][i, tl - 1] == data.EOS
        assert (x["src"][i, sl:] == data.PAD).all() and (x["tgt"][i, tl:] == data.PAD).all()
        sums = x["alignments"][i].sum(1)
        assert np.allclose(sums[sums > 0], 1.0) and (sums[tl:] == 0).all()
        assert (x["alignments"][i][:, sl:] == 0).all()
    assert sorted(ids) == list(range(len(b.references(role))))


def test_bucket_choice_and_padding_accounting():
  rng = np.random.default_rng(0)
  s = rng.integers(2, 40, 5000)
  t = np.clip(s + rng.integers(-3, 4, 5000), 2, None)
  shapes = bucketing.choose_buckets(s, t, 6, 4)
  assert len(shapes) <= 6 and max(shapes) >= (int(s.max()), 0)
  k = bucketing.assign(s, t, shapes)
  ts, tt = np.asarray(shapes)[k].T
  assert (ts >= s).all() and (tt >= t).all()
  one = bucketing.padding_fraction(bucketing.eval_plan(np.zeros(5000, np.int32), [50], [shapes[-1]], s, t),
                                   [shapes[-1]], s, t)
  many = bucketing.padding_fraction(bucketing.eval_plan(k, [50] * len(shapes), shapes, s, t), shapes, s, t)
  assert many < one / 2
  # a batch of widths (4, 4) holding lengths 1 and 3, plus one filler row: 1 - 4/12 padding
  assert bucketing.padding_fraction([(0, np.array([0, 1, -1]))], [(4, 4)], np.array([1, 3]),
                                    np.array([1, 3])) == pytest.approx(1 - 8 / 24)


def test_train_epoch_batches_are_the_batches_train_iter_reads(tmp_path):
  cfg = small("numbers", tmp_path, train_size=400, eval_size=20, test_size=20,
              bucket_boundaries=((8, 4), (12, 8), (24, 12)), tokens_per_batch=360)
  b = data.load(cfg)
  sp = b.splits["train"]
  plan = b.train_epoch_batches(0)
  assert len(plan) == b.steps_per_epoch
  for (ts, tt, rows), x in zip(plan, _take(b.train_iter(), b.steps_per_epoch)):
    assert x["src"].shape == (rows.size, ts) and x["tgt"].shape == (rows.size, tt)
    np.testing.assert_array_equal(x["tgt_lengths"], sp.tgt_len[rows])
    np.testing.assert_array_equal(x["src_lengths"], sp.src_len[rows])


def test_unbucketed_batches_hold_every_example_once_padded_to_their_longest():
  rng = np.random.default_rng(1)
  s, t = rng.integers(1, 30, 103), rng.integers(1, 20, 103)
  batches = bucketing.unbucketed_batches(s, t, 10, np.random.default_rng(0))
  assert [r.size for _, _, r in batches] == [10] * 10 + [3]
  np.testing.assert_array_equal(np.sort(np.concatenate([r for _, _, r in batches])), np.arange(103))
  for ts, tt, rows in batches:
    assert ts == max(s[i] for i in rows) and tt == max(t[i] for i in rows)


def test_explicit_buckets_and_token_budget(tmp_path):
  cfg = small("numbers", tmp_path, train_size=400, eval_size=20, test_size=20,
              bucket_boundaries=((8, 4), (12, 8), (24, 12)), tokens_per_batch=360)
  b = data.load(cfg)
  assert b.shapes == [(8, 4), (12, 8), (24, 12)]
  assert b.train_batch_sizes == [30, 18, 10]  # 360 // (Ts + Tt)
  for x in _take(b.train_iter(), 3 * b.steps_per_epoch):
    k = b.shapes.index((x["src"].shape[1], x["tgt"].shape[1]))
    assert x["src"].shape[0] == b.train_batch_sizes[k]
  cfg = small("numbers", tmp_path, bucket_boundaries=(8, 16))  # widths: square buckets
  assert DataConfig.from_config(cfg).bucket_boundaries == ((8, 8), (16, 16))
  with pytest.raises(data.DataError, match=r"widest on both sides \(add \(24, 12\)\)"):
    DataConfig.from_config(small("numbers", tmp_path, bucket_boundaries=((24, 8), (12, 12))))


# ---------------------------------------------------------------------------------------------
# local corpora and bad input


def test_parallel_text_plain_files_and_policies(tmp_path):
  src = ["ein Hund .", "", "  ", "eins zwei drei vier fünf sechs sieben acht neun", "die Katze ."]
  tgt = ["a dog .", "x", "y", "one two three", "the cat ."]
  d = parallel_corpus(tmp_path, src, tgt, gz=False)
  bundle = data.load(text_config(tmp_path, d, max_src_len=6))
  c = bundle.splits["train"].counts
  assert (c["read"], c["kept"], c["dropped_empty"], c["dropped_long"]) == (5, 2, 2, 1)
  assert bundle.splits["train"].record.tolist() == [0, 4]

  bundle = data.load(text_config(tmp_path, d, max_src_len=6, too_long="truncate"))
  sp = bundle.splits["train"]
  assert sp.counts["truncated"] == 1 and sp.src_len.max() == 6
  batches = list(bundle.batches("train"))
  long_row = [(x, i) for x in batches for i in range(len(x["example_id"])) if x["example_id"][i] == 3]
  x, i = long_row[0]
  assert bundle.src_vocab.decode(x["src"][i]) == "eins zwei drei vier fünf"

  with pytest.raises(data.DataError, match=r"pair 3 \(line 4\).*too_long"):
    data.load(text_config(tmp_path, d, max_src_len=6, too_long="error"))
  with pytest.raises(data.DataError, match=r"pair 1 \(line 2\) has an empty side \(2 such"):
    data.load(text_config(tmp_path, d, empty="error"))


def test_eval_split_keeps_every_pair(tmp_path):
  d = parallel_corpus(tmp_path, ["ein Hund ."] * 3, ["a dog ."] * 3)
  write_lines(d / "val.de.gz", ["ein Hund .", "", "ein sehr sehr sehr langer Satz ."], gz=True)
  write_lines(d / "val.en.gz", ["a dog .", "nothing", "a long sentence ."], gz=True)
  bundle = data.load(text_config(tmp_path, d, max_src_len=4))
  sp = bundle.splits["eval"]
  assert sp.counts["kept"] == 3 and sp.counts["truncated"] == 1
  assert sorted(sp.src_len.tolist()) == [1, 4, 4]  # the empty source is just EOS
  assert bundle.references("eval") == ["a dog .", "nothing", "a long sentence ."]


def test_mismatched_line_counts_name_both_files(tmp_path):
  d = parallel_corpus(tmp_path, [f"satz {i}" for i in range(100)], [f"line {i}" for i in range(97)])
  with pytest.raises(data.DataError) as err:
    data.load(text_config(tmp_path, d))
  msg = str(err.value)
  assert "train.de.gz has 100 lines" in msg and "train.en.gz has 97" in msg
  assert len(msg.splitlines()) == 1


def test_undecodable_bytes_name_file_and_line(tmp_path):
  d = parallel_corpus(tmp_path, ["ein Hund ."] * 3, ["a dog ."] * 3)
  with gzip.open(d / "train.en.gz", "wb") as f:
    f.write(b"a dog .\nthe \xff cat\na bird\n")
  with pytest.raises(data.DataError, match=r"train\.en\.gz:2: not valid UTF-8 \(byte 0xff at column 5\)"):
    data.load(text_config(tmp_path, d))


def test_lines_split_on_newline_only(tmp_path):
  path = tmp_path / "odd.de"
  path.write_bytes("\ufeffa\u2028b\n\x0cc  d\r\nlast".encode("utf-8"))  # BOM, LS, FF, CRLF, no final \n
  assert list(corpora.read_lines(str(path))) == ["a b", "c d", "last"]
  assert corpora.count_lines(str(path)) == 3  # str.splitlines would see 5


def test_missing_files_and_bad_config(tmp_path):
  d = parallel_corpus(tmp_path, ["a"], ["b"], extra_splits=False)
  with pytest.raises(data.DataError, match=r"no file val\.de\[\.gz\] in .*train\.de\.gz"):
    data.load(text_config(tmp_path, d))
  with pytest.raises(data.DataError, match=r"unknown data.task 'cpoy'; known: copy, dates"):
    data.load(text_config(tmp_path, d, task="cpoy"))
  with pytest.raises(data.DataError, match="too_long='cut'"):
    data.load(text_config(tmp_path, d, too_long="cut"))
  with pytest.raises(data.DataError, match="unknown data config fields"):
    DataConfig.from_config({"taks": "copy"})
  with pytest.raises(data.DataError, match="unknown data preset"):
    data_presets.get_config("multi30")



def test_every_builtin_task_is_a_data_source_and_unknown_names_list_the_known():
  from attn.data import tfds_sources  # pylint: disable=import-outside-toplevel

  assert builtin_tasks.BUILTIN_TASKS.names() == ["copy", "dates", "numbers", "reverse"]
  assert set(data.SOURCES.names()) == {*builtin_tasks.BUILTIN_TASKS.names(), "jsonl",
                                       "parallel_text", "tfds"}
  assert data.SOURCES.get("reverse").name == "reverse"
  with pytest.raises(data.DataError, match=r"unknown built-in task 'cpoy'; known: copy, dates, "
                     r"numbers, reverse$"):
    builtin_tasks.builtin_task(DataConfig(task="cpoy"))
  with pytest.raises(ValueError, match="already registered"):
    builtin_tasks.register_builtin_task("copy")(type("Again", (), {}))
  assert builtin_tasks.BUILTIN_TASKS.get("copy") is builtin_tasks.CopyTask
  with pytest.raises(data.DataError, match=r"TFDS dataset 'c4/en' is not one of aeslc, .*xsum: "
                     "set data.source_field"):
    tfds_sources.fields_for("c4/en", "", "", "", "")
  assert tfds_sources.fields_for("xsum:1.1.0", "", "", "", "") == ("document", "summary")


def test_tokenizers_are_registered_and_only_sentencepiece_is_learned():
  assert data.TOKENIZERS.names() == ["char", "sentencepiece", "space", "word"]
  assert [TokenizerSpec(n).learned for n in data.TOKENIZERS.names()] == [False, True, False, False]
  with pytest.raises(data.DataError, match=r"unknown tokenizer 'bpe'; known: char, sentencepiece, "
                     r"space, word$"):
    TokenizerSpec("bpe")
  with pytest.raises(data.DataError, match="use SentencePieceVocab for sentencepiece"):
    data.Vocab(["a"], TokenizerSpec("sentencepiece"))

def test_missing_data_dir_and_missing_jsonl_split(tmp_path):
  with pytest.raises(data.DataError, match=r"data directory '.*nowhere' does not exist \(set data\.dir"):
    data.load(text_config(tmp_path, tmp_path / "nowhere"))
  d = tmp_path / "mail"
  d.mkdir()
  write_lines(d / "train.jsonl", [json.dumps({"email": "hi", "subject": "yo"})])
  with pytest.raises(data.DataError, match=r"no file dev\.jsonl\[\.gz\] in .*mail \(it holds: train\.jsonl\)"):
    data.load(text_config(tmp_path, d, task="jsonl", source_field="email", target_field="subject",
                          eval_split="dev", test_split=""))


@pytest.mark.parametrize("split", ["train", "val"])
@pytest.mark.parametrize("gz", [False, True])
def test_empty_parallel_files_are_a_data_error_naming_them(tmp_path, split, gz):
  # Before: TFDS's `AssertionError: Failed to finalize writing of split "train": No examples
  # were yielded.` with a traceback.
  d = parallel_corpus(tmp_path, ["ein Hund ."], ["a dog ."], gz=gz)
  suffix = ".gz" if gz else ""
  write_lines(d / f"{split}.de{suffix}", [], gz)
  write_lines(d / f"{split}.en{suffix}", [], gz)
  with pytest.raises(data.DataError) as err:
    data.load(text_config(tmp_path, d))
  msg = str(err.value)
  assert f"{split}.de{suffix} and " in msg and f"{split}.en{suffix}: empty (no sentence pairs)" in msg
  assert len(msg.splitlines()) == 1


def test_empty_jsonl_is_a_data_error_naming_it(tmp_path):
  d = tmp_path / "mail"
  d.mkdir()
  write_lines(d / "train.jsonl", [])
  write_lines(d / "dev.jsonl", [json.dumps({"email": "hi", "subject": "yo"})])
  cfg = text_config(tmp_path, d, task="jsonl", source_field="email", target_field="subject",
                    eval_split="dev", test_split="")
  with pytest.raises(data.DataError, match=r"train\.jsonl: empty \(no records\)"):
    data.load(cfg)


def test_no_usable_pair_is_a_data_error_with_the_counts(tmp_path):
  # Every pair has an empty side: named with the count before TFDS writes anything.
  d = parallel_corpus(tmp_path, ["", "  ", "ein Hund ."], ["a", "b", ""], gz=False)
  with pytest.raises(data.DataError, match=r"train\.en: no usable sentence pair: all 3 have an "
                     r"empty source or target side"):
    data.load(text_config(tmp_path, d))
  d = tmp_path / "mail"
  d.mkdir()
  write_lines(d / "train.jsonl", [json.dumps({"email": "hi", "subject": " "})] * 2)
  cfg = text_config(tmp_path, d, task="jsonl", source_field="email", target_field="subject",
                    eval_split="", test_split="")
  with pytest.raises(data.DataError, match=r"train\.jsonl: no usable record: all 2 have an empty "
                     r"'email' or 'subject' field"):
    data.load(cfg)
  # Every pair too long (known only after tokenizing): the pipeline's policy check names the files.
  long_dir = tmp_path / "long"
  long_dir.mkdir()
  d = parallel_corpus(long_dir, ["eins zwei drei vier fünf"] * 2, ["one"] * 2, gz=False)
  with pytest.raises(data.DataError, match=r"train\.de \+ .*train\.en: no training example left "
                     r"after the policies: of 2 pairs, 0 have an empty side \(data.empty=drop\) and 2 "
                     r"are over max_src_len=3/max_tgt_len=128"):
    data.load(text_config(long_dir, d, max_src_len=3))


@pytest.mark.parametrize("n_src,n_tgt", [(5, 3), (3, 5)])
def test_check_parallel_counts_both_files_whichever_ends_first(tmp_path, n_src, n_tgt):
  write_lines(tmp_path / "a.de", [f"satz {i}" for i in range(n_src)])
  write_lines(tmp_path / "a.en", [f"line {i}" for i in range(n_tgt)])
  with pytest.raises(data.DataError, match=rf"a\.de has {n_src} lines, .*a\.en has {n_tgt}$"):
    corpora.check_parallel(str(tmp_path / "a.de"), str(tmp_path / "a.en"))


def test_jsonl_source_and_its_errors(tmp_path):
  d = tmp_path / "mail"
  d.mkdir()
  recs = [{"email": f"Hello team,  meeting {i} moved.", "subject": f"Meeting {i}"} for i in range(6)]
  write_lines(d / "train.jsonl.gz", [json.dumps(r) for r in recs], gz=True)
  write_lines(d / "dev.jsonl", [json.dumps(r) for r in recs[:2]])
  cfg = text_config(tmp_path, d, task="jsonl", source_field="email", target_field="subject",
                    eval_split="dev", test_split="")
  bundle = data.load(cfg)
  assert bundle.references("eval") == ["Meeting 0", "Meeting 1"]
  assert bundle.sources("eval")[1] == "Hello team, meeting 1 moved."  # whitespace collapsed
  assert "test" not in bundle.splits
  write_lines(d / "dev.jsonl", [json.dumps(recs[0]), "{not json", json.dumps(recs[1])])
  with pytest.raises(data.DataError, match=r"dev\.jsonl:2: not a JSON object"):
    data.load(cfg)
  write_lines(d / "dev.jsonl", [json.dumps(recs[0]), json.dumps({"email": "x", "subj": "y"})])
  with pytest.raises(data.DataError, match=r"dev\.jsonl:2: no field 'subject' \(fields: email, subj\)"):
    data.load(cfg)


def test_workdir_vocab_reused_and_checked(tmp_path):
  d = parallel_corpus(tmp_path, ["ein Hund .", "eine Katze ."], ["a dog .", "a cat ."])
  work = tmp_path / "work"
  first = data.load(text_config(tmp_path, d), str(work))
  stamp = os.path.getmtime(work / "vocab.src.json")
  # a resumed run sees other training text but keeps the saved ids
  write_lines(d / "train.de.gz", ["ganz neue Wörter ."] * 2, gz=True)
  again = data.load(text_config(tmp_path, d), str(work))
  assert again.src_vocab.tokens == first.src_vocab.tokens
  assert os.path.getmtime(work / "vocab.src.json") == stamp
  with pytest.raises(data.DataError, match="data.tokenizer=.word. there, .char. here"):
    data.load(text_config(tmp_path, d, tokenizer="char"), str(work))


# ---------------------------------------------------------------------------------------------
# named TFDS datasets (mocked: these machines cannot download)


@pytest.mark.parametrize("preset,fields", [("ted_pt_en", ("pt", "en")),
                                           ("cnn_dailymail", ("article", "highlights"))])
def test_named_tfds_datasets_with_mock_data(tmp_path, preset, fields):
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  from attn.data import tfds_sources  # pylint: disable=import-outside-toplevel

  cfg = small(preset, tmp_path, min_freq=1, batch_size=4, tfds_data_dir=str(tmp_path / "tfds"))
  with tfds.testing.mock_data(num_examples=12):
    bundle = data.load(cfg)
    tfds_sources.import_builder(cfg.tfds_name)
    raw = tfds.data_source(cfg.tfds_name, split="test", data_dir=cfg.tfds_data_dir)
    expected = [normalize_whitespace(_str(raw[i][fields[0]])) for i in range(3)]
    refs = [_str(raw[i][fields[1]]) for i in range(12)]
  assert [normalize_whitespace(s) for s in bundle.sources("test")[:3]] == expected
  assert bundle.references("test") == refs
  x = next(bundle.train_iter())
  assert x["src"].dtype == np.int32 and x["src"].shape[0] == 4 and "alignments" not in x
  assert sorted(i for x in bundle.batches("test") for i in x["example_id"] if i >= 0) == list(range(12))


def _str(v):
  return v.decode() if isinstance(v, bytes) else str(v)


def test_unprepared_tfds_dataset_is_a_clear_error(tmp_path):
  cfg = small("ted_pt_en", tmp_path, tfds_data_dir=str(tmp_path / "empty"))
  with pytest.raises(data.DataError, match="cannot open TFDS ted_hrlr_translate/pt_to_en.*tfds build"):
    data.load(cfg)


# ---------------------------------------------------------------------------------------------
# the shared corpora


@pytest.fixture(scope="module")
def multi30k(tmp_path_factory):
  if not os.path.isdir(MULTI30K):
    pytest.skip(f"shared corpora absent: no {MULTI30K} (set $ATTN_SHARED_DATA)")
  work = tmp_path_factory.mktemp("m30k")
  cfg = data_presets.get_config("multi30k")
  cfg.dir = MULTI30K
  return data.load(cfg, str(work))


@needs_multi30k
def test_multi30k_splits_direction_and_references(multi30k):
  b = multi30k
  assert {r: len(sp) for r, sp in b.splits.items()} == {"train": 29000, "eval": 1014, "test": 1000}
  with gzip.open(os.path.join(MULTI30K, "test_2016_flickr.en.gz"), "rt", encoding="utf-8") as f:
    refs = [l.rstrip("\n") for l in f]
  assert b.references("test") == [normalize_whitespace(r) for r in refs]
  assert b.sources("test")[0] == "Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt."
  # decode(encode(reference)) gives the reference back when its words are in the vocabulary
  known = [r for r in refs if data.UNK not in b.tgt_vocab.encode(r)]
  assert len(known) > 800
  assert all(b.tgt_vocab.decode(b.tgt_vocab.encode(r)) == normalize_whitespace(r) for r in known)


@needs_multi30k
def test_multi30k_bucketed_epoch_padding_under_bound(multi30k):
  b = multi30k
  frac = b.padding_fraction("train")
  assert frac < MULTI30K_PADDING_BOUND, frac
  # measured on real batches too: one epoch's PAD slots over all slots
  pad = slots = 0
  for x in _take(b.train_iter(), b.steps_per_epoch):
    slots += x["src"].size + x["tgt"].size
    pad += int((x["src"] == data.PAD).sum() + (x["tgt"] == data.PAD).sum())
  assert pad / slots == pytest.approx(frac, abs=1e-9)
  unbucketed = 1 - (b.splits["train"].src_len.sum() + b.splits["train"].tgt_len.sum()) / (
      29000 * (b.splits["train"].src_len.max() + b.splits["train"].tgt_len.max()))
  assert frac < unbucketed / 3


@needs_multi30k
def test_multi30k_en_de_direction(tmp_path):
  cfg = data_presets.get_config("multi30k_en_de")
  cfg.dir = MULTI30K
  cfg.cache_dir = str(tmp_path)
  cfg.train_split, cfg.eval_split = "val", ""  # small: val as training data
  b = data.load(cfg)
  assert b.sources("test")[0] == "A man in an orange hat starring at something."


@needs_aeslc
def test_aeslc_jsonl(tmp_path):
  cfg = data_presets.get_config("aeslc")
  cfg.dir = AESLC
  cfg.cache_dir = str(tmp_path)
  cfg.train_split = "dev"  # the 1,960 dev emails keep this test fast
  b = data.load(cfg)
  assert len(b.splits["train"]) == 1960 and b.src_vocab is b.tgt_vocab
  x = next(b.train_iter())
  assert x["src"].shape[1] <= 512 and x["tgt"].shape[1] <= 32


# ---------------------------------------------------------------------------------------------
# packaging


def test_import_attn_stays_light_and_stats_cli_runs(tmp_path):
  code = ("import sys, attn; from attn import data; "
          "heavy = [m for m in ('tensorflow_datasets', 'grain', 'babel', 'sentencepiece') if m in sys.modules]; "
          "assert not heavy, heavy")
  subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
  out = subprocess.run(
      [sys.executable, "-m", "experiments.data_stats", "--config=experiments/configs/data.py:smoke",
       "--config.cache_dir=" + str(tmp_path / "cache"), "--workdir=" + str(tmp_path / "work"),
       "--batches=20"], check=True, cwd=REPO, capture_output=True, text=True).stdout
  assert "batches/s" in out and "padding" in out
