r"""What each encoder self-attention variant solves and what it costs, against the length T.

    python -m experiments.variant_costs                 # the figure run (~15 min on 2 idle cores)
    python -m experiments.variant_costs --lengths=256,512 --quality_lengths=64 --train_steps=20

Global, window, top-k, linear and fused attention in the Transformer encoder: a training step's
time and peak memory, one attention layer's, and associative-recall accuracy and attention on
the gold position. The flags are the fields of attn.benchmarks.variant_costs.Settings (their
defaults and help live there, and the library's docstring says what each figure means), plus
--out. Writes --out/variant_costs.md (command, machine, table), variant_costs.json (every
number) and variant_costs.png.
"""

import shlex
import sys

from absl import flags

from attn.benchmarks import harness, variant_costs
from attn.launching import cli

FLAGS = flags.FLAGS


def main(argv):
  del argv
  # Read when the CPU backend starts (the first computation), which is after this line.
  harness.disable_cpu_ynn_fusion()
  s = cli.settings_from_flags(variant_costs.Settings)  # a bad flag ends here, before measuring
  command = "python -m experiments.variant_costs " + " ".join(shlex.quote(a) for a in sys.argv[1:])
  result = variant_costs.run(s, FLAGS.out, command)
  print()
  print(result["table"])


if __name__ == "__main__":
  cli.define_settings_flags(variant_costs.Settings)
  flags.DEFINE_string("out", "workdirs/variant_costs", "Output directory.")
  cli.run(main)
