r"""Decoding speed of a finished run whose task decodes (translate, summarize, caption, and any
application registered later whose task is a Seq2SeqTask): greedy and beam search over a whole
split, beside the task's own score.

    python -m experiments.bench_decode --workdir=workdirs/m30k_bahdanau --split=test \
        --beam_sizes=1,5 --json_out=workdirs/m30k_bahdanau/decode_speed.json

Restores the run (its best checkpoint), decodes the split once per beam size (and beam search
stop rule, --stops=bound,k_finished) untimed (compiling every batch shape), then times decoding
the whole split for each (--rounds passes, round-robin), and prints and writes {"application",
"score", "sentences", "load", "ceiling_gflop_per_s", "results": [{"beam_size", "stop",
"decode_s", "sentences_per_s", <score>, "mean_words", "words_per_s", "compile_s", "matmul_gflop",
"matmul_gflop_per_s", "percent_of_ceiling", "decode_s_at_ceiling", "step_alone"}, ...]},
where "score" names the task's own score (the first of its `scores`: bleu, rouge1,
digit_accuracy) and each result holds it under that name; "matmul_gflop" is the work along the
outputs (None where the model has no analytic count), the ceiling is the bare matmul's in the
run's compute dtype, and "step_alone" is the model's decoding step timed apart from the search
at the beam size's rows ({"rows", "source_width", "steps", "step_ms", "step_gflop",
"step_gflop_per_s", "percent_of_ceiling"}; None with --step_steps=0). The flags
are the fields of attn.benchmarks.decode_speed.Settings (defaults and help live there); a
missing workdir, an unfinished run, a run whose task decodes nothing (recommend, retrieve,
focus) or a --json_out it cannot write (checked before anything runs) exits with status 2 and
one `error:` line.
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
