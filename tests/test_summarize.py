"""experiments/summarize.py end to end: a pointer-generator copies source words it has never seen
(which the plain attention model cannot produce), coverage switched on in a resumed run, result
files, bad input, and a TFDS summarization dataset through the same pipeline (mock data)."""

import gzip
import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest

from attn import data, training
from attn.errors import ConfigError
from experiments.configs import summarize as summarize_configs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILLERS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def _write_jsonl(path, records):
  with gzip.open(path, "wt") as f:
    for r in records:
      f.write(json.dumps(r) + "\n")


def _code_task(directory, n_train=600, n_dev=40, seed=0):
  """email: filler words with "code <word>" somewhere; subject: "ref <word>". Every code word is
  made up for its example, so none reaches the vocabulary (min_freq=2): only copying gets it."""
  rng = random.Random(seed)
  letters = "bcdfghjklmnpqrstvwxz"

  def example():
    code = "".join(rng.choice(letters) for _ in range(7))
    words = rng.sample(FILLERS, rng.randint(3, 6))
    words.insert(rng.randint(0, len(words)), f"code {code}")
    return {"email": " ".join(words), "subject": f"ref {code}"}

  os.makedirs(directory, exist_ok=True)
  _write_jsonl(os.path.join(directory, "train.jsonl.gz"), [example() for _ in range(n_train)])
  dev = [example() for _ in range(n_dev)]
  _write_jsonl(os.path.join(directory, "dev.jsonl.gz"), dev)
  return [d["subject"] for d in dev]


def _config(data_dir, pointer, **train):
  c = summarize_configs.get_config("smoke")
  c.data.update(dict(task="jsonl", dir=str(data_dir), eval_split="dev", test_split="dev",
                     max_src_len=12, max_tgt_len=4, vocab_size=0, min_freq=2, batch_size=32,
                     num_buckets=1, num_threads=0))
  c.model.rnn.update(dict(emb_dim=32, enc_hidden=32, dec_hidden=32, d_attn=32, pointer=pointer))
  c.train.update(dict(dict(steps=250, learning_rate=1e-2, warmup_steps=20, eval_every=250,
                           checkpoint_every=250, log_every=250, beam_size=2,
                           eval_decode_sentences=40, block_repeat_ngram=0), **train))
  return c


@pytest.fixture(scope="module")
def code_runs(tmp_path_factory):
  root = tmp_path_factory.mktemp("summarize")
  refs = _code_task(root / "data")
  runs = {}
  for pointer in (False, True):
    wd = str(root / f"pointer_{pointer}")
    runs[pointer] = (wd, training.train_and_evaluate(_config(root / "data", pointer), wd,
                                                     task="summarize"))
  return root, refs, runs


def test_pointer_generator_copies_words_the_vocabulary_lacks(code_runs):
  _, refs, runs = code_runs
  exact = {}
  for pointer, (wd, res) in runs.items():
    with open(os.path.join(wd, "predictions.txt")) as f:
      preds = f.read().splitlines()
    assert len(preds) == len(refs)
    exact[pointer] = np.mean([p == r for p, r in zip(preds, refs)])
    for key in ("rouge1", "rouge2", "rougeL", "rouge1_max", "params", "wall_s",
                "repeated_trigram_rate", "oov_recovered"):
      assert key in res, key
    assert res["oov_in_references"] == len(refs)  # every code word: OOV, and in its source
  assert exact[False] == 0.0  # the plain model can only write "ref <unk>"
  assert runs[False][1]["oov_recovered"] == 0.0
  assert exact[True] >= 0.9, exact
  assert runs[True][1]["oov_recovered"] >= 0.9
  assert runs[True][1]["oov_copies"] >= 0.9 * len(refs)
  assert 0.0 < runs[True][1]["mean_p_gen"] < 1.0
  assert runs[True][1]["rouge1"] > runs[False][1]["rouge1"]


