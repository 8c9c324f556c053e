r"""Train and evaluate a seq2seq model with or without attention (issue: seq2seq/translate).

    python -m experiments.translate --config=experiments/configs/translate.py:multi30k \
        --config.model.decoder=bahdanau --config.model.score=additive --workdir=workdirs/m30k

Rerunning with the same --workdir resumes from its latest checkpoint. Writes config.json,
metrics.jsonl (+ TensorBoard events), checkpoints/, best/, predictions.txt, results.json,
attention.npz and attention.png into the workdir. Bad input (missing files, mismatched line
counts, unknown variant names) exits non-zero with one line before any training.
"""

import logging
import sys

from absl import app, flags
from ml_collections import config_flags

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", "experiments/configs/translate.py:multi30k",
                                "Experiment config (path.py:preset).", lock_config=True)
flags.DEFINE_string("workdir", None, "Output directory (resumes if it holds a checkpoint).")
flags.mark_flags_as_required(["workdir"])


def main(argv):
  del argv
  logging.getLogger().setLevel(logging.INFO)
  logging.getLogger("absl").setLevel(logging.WARNING)  # orbax is chatty at INFO
  from attn import train  # pylint: disable=import-outside-toplevel
  from attn.data import DataError  # pylint: disable=import-outside-toplevel
  try:
    results = train.train_and_evaluate(FLAGS.config, FLAGS.workdir)
  except (DataError, ValueError, KeyError, FileNotFoundError) as e:
    msg = e.args[0] if isinstance(e, KeyError) and e.args else e
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)
  print(train.results_table([results]))


if __name__ == "__main__":
  logging.basicConfig(format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
  app.run(main)
