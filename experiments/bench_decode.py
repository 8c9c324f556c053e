r"""Decoding speed of a finished translate run: greedy and beam search over a whole split.

    python -m experiments.bench_decode --workdir=workdirs/m30k_bahdanau --split=test \
        --beam_sizes=1,5 --json_out=workdirs/m30k_bahdanau/decode_speed.json

Restores the run (its best checkpoint), decodes the split once per beam size (and beam search
stop rule, --stops=bound,k_finished) untimed (compiling every batch shape), then times decoding
the whole split for each (--rounds passes, round-robin), and prints and writes {"sentences",
"load", "results": [{"beam_size", "stop", "decode_s", "sentences_per_s", "bleu", "mean_words",
"words_per_s", "compile_s"}, ...]}. The flags are the
fields of attn.benchmarks.decode_speed.Settings (defaults and help live there); a missing
workdir or an unfinished run exits with status 2 and one `error:` line.
"""

from absl import flags

import attn.apps  # noqa: F401  (registers the built-in applications)
from attn.benchmarks import decode_speed
from attn.launching import cli

FLAGS = flags.FLAGS


def main(argv):
  del argv
  decode_speed.run(cli.settings_from_flags(decode_speed.Settings))


if __name__ == "__main__":
  cli.define_settings_flags(decode_speed.Settings)
  cli.run(main)