def test_coverage_switched_on_when_resuming(code_runs):
  """See et al.'s last phase: the finished pointer run continues with coverage on, from its
  checkpoint (not from scratch), and its checkpoints gain the coverage weights."""
  root, _, runs = code_runs
  wd = str(root / "pointer_True")
  c = _config(root / "data", True, steps=280, eval_every=280, checkpoint_every=280)
  c.model.rnn.coverage = True
  res = training.train_and_evaluate(c, wd, task="summarize")
  assert res["step"] == 280 and res["model_config"]["rnn"]["coverage"]
  assert res["best_step"] == 280  # decoded with the coverage model, not the earlier best
  with open(os.path.join(wd, "metrics.jsonl")) as f:
    train_steps = [r["step"] for r in map(json.loads, f) if r.get("split") == "train"]
  assert min(s for s in train_steps if s > 250) == 280  # only the 30 new steps were run
  run = training.load_run(wd, task="summarize")
  assert run.model.decoder.w_cov is not None
  with open(os.path.join(wd, "model.json")) as f:
    assert json.load(f)["rnn"]["coverage"] is True
  # A model field other than the switchable ones still refuses the workdir.
  c.model.rnn.emb_dim = 16
  with pytest.raises(training.workdir.WorkdirError, match="model.rnn.emb_dim=32 there, 16 here"):
    training.train_and_evaluate(c, wd, task="summarize")


def _records(wd):
  return {n: open(os.path.join(wd, n), "rb").read()
          for n in ("config.json", "model.json", "results.json")}


# slow: three training phases; test_coverage_switched_on_when_resuming pins the switch fast
@pytest.mark.slow
def test_a_coverage_phase_that_trains_nothing_or_dies_early_leaves_the_workdir_usable(
    tmp_path, monkeypatch):
  """Switching coverage on never leaves records that claim a model no checkpoint holds: a phase
  with nothing to train is refused before anything is written, one killed before its first save
  leaves the records as they were, and the run then goes on with coverage or without it."""
  _code_task(tmp_path / "data", n_train=64, n_dev=8)
  wd = str(tmp_path / "wd")

  def config(steps, coverage):
    c = _config(tmp_path / "data", True, steps=steps, eval_every=steps, checkpoint_every=2,
                log_every=2, eval_decode_sentences=8)
    c.model.rnn.update(dict(emb_dim=8, enc_hidden=8, dec_hidden=8, d_attn=8, coverage=coverage))
    return c

  training.train_and_evaluate(config(2, False), wd, task="summarize")
  phase1 = _records(wd)
  # The step budget is reached: coverage would train nothing and decode the model without it.
  with pytest.raises(ConfigError, match=r"model.rnn.coverage switched on, but this run would "
                                        r"train no step with it: the checkpoint is at step 2"):
    training.train_and_evaluate(config(2, True), wd, task="summarize")
  assert _records(wd) == phase1
  # A coverage phase killed before its first checkpoint (here: as soon as training starts).
  def killed(*args, **kwargs):
    raise RuntimeError("killed")
  monkeypatch.setattr(training.loop, "train", killed)
  with pytest.raises(RuntimeError, match="killed"):
    training.train_and_evaluate(config(4, True), wd, task="summarize")
  monkeypatch.undo()
  assert _records(wd) == phase1
  # Going back without coverage works ...
  assert training.train_and_evaluate(config(4, False), wd, task="summarize")["step"] == 4
  with open(os.path.join(wd, "model.json")) as f:
    assert json.load(f)["rnn"]["coverage"] is False
  # ... and so does coverage, even from a record that claims it already (as older code left it).
  with open(os.path.join(wd, "model.json")) as f:
    record = json.load(f)
  record["rnn"]["coverage"] = True
  with open(os.path.join(wd, "model.json"), "w") as f:
    json.dump(record, f)
  res = training.train_and_evaluate(config(6, True), wd, task="summarize")
  assert res["step"] == 6 and res["model_config"]["rnn"]["coverage"] and res["best_step"] == 6
  assert training.load_run(wd, task="summarize").model.decoder.w_cov is not None


@pytest.mark.parametrize("line,message", [
    ('{"email": "a b c", "subject": ', r"dev.jsonl.gz:2: not a JSON object"),
    ('{"email": "a b c"}', r"dev.jsonl.gz:2: no field 'subject'"),
])
def test_bad_json_line_is_one_error_line(tmp_path, line, message):
  _code_task(tmp_path, n_train=20, n_dev=3)
  with gzip.open(tmp_path / "dev.jsonl.gz", "rt") as f:
    lines = f.read().splitlines()
  lines[1] = line
  with gzip.open(tmp_path / "dev.jsonl.gz", "wt") as f:
    f.write("\n".join(lines) + "\n")
  p = subprocess.run(
      [sys.executable, "-m", "experiments.summarize",
       "--config=experiments/configs/summarize.py:smoke", f"--config.data.dir={tmp_path}",
       f"--workdir={tmp_path / 'wd'}"], cwd=REPO, capture_output=True, text=True, timeout=300)
  assert p.returncode == 2, p.stderr[-2000:]
  errors = [l for l in p.stderr.splitlines() if l.startswith("error:")]
  assert len(errors) == 1 and __import__("re").search(message, errors[0]), p.stderr[-2000:]
  assert "Traceback" not in p.stderr


