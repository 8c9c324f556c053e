r"""Train and evaluate a seq2seq model with or without attention.

    python -m experiments.translate --config=experiments/configs/translate.py:multi30k \
        --config.model.rnn.decoder=bahdanau --config.model.rnn.score=additive \
        --workdir=workdirs/m30k

Several devices: every local device goes on the data axis (`--config.train.mesh_shape` picks
another mesh). Several hosts: `--distributed=auto` inside a Slurm job or on a Cloud TPU pod, or
`--coordinator_address=HOST:PORT --num_processes=N --process_id=I` on each process; every
process gets the same flags and --workdir (on a shared filesystem); see docs/scale.md.

Rerunning with the same --workdir resumes from its latest checkpoint. Writes config.json,
metrics.jsonl (+ TensorBoard events), checkpoints/, best/, predictions.txt, results.json,
attention.npz and attention.png into the workdir. Bad input (missing files, mismatched line
counts, unknown variant names) exits with status 2 and one `error:` line before any training.
"""

from absl import flags
from ml_collections import config_flags

from attn.launching import cli

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", "experiments/configs/translate.py:multi30k",
                                "Experiment config (path.py:preset).", lock_config=True)
flags.DEFINE_string("workdir", None, "Output directory (resumes if it holds a checkpoint).")
flags.mark_flags_as_required(["workdir"])
cli.define_distributed_flags()


def validate_config(config):
  """The checks train_and_evaluate makes before touching a workdir (launch.py runs them on every
  combination of a sweep before starting any)."""
  from attn import training  # pylint: disable=import-outside-toplevel
  training.validate_config(config, task="translate")


def main(argv):
  del argv
  cli.train_and_report(FLAGS.config, FLAGS.workdir, task="translate")


if __name__ == "__main__":
  cli.run(main)
