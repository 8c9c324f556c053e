"""Scoring finished runs again: checkpoints kept at training-time marks, other splits, BLEU by
source length, the report; and the vocabulary check of data that moved."""

import gzip
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import sacrebleu

from attn import training
from attn.data import vocab_record
from attn.data.base import DataError
from attn.errors import ConfigError
from attn.evaluation import metrics
from attn.training import evaluation, marks, scoring, scoring_report
from attn.training.config import TrainConfig
from experiments import score as score_cli
from experiments.configs import translate as translate_config

# -- BLEU by source length


@pytest.mark.parametrize("lengths,width,min_count,want", [
    ([3, 7, 12, 12, 18], 5, 1, [0, 5, 10, 15, 20]),
    ([3, 7, 12, 12, 18], 5, 2, [0, 10, 20]),   # 0-4 joins 5-9 (2 then); the lone 18 joins 10-14
    ([7, 8, 12, 13, 18, 19], 5, 2, [5, 10, 15, 20]),
    ([7, 8, 12, 13, 18], 5, 2, [5, 10, 20]),    # the lone 18 joins 10-14
    ([4, 4, 4], 5, 10, [0, 5]),                 # one bucket left, however few
])
def test_bucket_edges(lengths, width, min_count, want):
  assert scoring.bucket_edges(lengths, width, min_count) == want


def test_bucket_edges_refuse_no_lengths():
  with pytest.raises(ValueError, match="no lengths"):
    scoring.bucket_edges([], 5, 1)


def test_bleu_by_bucket_is_sacrebleu_of_each_subset():
  rng = np.random.default_rng(0)
  words = "a man in a red shirt is riding a bike down the street with his dog".split()
  refs = [" ".join(rng.choice(words, size=rng.integers(3, 14))) for _ in range(40)]
  hyps = [" ".join(w for w in r.split() if rng.random() > 0.3) or "a" for r in refs]
  lengths = [len(r.split()) for r in refs]
  got = metrics.bleu_by_bucket(hyps, refs, lengths, [0, 6, 10, 20])
  assert list(got) == ["0-5", "6-9", "10-19"]
  for label, (lo, hi) in zip(got, [(0, 6), (6, 10), (10, 20)]):
    idx = [i for i, n in enumerate(lengths) if lo <= n < hi]
    want = sacrebleu.corpus_bleu([hyps[i] for i in idx], [[refs[i] for i in idx]]).score
    assert got[label] == {"bleu": pytest.approx(want, abs=1e-9), "sentences": len(idx)}


def test_bleu_by_bucket_refuses_mismatched_lengths():
  with pytest.raises(ValueError, match="2 hypotheses, 2 references and 3 source lengths"):
    metrics.bleu_by_bucket(["a", "b"], ["a", "b"], [1, 2, 3], 5)


# -- train.mark_wall_s


@pytest.mark.parametrize("marks_in,want", [((600, 1800), (600.0, 1800.0)), (600, (600.0,)),
                                           ((), ())])
def test_mark_wall_s_accepted(marks_in, want):
  assert TrainConfig(mark_wall_s=marks_in).mark_wall_s == want


@pytest.mark.parametrize("bad", [(1800, 600), (600, 600), (0,), (-5,), ("600",), (True,)])
def test_mark_wall_s_refused(bad):
  with pytest.raises(ConfigError, match="train.mark_wall_s=.* increasing times"):
    TrainConfig(mark_wall_s=bad)


@pytest.fixture(scope="module")
def marked_run(tmp_path_factory):
  """A finished smoke run that passed one mark at once (1 ms) and never the other (a day)."""
  workdir = str(tmp_path_factory.mktemp("marked"))
  config = translate_config.get_config("smoke")
  config.model.rnn.decoder = "bahdanau"
  config.data.num_buckets = 1
  config.train.steps, config.train.eval_every = 6, 100  # evaluated at the mark and at the end
  config.train.mark_wall_s = (0.001, 86400.0)
  results = training.train_and_evaluate(config, workdir)
  return workdir, results


