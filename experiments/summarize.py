r"""Train and evaluate a summarization model: seq2seq with attention, the pointer-generator, and
coverage (See et al. 2017).

    python -m experiments.summarize --config=experiments/configs/summarize.py:aeslc \
        --config.model.rnn.pointer=True --workdir=workdirs/aeslc_pg
    # coverage for a last phase: the same workdir, coverage on, more steps
    python -m experiments.summarize --config=experiments/configs/summarize.py:aeslc \
        --config.model.rnn.pointer=True --config.model.rnn.coverage=True \
        --config.train.steps=22000 --workdir=workdirs/aeslc_pg

Data: `data.dir` holds `<split>.jsonl[.gz]` with the fields `data.source_field` (email) and
`data.target_field` (subject); `data.reference_fields` names extra references used only for
scoring. The TFDS presets (cnn_dailymail, xsum, gigaword, aeslc_tfds) read prepared
array_record datasets. The same workdir layout and resume as experiments/translate.py:
results.json (rouge1/rouge2/rougeL F1 x100 on the test split, the mean over each example's
references, and *_max the best reference; the copy figures; params; wall_s), predictions.txt
(one summary a line, in test order), attention.npz/png, checkpoints/ and best/. A malformed
JSON line or a missing field exits with status 2 and one line naming file, line and field.
"""

from absl import flags
from ml_collections import config_flags

from attn.launching import cli

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", "experiments/configs/summarize.py:aeslc",
                                "Experiment config (path.py:preset).", lock_config=True)
flags.DEFINE_string("workdir", None, "Output directory (resumes if it holds a checkpoint).")
flags.mark_flags_as_required(["workdir"])
cli.define_distributed_flags()


def validate_config(config):
  """The checks train_and_evaluate makes before touching a workdir (launch.py runs them on every
  combination of a sweep before starting any)."""
  from attn import training  # pylint: disable=import-outside-toplevel
  training.validate_config(config, task="summarize")


def main(argv):
  del argv
  cli.train_and_report(FLAGS.config, FLAGS.workdir, task="summarize")


if __name__ == "__main__":
  cli.run(main)
