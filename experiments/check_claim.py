r"""Check a headline figure on your own machine in about ten minutes: train the first steps of the
run behind it and compare its curve with the recorded one.

    python -m experiments.check_claim                      # lists the recorded claims
    python -m experiments.check_claim multi30k_subword --data_dir=data/multi30k
    python -m experiments.check_claim multi30k_subword --steps=300 --config.train.seed=1

A claim is a finished run's recorded curve, docs/results/curves/<name>.jsonl
(attn.launching.claim_records says what it holds). The check trains the recorded config for its first --steps steps (default:
about 10 minutes on the 2-core machine that recorded it) in a temporary workdir, with the recorded
schedule (the run just stops early), and prints the loss at every logged step and the first
evaluation's metrics side by side with the record: step, recorded, this run, difference, the
measured tolerance, within. It exits 0 when the run holds to the record and 1 when it departs,
naming the first step where it did. A multi-phase claim (several commands on one workdir) is
checked on its first phase's prefix. --config.KEY=VALUE overrides the recorded config (a
departing run: --config.train.learning_rate=...); --data_dir replaces data.dir.

Recording a claim from a finished run (the command that ran it, once per phase, in order), then
measuring its tolerance (the spread of the same prefix over seeds and compute dtypes, written into
the record; a check needs it):

    python -m experiments.check_claim --record=multi30k_subword --workdir=workdirs/subword \
        --command="python -m experiments.translate \
            --config=experiments/configs/translate.py:multi30k_subword \
            --config.data.dir=data/multi30k --workdir=workdirs/subword"
    python -m experiments.check_claim multi30k_subword --measure_tolerance \
        --seeds=0,1,2 --dtypes=float32,bfloat16 --data_dir=data/multi30k

An unknown claim, a bad --steps (below 1, beyond the recorded steps) or a workdir that holds no
finished run is one `error:` line (exit 2). The other flags are the fields of
attn.launching.claims.Settings.
"""

import sys

from absl import flags

import attn.apps  # noqa: F401  (registers the built-in applications)
from attn.launching import claim_records, claims, cli

FLAGS = flags.FLAGS
DEPARTED = 1  # the exit status of a run that departs from its record


def split_overrides(argv):
  """(argv without its --config.KEY=VALUE words, [(KEY, VALUE), ...]): the overrides apply to the
  claim's recorded config, which is known only once the claim is read."""
  rest, overrides = [], []
  for word in argv:
    if word.startswith("--config.") and "=" in word:
      key, value = word[len("--config."):].split("=", 1)
      overrides.append((key, value))
    else:
      rest.append(word)
  return rest, overrides


OVERRIDES = []


def main(argv):
  from attn.benchmarks.harness import cpu_info  # pylint: disable=import-outside-toplevel
  s = cli.settings_from_flags(claims.Settings)
  names = argv[1:]
  if len(names) > 1:
    cli.fail(f"one claim at a time; got {', '.join(names)}")
  if s.record:
    if names:
      cli.fail(f"--record={s.record} records a run; it takes no claim name ({names[0]})")
    if not s.workdir:
      cli.fail("--record needs --workdir (the finished run)")
    path = claim_records.record(s.record, s.workdir, FLAGS.command or (), s.curves_dir, cpu=cpu_info())
    print(f"recorded {path}; measure its tolerance next: python -m experiments.check_claim "
          f"{s.record} --measure_tolerance")
    return 0
  if not names:
    known = claim_records.known_claims(s.curves_dir)
    print(f"claims in {s.curves_dir}: " + (", ".join(known) if known else "none recorded yet"))
    return 0
  if s.measure_tolerance:
    tol = claims.measure_tolerance(names[0], s.curves_dir, seeds=s.seeds, dtypes=s.dtypes,
                                   steps=s.steps, overrides=OVERRIDES, data_dir=s.data_dir,
                                   cpu=cpu_info())
    worst = max((t for _, t in tol["loss"]), default=0.0)
    print(f"claim {names[0]}: tolerance measured over {len(tol['runs'])} runs of "
          f"{tol['steps']} steps (seeds {tol['seeds']}, dtypes {tol['dtypes']}): loss band up "
          f"to {worst:.4f}, relative {tol['loss_relative']:.4f}; written to the record")
    return 0
  result = claims.check(names[0], s.curves_dir, steps=s.steps, overrides=OVERRIDES,
                        data_dir=s.data_dir)
  print(result.report())
  return DEPARTED if result.departed is not None else 0


if __name__ == "__main__":
  cli.define_settings_flags(claims.Settings)
  flags.DEFINE_multi_string("command", None, "with --record: the command that ran the claim, "
                            "once per phase, in order")
  sys.argv, OVERRIDES[:] = split_overrides(sys.argv)
  cli.run(main)