def test_mark_keeps_the_best_checkpoint_as_of_the_mark(marked_run):
  workdir, _ = marked_run
  kept = marks.kept(workdir)
  assert [os.path.basename(p) for p, _ in kept] == ["wall_0.001s"]  # the day was never reached
  path, info = kept[0]
  # Passed after the first step: evaluated there, so best/ was that step when it was copied.
  assert info["step"] == info["kept_step"] == 1
  assert info["mark_s"] == 0.001 and info["wall_s"] >= 0.001
  assert set(info["kept_eval"]) >= {"bleu", "perplexity"}
  assert set(os.listdir(path)) == {"1", marks.INFO}
  assert not any(n.endswith(".tmp") for n in os.listdir(os.path.join(workdir, marks.MARKS_DIR)))


def test_marks_already_kept_are_not_due(tmp_path):
  os.makedirs(marks.mark_dir(str(tmp_path), 600))
  assert marks.due(str(tmp_path), (600.0, 1800.0, 3600.0), 2000.0) == [1800.0]
  assert marks.due(str(tmp_path), (600.0, 1800.0), 100.0) == []


def test_score_best_reproduces_the_runs_own_test_score(marked_run):
  workdir, results = marked_run
  rows = scoring.score_workdir(workdir, which="both")
  recorded = json.loads(open(os.path.join(workdir, "config.json")).read())["data"]["test_split"]
  assert [(r["checkpoint"], r["split"]) for r in rows] == [("best", recorded),
                                                           ("wall_0.001s", recorded)]
  best, mark = rows
  assert best["bleu"] == pytest.approx(results["bleu"], abs=1e-9)
  assert best["chrf"] == pytest.approx(results["chrf"], abs=1e-9)
  assert best["step"] == results["best_step"] and mark["step"] == 1
  assert best["sentences"] == sum(b["sentences"] for b in best["bleu_by_src_words"].values())
  # What the mark kept is step 1's model, not the final one: scored from its own copy.
  run = training.load_run(workdir, checkpoint_dir=marks.kept(workdir)[0][0])
  assert run.progress.step == 1
  hyps = evaluation.decode_split(run, "test", search=run.tc.search())
  assert mark["bleu"] == pytest.approx(
      evaluation.score_outputs(run, "test", hyps)["bleu"], abs=1e-9)


def test_scores_are_read_back_not_decoded_again(marked_run, monkeypatch):
  workdir, _ = marked_run
  first = scoring.score_workdir(workdir, which="best")

  def refuse(*a, **k):
    raise AssertionError("decoded again")
  monkeypatch.setattr(evaluation, "decode_split", refuse)
  assert scoring.score_workdir(workdir, which="best") == first
  with pytest.raises(AssertionError, match="decoded again"):  # other buckets: decoded again
    scoring.score_workdir(workdir, which="best", buckets=(3, 1))


def test_marks_asked_of_a_run_that_kept_none(smoke_bahdanau_workdir):
  with pytest.raises(ConfigError, match="kept no checkpoint at a training-time mark"):
    scoring.kept_checkpoints(smoke_bahdanau_workdir, "marks")
  with pytest.raises(ConfigError, match="checkpoints='last': 'last' unknown"):
    scoring.kept_checkpoints(smoke_bahdanau_workdir, "last")


# -- the report and the command


def _row(wd, ck, split, bleu, wall_s, by_len=None):
  row = {"workdir": wd, "checkpoint": ck, "split": split, "beam_size": 5, "bleu": bleu,
         "step": 100, "wall_s": wall_s}
  if by_len:
    row["bleu_by_src_words"] = by_len
  return row