def test_cnn_dailymail_through_the_pipeline_with_mock_data(tmp_path):
  """CNN/DailyMail is not on this machine: its TFDS name, fields and the pointer-generator run
  end to end on tfds.testing.mock_data."""
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  c = summarize_configs.get_config("cnn_dailymail")
  c.data.update(dict(tfds_data_dir=str(tmp_path / "tfds"), max_src_len=24, max_tgt_len=8,
                     min_freq=1, vocab_size=300, batch_size=4, num_buckets=1, num_threads=0))
  c.model.rnn.update(dict(emb_dim=8, enc_hidden=8, dec_hidden=8, d_attn=8, pointer=True,
                          coverage=True))
  c.train.update(dict(steps=2, eval_every=2, checkpoint_every=2, log_every=1, warmup_steps=1,
                      eval_decode_sentences=4, beam_size=2, min_decode_len=2, max_decode_len=6,
                      attention_samples=1))
  with tfds.testing.mock_data(num_examples=6):
    res = training.train_and_evaluate(c, str(tmp_path / "wd"), task="summarize")
  assert res["split"] == "test" and np.isfinite(res["rouge1"])
  with open(tmp_path / "wd" / "predictions.txt") as f:
    assert len(f.read().splitlines()) == 6


def test_reference_fields_listing_the_target_are_refused_and_the_subject_is_scored_apart(
    tmp_path):
  # Before: data.reference_fields=subject,ann0 scored the subject twice; later the subject and
  # the annotations were pooled into one mean. Now the subject is never an annotation.
  d = tmp_path / "mail"
  d.mkdir()
  _write_jsonl(d / "train.jsonl.gz", [{"email": "cat dog sun", "subject": "cat dog"}] * 4)
  _write_jsonl(d / "dev.jsonl.gz", [{"email": "cat dog sun", "subject": "cat dog",
                                     "ann0": "sun moon"}])
  p = subprocess.run(
      [sys.executable, "-m", "experiments.summarize",
       "--config=experiments/configs/summarize.py:smoke", f"--config.data.dir={d}",
       "--config.data.reference_fields=subject,ann0", f"--workdir={tmp_path / 'wd'}"],
      cwd=REPO, capture_output=True, text=True, timeout=300)
  assert p.returncode == 2, p.stderr[-2000:]
  errors = [l for l in p.stderr.splitlines() if l.startswith("error:")]
  assert errors == ["error: data config: reference_fields=subject,ann0 lists the target field "
                    "'subject', which is scored on its own (rouge*_subject); list only the other "
                    "references"], p.stderr[-2000:]
  assert not (tmp_path / "wd").exists()
  c = summarize_configs.get_config("smoke")
  c.data.update(dict(dir=str(d), reference_fields=("ann0",), cache_dir=str(tmp_path / "cache"),
                     min_freq=1, num_threads=0))
  bundle = data.load(c.data)
  scores = training.get_task("summarize").score(bundle, "test", {0: "cat dog sun"}, {0: 4})
  # By hand, ROUGE-1 F1 of "cat dog sun": against the annotation "sun moon" P = 1/3, R = 1/2 ->
  # 0.4; against the subject "cat dog" P = 2/3, R = 1 -> 0.8 (pooled, the mean was 60).
  assert scores["rouge1"] == scores["rouge1_max"] == pytest.approx(40)
  assert scores["rouge1_subject"] == pytest.approx(80)
  assert scores["rouge_references"] == "ann0" and scores["annotated_examples"] == 1


# ---------------------------------------------------------------------------------------------
# Two protocols on an annotated split: the annotations (the AESLC paper's references) and the
# sender's subject alone (PEGASUS's); attn.apps.summarize.task.summary_rouge


def _f1(p, r):
  return 2 * p * r / (p + r) if p + r else 0.0


