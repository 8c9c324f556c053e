r"""Next-item recommendation (SASRec-style self-attention over a user's history, against a
mean-pooling and a GRU baseline) on a generated interaction log whose planted trigger items fix
a later item, so it is known which past item each prediction should attend to.

    python -m experiments.recommend --config=experiments/configs/recommend.py:default \
        --config.model.kind=sasrec --workdir=workdirs/rec_sasrec

It trains through the one training loop (attn.training.loop): rerunning with the same
--workdir resumes from its latest checkpoint, Ctrl-C saves the current step first, and a loss
that diverges stops the run before anything after it is saved. Writes config.json,
model.json, metrics.jsonl (+ TensorBoard events), checkpoints/, best/, results.json (hr10,
ndcg10, both by history length, attention on the planted trigger) and attention.npz (for
`python -m experiments.inspect --workdir=...`). A bad config value exits with status 2 and one
`error:` line before anything is written.
"""

from absl import flags

import attn.apps  # noqa: F401  (registers the built-in applications)
from attn.launching import cli

cli.define_training_flags("experiments/configs/recommend.py:default")


def validate_config(config):
  """The checks train_and_evaluate makes before touching the workdir (launch.py runs them on
  every combination of a sweep first)."""
  from attn.apps.recommend import task  # pylint: disable=import-outside-toplevel
  task.validate_config(config)


def main(argv):
  del argv
  # pylint: disable-next=import-outside-toplevel  (after flag parsing)
  from attn.apps.recommend import report
  from attn.training import loop  # pylint: disable=import-outside-toplevel
  results = loop.train_and_evaluate(flags.FLAGS.config, flags.FLAGS.workdir, task="recommend")
  print(report.results_table([(results["model"], results)]))


if __name__ == "__main__":
  cli.run(main)
