"""Data and metrics for summarization: renamed jsonl fields, extra reference fields, source-extended
ids for copying models (pointer-generator) from local JSON lines and mocked TFDS datasets, and ROUGE
against several references."""

from __future__ import annotations

import gzip
import json
import sys

import numpy as np
import pytest

from attn import data
from attn.evaluation import metrics
from attn.data import corpora
from attn.data.base import BOS, EOS, PAD, UNK
from attn.data.config import DataConfig
from data_configs import corpus_config
from experiments.configs import data as data_presets


def write_jsonl(path, records):
  blob = "".join(json.dumps(r) + "\n" for r in records).encode("utf-8")
  with (gzip.open(path, "wb") if str(path).endswith(".gz") else open(path, "wb")) as f:
    f.write(blob)


def mail_config(tmp, d, **overrides):
  return corpus_config("aeslc", tmp, d, **{"num_buckets": 1, **overrides})


# ---------------------------------------------------------------------------------------------
# config: renamed fields, comma lists, validation


def test_renamed_fields_from_a_config_dict_and_from_an_old_record():
  cfg = data_presets.get_config("aeslc")
  assert (cfg.source_field, cfg.target_field) == ("email", "subject")
  with pytest.raises(AttributeError):
    cfg.src_field  # pylint: disable=pointless-statement
  cfg.source_field, cfg.target_field = "body", "title"
  dc = DataConfig.from_config(cfg)
  assert (dc.source_field, dc.target_field) == ("body", "title")
  # a run's config.json written before the rename still loads
  old = dict(cfg.to_dict())
  old["src_field"], old["tgt_field"] = old.pop("source_field"), old.pop("target_field")
  assert DataConfig.from_config(old).source_field == "body"
  with pytest.raises(data.DataError, match="src_field was renamed source_field"):
    DataConfig.from_config({**old, "source_field": "email"})


def test_tuple_options_take_a_comma_string_on_the_command_line(monkeypatch):
  from absl import flags  # pylint: disable=import-outside-toplevel
  from ml_collections import config_flags  # pylint: disable=import-outside-toplevel

  # ml_collections parses `--config.x=a,b` of a tuple field as ("a,b",); from_config splits it.
  argv = ["prog", "--config.reference_fields=ann0,ann1,ann2", "--config.languages=en,fr"]
  monkeypatch.setattr(sys, "argv", argv)  # config_flags reads the overrides from sys.argv
  fv = flags.FlagValues()
  config_flags.DEFINE_config_dict("config", data_presets.get_config("aeslc"), flag_values=fv)
  fv(argv)
  assert fv.config.reference_fields == ("ann0,ann1,ann2",)
  dc = DataConfig.from_config(fv.config)
  assert dc.reference_fields == ("ann0", "ann1", "ann2")
  assert dc.languages == ("en", "fr")
  blank = {**fv.config.to_dict(), "reference_fields": ""}
  assert DataConfig.from_config(blank).reference_fields == ()
  with pytest.raises(data.DataError, match="reference_fields=.* must be distinct field names"):
    DataConfig.from_config({**fv.config.to_dict(), "reference_fields": ("ann0", "ann0")})


def test_extended_vocab_needs_shared_vocab():
  cfg = data_presets.get_config("aeslc")
  cfg.extended_vocab, cfg.shared_vocab = True, False
  with pytest.raises(data.DataError, match="extended_vocab=True needs shared_vocab=True"):
    DataConfig.from_config(cfg)


# ---------------------------------------------------------------------------------------------
# reference fields


@pytest.fixture
def annotated(tmp_path):
  """train.jsonl.gz without annotations; dev.jsonl.gz with ann0..ann2 (one of them empty)."""
  d = tmp_path / "mail"
  d.mkdir()
  write_jsonl(d / "train.jsonl.gz", [{"email": f"please review draft {i}", "subject": f"draft {i}"}
                                      for i in range(4)])
  write_jsonl(d / "dev.jsonl.gz", [
      {"email": "lunch  is at noon", "subject": "Lunch", "ann0": "lunch at noon",
       "ann1": "noon lunch", "ann2": "lunch time"},
      {"email": "the budget is final", "subject": "Budget", "ann0": "final budget", "ann1": "",
       "ann2": "budget  done"}])
  return d


