r"""Scores finished runs on every test split, with best/ and the checkpoints kept at time marks.

    # every final model on Multi30k's four test sets (get_data multi30k wrote them to data/)
    python -m experiments.score --workdirs=workdirs/m30k_bahdanau,workdirs/m30k_transformer \
        --splits=test_2016_flickr,test_2017_flickr,test_2017_mscoco,test_2018_flickr \
        --data_dir=data/multi30k --beam_size=5 --out=workdirs/scores
    # BLEU at equal wall time: runs trained with --config.train.mark_wall_s=600,1800,3600
    python -m experiments.score --workdirs=workdirs/rnn_hour,workdirs/tfm_hour --checkpoints=both \
        --beam_size=5 --out=workdirs/scores_wall
    # AESLC: length penalty and minimum length chosen on dev, then the test split decoded so
    python -m experiments.score --workdirs=workdirs/aeslc_test --splits=test --tune_split=dev \
        --length_penalty=0,0.6,1 --min_decode_len=1,2,3 --beam_size=4 --out=workdirs/aeslc_scores

Writes into --out: scores.md (every run and checkpoint on every split; BLEU by source length in
words on the first split, with each bucket's sentence count; the settings tried on --tune_split),
scores.json (the rows), tuning.json (the rows on --tune_split), and the
plots bleu_by_src_words.png (Bahdanau et al. 2015's Fig. 2 by bucket: each run's best/ on the
first split) and, with marks, bleu_vs_wall.png. Each decoding is kept in the run's
`scores/<checkpoint>/<split>.beam<K>.{json,txt}`: a rerun decodes only what is missing
(--force decodes again). Every checkpoint scored was chosen on the eval split only. See
attn/training/scoring.py.
"""

from __future__ import annotations

import dataclasses
import functools
import math

from absl import flags

import attn.apps  # noqa: F401  (registers the built-in applications)
from attn.config.configurable import option
from attn.errors import ConfigError
from attn.launching import cli, entry_points



def table_metrics() -> dict[str, tuple[str, ...]]:
  """{experiment: the metrics its tables show} of the experiments scored here: those whose task
  names them (`Seq2SeqTask.rescored`; the first chooses decoding settings on --tune_split)."""
  out = {}
  for name, exp in entry_points.EXPERIMENTS.items():
    rescored = getattr(exp.task_class, "rescored", ())
    if rescored:
      out[name] = rescored
  return out