# (hypotheses, subjects, annotations, figures known by hand: key -> value x100)
_HAND = {
    "one annotation": (
        ["cat dog sun"], ["cat dog"], [["sun moon"]],
        # unigrams: vs "sun moon" P = 1/3, R = 1/2; vs "cat dog" P = 2/3, R = 1. Bigrams: none of
        # "sun moon"; "cat dog" P = 1/2, R = 1. LCS: "sun" and "cat dog".
        {"rouge1": _f1(1 / 3, 1 / 2), "rouge2": 0.0, "rougeL": _f1(1 / 3, 1 / 2),
         "rouge1_subject": _f1(2 / 3, 1), "rouge2_subject": _f1(1 / 2, 1),
         "rougeL_subject": _f1(2 / 3, 1)}),
    "three annotations": (
        ["the cat sat on the mat"], ["mat"],
        [["the cat sat on the mat", "a cat sat", "the dog ran away"]],
        # vs "a cat sat" P = 2/6, R = 2/3; vs "the dog ran away" P = 1/6, R = 1/4; bigram "cat
        # sat" P = 1/5, R = 1/2; vs "mat" P = 1/6, R = 1 and no bigram.
        {"rouge1": (1 + _f1(1 / 3, 2 / 3) + _f1(1 / 6, 1 / 4)) / 3, "rouge1_max": 1.0,
         "rouge2": (1 + _f1(1 / 5, 1 / 2)) / 3, "rouge2_max": 1.0,
         "rouge1_subject": _f1(1 / 6, 1), "rouge2_subject": 0.0}),
    "stemmed, two examples": (
        ["cats running", "budget final"], ["cat runs", "final budget"],
        [["running cat", "dogs"], ["the budget"]],
        # "cats running" stems to "cat run": vs "running cat" 1, vs "dogs" 0 -> mean 1/2, best 1;
        # "budget final" vs "the budget": P = 1/2, R = 1/2.
        {"rouge1": (0.5 + 0.5) / 2, "rouge1_max": (1 + 0.5) / 2, "rouge1_subject": 1.0,
         "rougeL_subject": (1 + 0.5) / 2}),
}


@pytest.mark.parametrize("name", sorted(_HAND))
def test_annotations_and_subject_are_scored_apart(name):
  from rouge_score import rouge_scorer  # pylint: disable=import-outside-toplevel
  from attn.apps.summarize.task import summary_rouge  # pylint: disable=import-outside-toplevel

  hyps, subjects, anns, by_hand = _HAND[name]
  got = summary_rouge(hyps, subjects, anns)
  types = ("rouge1", "rouge2", "rougeL")
  assert set(got) == {*types, *(f"{t}_max" for t in types), *(f"{t}_subject" for t in types),
                      "annotated_examples"}
  assert got["annotated_examples"] == len(hyps)
  for key, value in by_hand.items():
    assert got[key] == pytest.approx(100 * value), key
  # rouge-score itself, one pair at a time: the mean and the best over an example's
  # annotations, the subject alone; each averaged over the examples.
  scorer = rouge_scorer.RougeScorer(list(types), use_stemmer=True)
  for t in types:
    f = [[scorer.score(a, h)[t].fmeasure for a in refs] for h, refs in zip(hyps, anns)]
    assert got[t] == pytest.approx(100 * np.mean([np.mean(x) for x in f]))
    assert got[f"{t}_max"] == pytest.approx(100 * np.mean([max(x) for x in f]))
    assert got[f"{t}_subject"] == pytest.approx(
        100 * np.mean([scorer.score(s, h)[t].fmeasure for s, h in zip(subjects, hyps)]))


@pytest.mark.parametrize("anns,annotated", [([[], []], 0), ([["the cat"], []], 1)])
def test_a_split_without_annotations_keeps_the_subject_scoring(anns, annotated):
  from attn.apps.summarize.task import summary_rouge  # pylint: disable=import-outside-toplevel

  hyps, subjects = ["the cat", "a dog ran"], ["the cat sat", "a dog"]
  got = summary_rouge(hyps, subjects, anns)
  # ROUGE-1 F1 by hand: "the cat" vs "the cat sat" P = 1, R = 2/3 -> 0.8; "a dog ran" vs "a dog"
  # P = 2/3, R = 1 -> 0.8.
  subject = 80.0
  if not annotated:  # training-like: rougeN against the subject, *_max the same, nothing else
    assert sorted(got) == ["rouge1", "rouge1_max", "rouge2", "rouge2_max", "rougeL", "rougeL_max"]
    assert got["rouge1"] == got["rouge1_max"] == pytest.approx(subject)
  else:  # only the annotated example enters the annotation figure, every one the subject's
    assert got["annotated_examples"] == 1 and got["rouge1"] == pytest.approx(100)
    assert got["rouge1_subject"] == pytest.approx(subject)