def test_reference_fields_read_from_eval_records_only(tmp_path, annotated):
  # A first load without reference fields caches records without them: the builder config must
  # change with the fields, or the second load would read stale records.
  plain = data.load(mail_config(tmp_path, annotated))
  assert plain.annotations("eval") == [[], []]
  bundle = data.load(mail_config(tmp_path, annotated, reference_fields=("ann0", "ann1", "ann2")))
  assert bundle.annotations("eval") == [["lunch at noon", "noon lunch", "lunch time"],
                                        ["final budget", "budget done"]]  # the empty ann1 left out
  assert bundle.references("eval") == ["Lunch", "Budget"]  # the target only, as before
  assert bundle.annotations("train")[0] == []  # training files lack the fields


def test_a_missing_reference_field_names_file_line_and_field(tmp_path, annotated):
  recs = [{"email": "a b", "subject": "a", "ann0": "x", "ann1": "y"},
          {"email": "c d", "subject": "c", "ann0": "z", "ann2": "w"}]
  write_jsonl(annotated / "dev.jsonl.gz", recs)
  cfg = mail_config(tmp_path, annotated, reference_fields=("ann0", "ann1"))
  with pytest.raises(data.DataError) as err:
    data.load(cfg)
  msg = str(err.value)
  assert msg.endswith("dev.jsonl.gz:2: no field 'ann1' (fields: ann0, ann2, email, subject)")
  assert len(msg.splitlines()) == 1
  # non-string values too, from the reader itself
  write_jsonl(annotated / "bad.jsonl", [{"email": "a", "subject": "b", "ann0": 3}])
  with pytest.raises(data.DataError, match=r"bad\.jsonl:1: field 'ann0' is int, not a string"):
    list(corpora.read_jsonl(str(annotated / "bad.jsonl"), "email", "subject", ("ann0",)))


def test_reference_fields_on_a_source_without_them_is_an_error(tmp_path):
  cfg = data_presets.get_config("smoke")
  cfg.cache_dir = str(tmp_path)
  cfg.reference_fields = ("ann0",)
  with pytest.raises(data.DataError, match="data.task=reverse has no reference fields"):
    data.load(cfg)


# ---------------------------------------------------------------------------------------------
# source-extended ids