def test_report_tables_and_plots(tmp_path):
  by_len = {"0-9": {"bleu": 40.0, "sentences": 600}, "10-19": {"bleu": 30.0, "sentences": 400}}
  rows = [_row("w/rnn", "best", "t16", 36.4, 3600, by_len),
          _row("w/rnn", "best", "t17", 30.25, 3600),
          _row("w/rnn", "wall_600s", "t16", 30.0, 601),
          _row("w/tfm", "best", "t16", 40.7, 3500, {"0-9": {"bleu": 45.0, "sentences": 600}})]
  text, plots = scoring_report.write(rows, str(tmp_path))
  assert "| rnn | best | 100 | 60.0 | 36.40 | 30.25 |" in text
  assert "| rnn | wall_600s | 100 | 10.0 | 30.00 |  |" in text
  assert "| run | 0-9 words (600) | 10-19 words (400) |" in text
  assert "| tfm | 45.00 |  |" in text
  assert plots == [scoring_report.BY_LENGTH_PLOT, scoring_report.BY_WALL_PLOT]
  for name in plots:
    with open(tmp_path / name, "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  assert json.loads((tmp_path / "scores.json").read_text()) == rows


def test_report_of_summaries_and_of_tuning(tmp_path):
  """Summaries' rows carry ROUGE, not BLEU: their table shows the metrics asked for, no plot."""
  row = lambda ck, r1, lp: {"workdir": "w/aeslc", "checkpoint": ck, "split": "dev" if lp is not
                            None else "test", "beam_size": 4, "rouge1": r1, "rouge2": r1 / 3,
                            "step": 7, "wall_s": 60.0, **({} if lp is None else
                                                          {"length_penalty": lp})}
  rows = [row("best", 24.0, None), row("wall_60s", 20.0, None)]
  tuning = [row("best", 22.0, 0.0), row("best", 23.5, 0.6)]
  text, plots = scoring_report.write(rows, str(tmp_path), ("rouge1", "rouge2"), tuning,
                                     ("length_penalty",))
  assert "| run | checkpoint | step | training min | test rouge1 (beam 4) | test rouge2 (beam 4) |" \
      in text
  assert "| aeslc | best | 7 | 1.0 | 24.00 | 8.00 |" in text
  assert "| run | split | length_penalty | rouge1 | rouge2 |" in text
  assert "| aeslc | dev | 0.6 | 23.50 | 7.83 |" in text
  assert plots == []
  assert json.loads((tmp_path / "tuning.json").read_text()) == tuning


def test_tuning_chooses_on_the_tuning_split(marked_run, monkeypatch):
  workdir, _ = marked_run
  split = json.loads(open(os.path.join(workdir, "config.json")).read())["data"]["eval_split"]
  grid = {"length_penalty": (0.0, 2.0), "min_decode_len": (1, 6)}
  chosen, rows = scoring.tune_search(workdir, split, grid, "bleu", beam_size=2)
  assert [(r["length_penalty"], r["min_decode_len"]) for r in rows] == [
      (0.0, 1), (0.0, 6), (2.0, 1), (2.0, 6)]
  best = max(rows, key=lambda r: r["bleu"])
  assert chosen == {"length_penalty": best["length_penalty"],
                    "min_decode_len": best["min_decode_len"]}
  # Each row is the decoding under its own settings: min_decode_len=6 forbids EOS before 6 tokens.
  run = training.load_run(workdir, overrides={"data.test_split": split, "train.beam_size": 2,
                                              "train.min_decode_len": 6})
  hyps = evaluation.decode_split(run, "test", search=run.tc.search())
  assert rows[1]["bleu"] == pytest.approx(
      evaluation.score_outputs(run, "test", hyps)["bleu"], abs=1e-9)
  shortest = min(len(labels) for labels in hyps.tgt_labels.values())
  assert shortest >= 5, (shortest, list(hyps.tgt_labels.values())[:3])
  assert os.path.exists(os.path.join(workdir, "scores", "best",
                                     f"{split}.beam2.length_penalty2.min_decode_len6.json"))

  def refuse(*a, **k):
    raise AssertionError("decoded again")
  monkeypatch.setattr(evaluation, "decode_split", refuse)  # every setting's decoding is kept
  assert scoring.tune_search(workdir, split, grid, "bleu", beam_size=2) == (chosen, rows)
  with pytest.raises(ConfigError, match="no 'rouge1' to choose by"):
    scoring.tune_search(workdir, split, grid, "rouge1", beam_size=2)


@pytest.mark.parametrize("settings,match", [
    (dict(length_penalty=(0.0, 0.6)), "several values of --length_penalty need --tune_split"),
    (dict(min_decode_len=(1, 2)), "several values of --min_decode_len need --tune_split"),
    (dict(tune_split="dev", splits=("dev", "test"), min_decode_len=(1, 2)),
     "--tune_split=dev is also in --splits"),
    (dict(tune_split="dev"), "--tune_split=dev has nothing to choose"),
    (dict(length_penalty=(-1.0,)), "--length_penalty must be >= 0"),
    (dict(min_decode_len=(0,)), "--min_decode_len >= 1"),
])
def test_score_settings_refuse_tuning_mistakes(settings, match):
  with pytest.raises(ConfigError, match=match):
    score_cli.ScoreSettings(workdirs=("w",), **settings)


def test_score_command_refuses_what_it_cannot_score(tmp_path):
  with pytest.raises(ConfigError, match="--workdirs: give at least one"):
    score_cli.ScoreSettings()
  with pytest.raises(ConfigError, match="--beam_size must be >= 0"):
    score_cli.ScoreSettings(workdirs=("w",), beam_size=-1)
  with pytest.raises(ConfigError, match="has no results.json: not a finished run"):
    score_cli.entry_points.finished_experiment(str(tmp_path), tuple(score_cli.table_metrics()))


# -- data that moved keeps its vocabularies


def _files(directory, text):
  os.makedirs(directory, exist_ok=True)
  for lang in ("de", "en"):
    with gzip.open(os.path.join(directory, f"train.{lang}.gz"), "wt") as f:
      f.write(text)


def test_same_training_files(tmp_path):
  old, same, other = tmp_path / "old", tmp_path / "same", tmp_path / "other"
  _files(old, "ein hund\n")
  _files(same, "ein hund\n")
  _files(other, "zwei hunde\n")
  assert vocab_record.same_training_files(str(old), str(same), "train")
  assert not vocab_record.same_training_files(str(old), str(other), "train")
  assert not vocab_record.same_training_files(str(tmp_path / "gone"), str(same), "train")
  assert not vocab_record.same_training_files(str(old), str(same), "val")  # no val.* there


def test_vocab_check_accepts_moved_data_and_refuses_other_data(tmp_path):
  from attn.data.config import DataConfig
  from attn.data import pipeline  # registers the sources
  from attn.data.base import SOURCES
  old, moved, other, workdir = (tmp_path / n for n in ("old", "moved", "other", "wd"))
  _files(old, "ein hund\n")
  _files(moved, "ein hund\n")
  _files(other, "zwei hunde\n")
  os.makedirs(workdir)
  cfg = lambda d: DataConfig(task="parallel_text", dir=str(d), src_lang="de", tgt_lang="en")
  source = SOURCES.get("parallel_text")(cfg(old))
  vocab_record.write(cfg(old), source, str(workdir))
  (workdir / "vocab.src.json").write_text("{}")
  vocab_record.check(cfg(moved), source, str(workdir))  # the same files elsewhere: accepted
  with pytest.raises(DataError, match="data.dir=.*old.* there, .*other.* here"):
    vocab_record.check(cfg(other), source, str(workdir))


# -- a cached decoding is keyed by what it depends on


def _corpus(directory, test_lines):
  """A parallel_text corpus in `directory`: 64 training pairs (the same in every corpus made
  here, so a run's vocabularies accept any of them), 8 validation pairs, `test_lines` test pairs."""
  os.makedirs(directory, exist_ok=True)
  words = ["ein", "hund", "katze", "haus", "baum", "rot", "blau", "gross"]
  pairs = lambda n, off: [" ".join(words[(i + j + off) % 8] for j in range(3)) for i in range(n)]
  for split, lines in (("train", pairs(64, 0)), ("val", pairs(8, 1)),
                       ("test", pairs(test_lines, 2))):
    for lang in ("de", "en"):
      with open(os.path.join(directory, f"{split}.{lang}"), "w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))


def test_a_cached_decoding_is_not_reused_for_other_data(tmp_path, monkeypatch):
  small, large, workdir = (str(tmp_path / n) for n in ("small", "large", "wd"))
  _corpus(small, 6)
  _corpus(large, 13)
  config = translate_config.get_config("smoke")
  config.data.update(dict(task="parallel_text", dir=small, src_lang="de", tgt_lang="en",
                          train_split="train", eval_split="val", test_split="test",
                          num_buckets=1, cache_dir=str(tmp_path / "cache")))
  config.train.update(dict(steps=2, eval_every=2, checkpoint_every=2, log_every=1))
  training.train_and_evaluate(config, workdir)
  on_small = scoring.score_workdir(workdir, which="best")
  assert on_small[0]["sentences"] == 6
  # The other directory's test split: decoded, not the small one's cached scores.
  on_large = scoring.score_workdir(workdir, which="best", data_dir=large)
  assert on_large[0]["sentences"] == 13
  with pytest.raises(ConfigError, match=r"^data_dir=\S+gone: no such directory"):
    scoring.score_workdir(workdir, which="best", data_dir=str(tmp_path / "gone"))
  # Each is decoded again when the data it was cached for changed under it...
  _corpus(large, 11)
  assert scoring.score_workdir(workdir, which="best", data_dir=large)[0]["sentences"] == 11
  assert scoring.score_workdir(workdir, which="best")[0]["sentences"] == 6
  # ... and read back, not decoded again, while nothing changed.
  def refuse(*a, **k):
    raise AssertionError("decoded again")
  monkeypatch.setattr(evaluation, "decode_split", refuse)
  assert scoring.score_workdir(workdir, which="best")[0]["sentences"] == 6


def test_tuning_on_the_split_scored_by_default_is_refused(marked_run):
  """A built-in task (the smoke run's) decodes its own test split whatever split is named: its
  recorded data.test_split (test_2016_flickr) is not what it is scored on, and tuning on any split
  would choose on the split it is scored on."""
  workdir, _ = marked_run
  recorded = json.loads(open(os.path.join(workdir, "config.json")).read())["data"]
  assert recorded["test_split"] != "test"  # the name the check used to compare against
  for tune in ("test", recorded["test_split"], recorded["eval_split"]):
    with pytest.raises(ConfigError, match=(
        rf"^--tune_split={tune} is what {workdir} is scored on, its own test split "
        rf"\(data.test_split={recorded['test_split']}\), which is scored when --splits is not "
        rf"given: data.task={recorded['task']} decodes its own 'test' split whatever split is "
        "named")):
      scoring.check_tune_split([workdir], tune)
  with pytest.raises(ConfigError, match="scored on, --splits=dev: data.task="):
    scoring.check_tune_split([workdir], "test", ("dev",))
  scoring.check_tune_split([workdir], "")  # no tuning: nothing to refuse


def test_tuning_on_a_built_in_tasks_test_split_is_one_line_before_any_decoding(marked_run,
                                                                              tmp_path):
  """As a new user tried it: the smoke run, --tune_split=test and the default --splits."""
  workdir, _ = marked_run
  out = tmp_path / "scores"
  p = subprocess.run([sys.executable, "-m", "experiments.score", f"--workdirs={workdir}",
                      "--beam_size=2", "--tune_split=test", "--length_penalty=0,1",
                      f"--out={out}"],
                     cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                     capture_output=True, text=True, timeout=300)
  lines = p.stderr.strip().splitlines()
  assert p.returncode == 2 and len(lines) == 1, p.stderr[-2000:]
  assert lines[0].startswith(f"error: --tune_split=test is what {workdir} is scored on, its own "
                             "test split (data.test_split=test_2016_flickr)"), lines
  assert "chosen on" not in p.stdout and not out.exists()
  assert not any(name.startswith("test.beam2.length_penalty")  # nothing decoded on --tune_split
                 for _, _, names in os.walk(workdir) for name in names)


@pytest.mark.parametrize("flag,bad", [("splits", "../../../x"), ("splits", "test,sub/x"),
                                      ("tune_split", "..")])
def test_a_split_that_is_a_path_is_one_line_before_anything_is_written(marked_run, tmp_path,
                                                                       flag, bad):
  # Before: --splits=../../../x decoded the run's test split and wrote x.beam2.json three
  # directories above <run>/scores/best, outside the run.
  workdir, _ = marked_run
  before = sorted(os.walk(os.path.dirname(workdir)))
  out = tmp_path / "scores"
  args = [f"--{flag}={bad}"] + (["--length_penalty=0,1"] if flag == "tune_split" else [])
  p = subprocess.run([sys.executable, "-m", "experiments.score", f"--workdirs={workdir}",
                      "--beam_size=2", *args, f"--out={out}"],
                     cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                     capture_output=True, text=True, timeout=300)
  lines = p.stderr.strip().splitlines()
  assert p.returncode == 2 and len(lines) == 1, p.stderr[-2000:]
  name = next(n for n in bad.split(",") if "/" in n or n == "..")
  assert lines[0] == (f"error: --{flag}={bad}: {name!r} is not a split name: a split is named "
                      "plainly (no path separator, not '.' or '..'), e.g. test_2016_flickr")
  assert sorted(os.walk(os.path.dirname(workdir))) == before and not out.exists()
  with pytest.raises(ConfigError, match="'a/b' is not a split name"):
    scoring.check_split_names(["a/b"], "splits")
  scoring.check_split_names(["test_2016_flickr", "dev", "test"], "splits")  # plain names pass


@pytest.mark.parametrize("corpus", ["multi30k", "tmp"])
def test_tuning_on_a_corpus_split_is_refused_only_where_it_is_scored(tmp_path, corpus):
  """A corpus decodes the split named: tuning is refused on the split scored (the recorded
  data.test_split without --splits, else one of --splits), and accepted on any other. The check
  reads the run's config.json alone."""
  config = translate_config.get_config("multi30k")
  if corpus == "tmp":
    _corpus(str(tmp_path / "data"), 4)
    config.data.update(dict(dir=str(tmp_path / "data"), eval_split="val", test_split="test"))
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / "config.json").write_text(json.dumps(config.to_dict(), default=list))
  workdir, test = str(workdir), config.data.test_split
  with pytest.raises(ConfigError, match=rf"^--tune_split={test} is what {workdir} is scored on, "
                     rf"its own test split \(data.test_split={test}\), which is scored when "
                     "--splits is not given: the settings would be chosen on the split they are "
                     "scored on; tune on another split"):
    scoring.check_tune_split([workdir], test)
  with pytest.raises(ConfigError, match=rf"is what .* is scored on, --splits=other,{test}: "):
    scoring.check_tune_split([workdir], test, ("other", test))
  scoring.check_tune_split([workdir], "val")  # another split: accepted
  scoring.check_tune_split([workdir], test, ("other",))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_length_penalty_that_is_not_a_number_is_refused(bad):
  with pytest.raises(ConfigError, match="--length_penalty must be finite numbers"):
    score_cli.ScoreSettings(workdirs=("w",), length_penalty=(bad, 0.6), tune_split="dev")
  with pytest.raises(ConfigError, match=r"train.length_penalty=(nan|-?inf) must be a finite"):
    TrainConfig(length_penalty=bad)
  with pytest.raises(ConfigError, match=r"train.max_decode_ratio=(nan|-?inf) must be a finite"):
    TrainConfig(max_decode_ratio=bad)


def test_a_min_decode_len_no_output_can_reach_is_one_line(marked_run):
  workdir, _ = marked_run
  with pytest.raises(ConfigError, match=r"^min_decode_len=500 is over the \d+ tokens decoded "
                     r"for the test split's sources of \d+ tokens \(train.max_decode_ratio="):
    scoring.score_workdir(workdir, which="best", search={"min_decode_len": 500})


@pytest.mark.parametrize("module,args,message", [
    ("experiments.score", ["--out=x"], "error: --workdirs: give at least one finished run"),
    ("experiments.average", [], "error: --workdirs: give at least one finished run"),
])
def test_score_and_average_without_workdirs_say_so_in_one_line(module, args, message):
  p = subprocess.run([sys.executable, "-m", module, *args], cwd=os.path.dirname(
      os.path.dirname(os.path.abspath(__file__))), capture_output=True, text=True, timeout=300)
  assert p.returncode == 2 and p.stderr.strip().splitlines() == [message], p.stderr
