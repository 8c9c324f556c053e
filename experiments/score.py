r"""Scores finished runs on every test split, with best/ and the checkpoints kept at time marks.

    # every final model on Multi30k's four test sets (get_data multi30k wrote them to data/)
    python -m experiments.score --workdirs=workdirs/m30k_bahdanau,workdirs/m30k_transformer \
        --splits=test_2016_flickr,test_2017_flickr,test_2017_mscoco,test_2018_flickr \
        --data_dir=data/multi30k --beam_size=5 --out=workdirs/scores
    # BLEU at equal wall time: runs trained with --config.train.mark_wall_s=600,1800,3600
    python -m experiments.score --workdirs=workdirs/rnn_hour,workdirs/tfm_hour --checkpoints=both \
        --beam_size=5 --out=workdirs/scores_wall

Writes into --out: scores.md (every run and checkpoint on every split; BLEU by source length in
words on the first split, with each bucket's sentence count), scores.json (the rows), and the
plots bleu_by_src_words.png (Bahdanau et al. 2015's Fig. 2 by bucket: each run's best/ on the
first split) and, with marks, bleu_vs_wall.png. Each decoding is kept in the run's
`scores/<checkpoint>/<split>.beam<K>.{json,txt}`: a rerun decodes only what is missing
(--force decodes again). Every checkpoint scored was chosen on the eval split only. See
attn/training/scoring.py.
"""

from __future__ import annotations

import dataclasses
import functools

from absl import flags

from attn.config.configurable import option
from attn.errors import ConfigError
from attn.launching import cli

SCORED_EXPERIMENTS = ("translate", "summarize")


@dataclasses.dataclass(frozen=True)
class ScoreSettings:
  """The flags of `python -m experiments.score`."""
  workdirs: tuple[str, ...] = option((), "Finished runs (translate or summarize), comma-separated.")
  splits: tuple[str, ...] = option(
      (), "Splits of each run's data to score (e.g. Multi30k's test_2016_flickr, "
          "test_2017_flickr, test_2017_mscoco, test_2018_flickr); default: each run's own test "
          "split.")
  checkpoints: str = option("best", "best (best/), marks (those kept at train.mark_wall_s) or "
                                    "both.")
  beam_size: int = option(0, "Beam size (1 = greedy); 0 = each run's train.beam_size.")
  data_dir: str = option("", "The data directory holding the splits (default: each run's "
                             "recorded data.dir).")
  length_bucket: int = option(5, "Width, in source words, of the BLEU-by-length buckets.")
  min_bucket: int = option(50, "Sentences the first and last length buckets hold at least (the "
                               "sparse ends are merged into their neighbours).")
  force: bool = option(False, "Decode again what a run's scores/ already holds.")
  out: str | None = option(None, "Directory for scores.md, scores.json and the plots.")

  def __post_init__(self):
    if not self.workdirs:
      raise ConfigError("--workdirs: give at least one finished run")
    if self.beam_size < 0:
      raise ConfigError(f"--beam_size must be >= 0, got {self.beam_size}")
    if self.length_bucket < 1 or self.min_bucket < 1:
      raise ConfigError(f"--length_bucket and --min_bucket must be >= 1, got "
                        f"{self.length_bucket} and {self.min_bucket}")


def _experiment(workdir: str) -> str:
  import os  # pylint: disable=import-outside-toplevel
  from attn.launching import entry_points  # pylint: disable=import-outside-toplevel
  if not os.path.exists(os.path.join(workdir, "results.json")):
    raise ConfigError(f"{workdir} has no results.json: not a finished run")
  experiment = entry_points.experiment_of(workdir) or "translate"
  if experiment not in SCORED_EXPERIMENTS:
    raise ConfigError(f"{workdir} is a {experiment} run; only {', '.join(SCORED_EXPERIMENTS)} "
                      "runs are scored here")
  return experiment


def main(argv):
  del argv
  settings = cli.settings_from_flags(ScoreSettings)
  tasks = {w: _experiment(w) for w in settings.workdirs}  # every run checked before any work
  # pylint: disable-next=import-outside-toplevel  (after flag parsing: jax, the data libraries)
  from attn.training import scoring, scoring_report
  progress = functools.partial(print, flush=True)
  rows = []
  for workdir, task in tasks.items():
    rows += scoring.score_workdir(
        workdir, splits=settings.splits, which=settings.checkpoints,
        beam_size=settings.beam_size, data_dir=settings.data_dir, task=task,
        buckets=(settings.length_bucket, settings.min_bucket), force=settings.force,
        progress=progress)
  text, plots = scoring_report.write(rows, settings.out)
  print(text)
  print(f"wrote {settings.out}/scores.md, scores.json" + "".join(f", {p}" for p in plots))


if __name__ == "__main__":
  cli.define_settings_flags(ScoreSettings)
  flags.mark_flags_as_required(["workdirs", "out"])
  cli.run(main)