def test_extended_ids_hand_computed(tmp_path):
  d = tmp_path / "mail"
  d.mkdir()
  # shared vocabulary with min_freq=2: is, late, meeting, moved, report, the (all seen twice) = ids
  # 4..9, V = 10; zebra, to, friday, lunch are out of vocabulary.
  write_jsonl(d / "train.jsonl", [{"email": "the meeting is moved", "subject": "meeting moved"},
                                  {"email": "the report is late", "subject": "report late"}])
  write_jsonl(d / "dev.jsonl", [
      {"email": "the zebra meeting is moved to friday zebra",
       "subject": "zebra meeting friday lunch"},
      {"email": "friday the zebra", "subject": "friday zebra"},
      # 9 tokens, truncated to 8: "lunch" is cut, so the target cannot copy it
      {"email": "the report is late is the report is lunch", "subject": "lunch"}])
  cfg = mail_config(tmp_path, d, tokenizer="space", min_freq=2, extended_vocab=True,
                    max_src_len=9, bucket_boundaries=((12, 8),), eval_batch_size=4)
  bundle = data.load(cfg)
  v = bundle.src_vocab
  assert v is bundle.tgt_vocab and v.tokens == ["is", "late", "meeting", "moved", "report", "the"]
  (batch,) = list(bundle.batches("eval"))
  assert batch["src_ext"].shape == (4, 12) and batch["tgt_ext"].shape == (4, 8)
  assert batch["src_ext"].dtype == batch["tgt_ext"].dtype == np.int32
  row = {int(i): r for r, i in enumerate(batch["example_id"])}
  pad = lambda ids, n: ids + [PAD] * (n - len(ids))  # noqa: E731
  expect = {  # example_id -> (src_ext, tgt_ext)
      0: ([9, 10, 6, 4, 7, 11, 12, 10, EOS], [10, 6, 12, UNK, EOS]),
      1: ([10, 9, 11, EOS], [10, 11, EOS]),
      2: ([9, 8, 4, 5, 4, 9, 8, 4, EOS], [UNK, EOS])}
  for i, (src_ext, tgt_ext) in expect.items():
    r = row[i]
    assert batch["src_ext"][r].tolist() == pad(src_ext, 12)
    assert batch["tgt_ext"][r].tolist() == pad(tgt_ext, 8)
    # the plain ids are the extended ones with every OOV back to UNK
    assert batch["src"][r].tolist() == [UNK if x >= v.size else x for x in pad(src_ext, 12)]
    assert batch["tgt"][r].tolist() == [UNK if x >= v.size else x for x in pad(tgt_ext, 8)]
  assert (batch["src_ext"][row[-1]] == PAD).all() and (batch["tgt_ext"][row[-1]] == PAD).all()
  # decode_extended reads them back with the example's OOV list
  assert bundle.source_oovs("eval") == [["zebra", "to", "friday"], ["friday", "zebra"], []]
  oovs = v.source_oovs("the zebra meeting is moved to friday zebra", 8)
  assert oovs == bundle.source_oovs("eval")[0]
  assert (v.decode_extended(batch["src_ext"][row[0]], oovs)
          == "the zebra meeting is moved to friday zebra")
  assert v.decode_extended(batch["tgt_ext"][row[0]], oovs) == "zebra meeting friday <unk>"
  assert v.labels_extended([BOS, 10, 13, EOS], oovs) == ["<s>", "zebra", "<unk>", "</s>"]
  # training batches carry them too (no OOV in the training split: equal to src/tgt)
  train = next(bundle.train_iter())
  assert (train["src_ext"] == train["src"]).all() and (train["tgt_ext"] == train["tgt"]).all()


def test_vocab_extended_round_trip_and_limits():
  v = data.Vocab(["the", "cat", "sat", "on"], data.TokenizerSpec("word"))
  src = "The cat sat on Mat's mat, the mat."
  oovs = v.source_oovs(src)
  assert oovs == ["The", "Mat", "￭'￭", "s", "mat", "￭,", "￭."]  # word tokens, joiner marks kept
  ids = v.encode_extended(src, oovs)
  assert all(i < v.size + len(oovs) for i in ids) and UNK not in ids
  assert v.decode_extended(ids + [EOS, 5], oovs) == src  # stops at EOS, like decode
  assert v.decode(ids) == "<unk> cat sat on <unk> <unk> <unk> <unk> <unk> the <unk> <unk>"
  assert v.source_oovs(src, 2) == ["The"]
  assert v.encode_extended("a cat", oovs) == [UNK, 5]  # not a source OOV: stays UNK
  assert v.decode_extended([v.size + len(oovs)], oovs) == "<unk>"  # past the list


def test_sentencepiece_has_no_oovs(tmp_path):
  pytest.importorskip("sentencepiece")
  v = data.build_vocab(["the cat sat on the mat", "a dog ran in the park"] * 20,
                       data.TokenizerSpec("sentencepiece"), max_size=40)
  text = "the dog sat on the mat"
  assert v.source_oovs(text) == []
  assert v.encode_extended(text, []) == v.encode(text)
  assert v.decode_extended(v.encode(text) + [EOS], []) == v.decode(v.encode(text))
  assert v.decode([v.size + 3]) == v.decode([UNK])  # an id past the pieces reads as UNK