# ---------------------------------------------------------------------------------------------
# The aeslc_test preset: train on train, choose on dev, score the published test split


def _aeslc_release(directory, with_test=True):
  """A tiny stand-in for what `get_data aeslc` writes: train without annotations, dev and test
  with ann0..ann2 (test's subjects and annotations differ, so scores tell them apart)."""
  rng = random.Random(1)
  os.makedirs(directory, exist_ok=True)

  def record(i, annotated):
    words = rng.sample(FILLERS, 5)
    r = {"email": " ".join(words), "subject": " ".join(words[:2]), "id": f"x_{i}"}
    if annotated:
      r.update(ann0=" ".join(words[1:3]), ann1=words[0], ann2=" ".join(words[2:5]))
    return r

  _write_jsonl(os.path.join(directory, "train.jsonl.gz"), [record(i, False) for i in range(40)])
  _write_jsonl(os.path.join(directory, "dev.jsonl.gz"), [record(i, True) for i in range(6)])
  if with_test:
    _write_jsonl(os.path.join(directory, "test.jsonl.gz"), [record(i, True) for i in range(5)])


def _aeslc_test_config(directory, tmp_path):
  c = summarize_configs.get_config("aeslc_test")
  c.data.update(dict(dir=str(directory), cache_dir=str(tmp_path / "cache"), max_src_len=8,
                     max_tgt_len=4, vocab_size=0, min_freq=1, batch_size=4, num_buckets=1,
                     num_threads=0))
  c.model.rnn.update(dict(emb_dim=8, enc_hidden=8, dec_hidden=8, d_attn=8, pointer=True))
  c.train.update(dict(steps=2, eval_every=1, checkpoint_every=2, log_every=1, warmup_steps=1,
                      eval_decode_sentences=6, beam_size=2, max_decode_len=4,
                      attention_samples=1, max_wall_s=0))
  return c


def test_aeslc_test_chooses_on_dev_and_scores_test_both_ways(tmp_path, monkeypatch):
  from attn.apps.summarize import task as summarization  # pylint: disable=import-outside-toplevel

  d = tmp_path / "aeslc"
  _aeslc_release(d)
  c = _aeslc_test_config(d, tmp_path)
  assert (c.data.eval_split, c.data.test_split) == ("dev", "test")
  scored, real = [], summarization.SummarizationTask.score

  def spy(self, bundle, role, hyps, src_lengths):
    scored.append((role, len(hyps)))
    return real(self, bundle, role, hyps, src_lengths)

  monkeypatch.setattr(summarization.SummarizationTask, "score", spy)
  res = training.train_and_evaluate(c, str(tmp_path / "wd"), task="summarize")
  # Every evaluation during training read dev (6 emails); test (5) only at the end: beam, greedy.
  assert scored == [("eval", 6), ("eval", 6), ("test", 5), ("test", 5)], scored
  assert res["split"] == "test" and res["rouge_references"] == "ann0,ann1,ann2"
  assert res["annotated_examples"] == 5
  for t in ("rouge1", "rouge2", "rougeL"):
    for key in (t, f"{t}_max", f"{t}_subject", f"{t}_greedy", f"{t}_subject_greedy"):
      assert np.isfinite(res[key]), key
    assert res[f"{t}_max"] >= res[t]
  assert "rouge1_subject" in res["best_eval"]  # the dev figures that chose the checkpoint
  with open(tmp_path / "wd" / "predictions.txt") as f:
    assert len(f.read().splitlines()) == 5


def test_aeslc_test_without_a_test_file_names_the_get_data_command(tmp_path):
  d = tmp_path / "shared" / "aeslc"
  _aeslc_release(d, with_test=False)  # the team's shared copy: train and dev only
  c = _aeslc_test_config(d, tmp_path)
  with pytest.raises(data.DataError) as e:
    data.load(c.data)
  assert str(e.value) == (
      f"no file test.jsonl[.gz] in {d} (it holds: dev.jsonl.gz, train.jsonl.gz); `python -m "
      f"experiments.get_data aeslc --dir={d.parent}` downloads the published files to {d}")
