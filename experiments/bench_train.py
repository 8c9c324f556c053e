r"""Training throughput of a seq2seq config on real batches, per compute dtype, against the bare
matmul ceiling of each dtype measured in the same run. The config may be of any application
whose task is sequence to sequence (translate, summarize, caption): the application registry
says whose it is by its data section, and that task's step is timed; any other config is refused
in one line naming those applications.

    python -m experiments.bench_train --config=experiments/configs/translate.py:multi30k \
        --config.model.rnn.decoder=bahdanau --compute_dtypes=float32,bfloat16,auto --steps=20 \
        --rounds=2

--compute_dtypes defaults to `auto`, resolved as a training run resolves train.compute_dtype=auto
(attn.training.dtype_choice: the model's own matmul shapes timed in both dtypes on this machine,
or the cached rates); its row says which dtype it chose, e.g. `auto (bfloat16)`; an empty
--compute_dtypes= times the config's own train.compute_dtype. Compiles every bucket shape first,
runs the batches once untimed, then times the same --steps
training batches per dtype, round-robin over the dtypes (--rounds), with the load average and
the same-run matmul ceiling printed beside every figure. --shape_ceiling also times every
distinct matmul of the traced step alone at its own shapes (attn.benchmarks.shape_ceiling): two
more columns say the rate those matmuls reach alone and the share of the step's time they take at
it, which splits a step's distance from the n x n ceiling into its shapes' and its own
overhead's. The flags besides --config are the
fields of attn.benchmarks.train_throughput.Settings (their defaults and help live there), and
that library's docstring says what each figure means.
"""

from absl import flags
from ml_collections import config_flags

import attn.apps  # noqa: F401  (registers the built-in applications)
from attn.benchmarks import train_throughput
from attn.launching import cli

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", "experiments/configs/translate.py:multi30k",
                                "Experiment config (path.py:preset).", lock_config=True)


def main(argv):
  del argv
  train_throughput.run(FLAGS.config, cli.settings_from_flags(train_throughput.Settings))


if __name__ == "__main__":
  cli.define_settings_flags(train_throughput.Settings)
  cli.run(main)