def check_extended(bundle, batch, texts, oov_lists):
  """src_ext/tgt_ext of a batch agree with its src/tgt and with the source text of each row
  (texts: (source, target) per example_id; oov_lists: bundle.source_oovs(role))."""
  v = bundle.src_vocab
  for r, i in enumerate(batch["example_id"]):
    src, tgt = batch["src"][r], batch["tgt"][r]
    src_ext, tgt_ext = batch["src_ext"][r], batch["tgt_ext"][r]
    if i < 0:
      assert (src_ext == PAD).all() and (tgt_ext == PAD).all()
      continue
    sl, tl = batch["src_lengths"][r], batch["tgt_lengths"][r]
    src_text, tgt_text = texts[i]
    # known tokens, EOS and PAD as in src/tgt; UNK in src only for OOVs, numbered by appearance
    assert ((src_ext == src) | (src == UNK)).all() and ((tgt_ext == tgt) | (tgt == UNK)).all()
    assert (src_ext[src == UNK] >= v.size).all()
    ext = src_ext[src_ext >= v.size] - v.size
    assert (ext < sl - 1).all() and (np.maximum.accumulate(ext) <= np.arange(ext.size)).all()
    assert sorted(set(ext.tolist())) == list(range(len(set(ext.tolist()))))
    oovs = v.source_oovs(src_text, sl - 1)
    assert oov_lists[i] == oovs
    tokens = v.tokenize(src_text)[:sl - 1]
    assert v.decode_extended(src_ext, oovs) == v.detokenize(tokens)
    # a target OOV is copyable exactly when it is one of the source's OOVs
    for tok, x in zip(v.tokenize(tgt_text)[:tl - 1], tgt_ext):
      if v.token_to_id(tok) == UNK and tok not in v.tokens:
        assert x == (v.size + oovs.index(tok) if tok in oovs else UNK)


def fake_split(builder, split, **kwargs):
  """Records for tfds.testing.mock_data in the dataset's own fields: sources mix 8 common words
  with rare names (so held-out splits have OOVs), targets copy source words and add new ones;
  held-out records also have an "ann0" field (a second reference)."""
  del kwargs
  from attn.data import tfds_sources  # pylint: disable=import-outside-toplevel

  src_key, tgt_key = tfds_sources.fields_for(builder.name, "", "", "", "")
  rng = np.random.default_rng(["train", "validation", "test"].index(str(split)))
  records = []
  for i in range(16 if split == "train" else 8):
    words = [f"w{rng.integers(8)}" if rng.random() < 0.6 else f"name{rng.integers(500)}"
             for _ in range(rng.integers(6, 24))]
    summary = list(rng.choice(words, 3)) + [f"new{i}"]
    records.append({src_key: " ".join(words), tgt_key: " ".join(summary)})
    if split != "train":
      records[-1]["ann0"] = " ".join(summary[::-1])
  return records


@pytest.mark.parametrize("preset", ["cnn_dailymail", "xsum", "gigaword", "aeslc_tfds"])
def test_summarization_tfds_presets_with_extended_vocab(tmp_path, preset):
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel

  cfg = data_presets.get_config(preset)
  cfg.update(dict(cache_dir=str(tmp_path), tfds_data_dir=str(tmp_path / "tfds"), min_freq=3,
                  max_src_len=16, max_tgt_len=8, batch_size=4, num_buckets=2, num_threads=0,
                  extended_vocab=True))
  with tfds.testing.mock_data(as_data_source_fn=fake_split):
    bundle = data.load(cfg)
  v = bundle.src_vocab
  assert {f"w{i}" for i in range(8)} <= set(v.tokens)
  n_src = n_tgt = n_unk = 0
  for role in ("train", "test"):
    texts = list(zip(bundle.sources(role), bundle.references(role)))
    oov_lists = bundle.source_oovs(role)
    for batch in bundle.batches(role):
      assert batch["src_ext"].shape == batch["src"].shape
      assert batch["tgt_ext"].shape == batch["tgt"].shape
      check_extended(bundle, batch, texts, oov_lists)
      n_src += (batch["src_ext"] >= v.size).sum()
      n_tgt += (batch["tgt_ext"] >= v.size).sum()
      n_unk += (batch["tgt_ext"] == UNK).sum()
  assert n_src and n_tgt and n_unk  # OOVs numbered, copied into targets, and left UNK ("newN")
  x = next(bundle.train_iter())
  assert {"src_ext", "tgt_ext"} <= set(x)