@dataclasses.dataclass(frozen=True)
class ScoreSettings:
  """The flags of `python -m experiments.score`."""
  workdirs: tuple[str, ...] = option((), "Finished runs (translate or summarize), comma-separated.")
  splits: tuple[str, ...] = option(
      (), "Splits of each run's data to score, by plain name (e.g. Multi30k's test_2016_flickr, "
          "test_2017_flickr, test_2017_mscoco, test_2018_flickr); default: each run's own test "
          "split.")
  checkpoints: str = option(
      "best", "Comma-separated: best (best/), marks (those kept at train.mark_wall_s), averaged "
              "(experiments.average's); both = best,marks; all.")
  beam_size: int = option(0, "Beam size (1 = greedy); 0 = each run's train.beam_size.")
  data_dir: str = option("", "The data directory holding the splits (default: each run's "
                             "recorded data.dir).")
  length_bucket: int = option(5, "Width, in source words, of the BLEU-by-length buckets.")
  min_bucket: int = option(50, "Sentences the first and last length buckets hold at least (the "
                               "sparse ends are merged into their neighbours).")
  length_penalty: tuple[float, ...] = option(
      (), "GNMT length penalties (alpha) to decode with; several need --tune_split. Default: each "
          "run's train.length_penalty.")
  min_decode_len: tuple[int, ...] = option(
      (), "Fewest tokens a decoding emits (EOS counted); several need --tune_split. Default: each "
          "run's train.min_decode_len.")
  tune_split: str = option(
      "", "A split (e.g. dev) on which best/ is decoded with every combination of "
          "--length_penalty and --min_decode_len; the combination scoring highest there (BLEU, "
          "or ROUGE-1 for summaries) decodes --splits. Never a split scored: one of --splits, "
          "or a run's own test split without them (a built-in task decodes its own test split "
          "whatever split is named).")
  force: bool = option(False, "Decode again what a run's scores/ already holds.")
  out: str | None = option(None, "Directory for scores.md, scores.json and the plots.")

  def __post_init__(self):
    if not self.workdirs:
      raise ConfigError("--workdirs: give at least one finished run")
    if self.beam_size < 0:
      raise ConfigError(f"--beam_size must be >= 0, got {self.beam_size}")
    several = [n for n in ("length_penalty", "min_decode_len") if len(getattr(self, n)) > 1]
    if several and not self.tune_split:
      raise ConfigError(f"several values of --{several[0]} need --tune_split, the split that "
                        "chooses among them (e.g. dev)")
    if self.tune_split and not (self.length_penalty or self.min_decode_len):
      raise ConfigError(f"--tune_split={self.tune_split} has nothing to choose: give values of "
                        "--length_penalty and/or --min_decode_len")
    if self.tune_split and self.tune_split in self.splits:
      raise ConfigError(f"--tune_split={self.tune_split} is also in --splits: the settings would "
                        "be chosen on the split they are scored on")
    if not all(math.isfinite(x) for x in self.length_penalty):
      raise ConfigError(f"--length_penalty must be finite numbers, got {self.length_penalty}")
    if any(x < 0 for x in self.length_penalty) or any(x < 1 for x in self.min_decode_len):
      raise ConfigError(f"--length_penalty must be >= 0 and --min_decode_len >= 1, got "
                        f"{self.length_penalty} and {self.min_decode_len}")
    if self.length_bucket < 1 or self.min_bucket < 1:
      raise ConfigError(f"--length_bucket and --min_bucket must be >= 1, got "
                        f"{self.length_bucket} and {self.min_bucket}")


def _grid(settings: ScoreSettings) -> dict:
  return {n: getattr(settings, n) for n in ("length_penalty", "min_decode_len")
          if getattr(settings, n)}


def main(argv):
  del argv
  settings = cli.settings_from_flags(ScoreSettings)
  table = table_metrics()
  tasks = entry_points.finished_experiments(settings.workdirs, tuple(table))
  # pylint: disable-next=import-outside-toplevel  (after flag parsing: jax, the data libraries)
  from attn.training import scoring, scoring_report
  scoring.check_split_names(settings.splits, "splits")  # (its files go to each run's scores/)
  if settings.tune_split:
    scoring.check_split_names([settings.tune_split], "tune_split")
  scoring.check_tune_split(tasks, settings.tune_split, settings.splits)
  progress = functools.partial(print, flush=True)
  metrics = tuple(dict.fromkeys(m for t in tasks.values() for m in table[t]))
  grid = _grid(settings)
  rows, tuning = [], []
  for workdir, task in tasks.items():
    common = dict(beam_size=settings.beam_size, data_dir=settings.data_dir, task=task,
                  buckets=(settings.length_bucket, settings.min_bucket), force=settings.force,
                  progress=progress)
    search = {n: v[0] for n, v in grid.items()}
    if settings.tune_split:
      search, tried = scoring.tune_search(workdir, settings.tune_split, grid,
                                          table[task][0], **common)
      tuning += tried
      progress(f"{workdir}: chosen on {settings.tune_split}: "
               + ", ".join(f"{n} {v:g}" for n, v in search.items()))
    rows += scoring.score_workdir(workdir, splits=settings.splits, which=settings.checkpoints,
                                  search=search, **common)
  text, plots = scoring_report.write(rows, settings.out, metrics, tuning, tuple(grid))
  print(text)
  print(f"wrote {settings.out}/scores.md, scores.json" + "".join(f", {p}" for p in plots))


if __name__ == "__main__":
  cli.define_settings_flags(ScoreSettings)
  flags.mark_flags_as_required(["out"])  # (--workdirs: ScoreSettings refuses none, in one line)
  cli.run(main)