def test_tfds_reference_fields(tmp_path):
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel

  cfg = data_presets.get_config("aeslc_tfds")
  cfg.update(dict(cache_dir=str(tmp_path), tfds_data_dir=str(tmp_path / "tfds"), min_freq=1,
                  reference_fields=("ann0",)))
  with tfds.testing.mock_data(as_data_source_fn=fake_split):
    bundle = data.load(cfg)  # the training records have no ann0: not read there
    cfg.reference_fields = ("ann0", "ann1")
    with pytest.raises(data.DataError, match=r"TFDS aeslc: no field\(s\) \['ann1'\]"):
      data.load(cfg)
  sets, targets = bundle.annotations("test"), bundle.references("test")
  assert len(sets) == len(targets)
  assert all(len(s) == 1 and s[0].split() == t.split()[::-1] for s, t in zip(sets, targets))


# ---------------------------------------------------------------------------------------------
# ROUGE against several references


def test_rouge_one_reference_gives_the_same_score_every_way():
  r = metrics.rouge(["the cat sat"], ["the cat ran"], aggregate="both")
  assert r["rouge1"] == r["rouge1_max"] == pytest.approx(200 / 3)
  assert r["rouge2"] == r["rouge2_max"] == pytest.approx(50)
  assert r["rougeL"] == r["rougeL_max"] == pytest.approx(200 / 3)
  for aggregate in ("max", "mean"):
    assert metrics.rouge(["the cat sat"], [["the cat ran"]], aggregate=aggregate) == pytest.approx(
        {t: r[t] for t in metrics.ROUGE_TYPES})
  with pytest.raises(ValueError, match="aggregate='best'; use one of max, mean, both"):
    metrics.rouge(["a"], ["a"], aggregate="best")


def test_rouge_mean_and_max_over_three_references():
  from rouge_score import rouge_scorer  # pylint: disable=import-outside-toplevel

  hyp = "the cat sat on the mat"
  refs = ["the cat sat on the mat", "a cat sat", "the dog ran away"]
  r = metrics.rouge([hyp], [refs], aggregate="both")
  assert sorted(r) == ["rouge1", "rouge1_max", "rouge2", "rouge2_max", "rougeL", "rougeL_max"]
  assert r["rouge1_max"] == r["rouge2_max"] == r["rougeL_max"] == pytest.approx(100)
  # by hand: vs "a cat sat" unigram F1 = 2PR/(P+R) with P = 2/6, R = 2/3 -> 4/9; vs "the dog ran
  # away" P = 1/6, R = 1/4 -> 1/5. Bigrams: "cat sat" only, P = 1/5, R = 1/2 -> 2/7; then 0.
  # LCS: "cat sat" (4/9) and "the" (1/5).
  assert r["rouge1"] == pytest.approx(100 * (1 + 4 / 9 + 1 / 5) / 3)
  assert r["rouge2"] == pytest.approx(100 * (1 + 2 / 7 + 0) / 3)
  assert r["rougeL"] == pytest.approx(100 * (1 + 4 / 9 + 1 / 5) / 3)
  scorer = rouge_scorer.RougeScorer(list(metrics.ROUGE_TYPES), use_stemmer=True)
  for t in metrics.ROUGE_TYPES:
    assert r[t] == pytest.approx(100 * np.mean([scorer.score(x, hyp)[t].fmeasure for x in refs]))
  assert metrics.rouge([hyp], [refs], aggregate="mean") == pytest.approx(
      {t: r[t] for t in metrics.ROUGE_TYPES})
  assert metrics.rouge([hyp], [refs]) == pytest.approx({t: 100 for t in metrics.ROUGE_TYPES})
  # corpus level: the mean over examples, each with its own number of references
  two = metrics.rouge([hyp, "c d"], [refs, "x y"], aggregate="both")
  assert two["rouge1"] == pytest.approx(r["rouge1"] / 2) and two["rouge1_max"] == pytest.approx(50)
  assert metrics.rouge(["c d"], [["x y", "c d"]])["rouge1"] == pytest.approx(100)  # max, as before
  assert metrics.rouge(["c d"], [["x y", "c d"]], aggregate="mean")["rouge1"] == pytest.approx(50)
  # stemming is on: "cats running" matches "cat runs"
  assert metrics.rouge(["cats running"], [["cat runs", "x"]], aggregate="mean")["rouge1"] == \
      pytest.approx(50)
