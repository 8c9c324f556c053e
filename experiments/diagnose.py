r"""Can this run's attention be read as an explanation? Diagnose a finished seq2seq run.

    python -m experiments.diagnose --workdir=workdirs/demo/decoder=bahdanau

Loads the best checkpoint of a finished run (experiments/translate.py), greedy-decodes the first
--max_examples examples of --split and writes into the workdir: diagnose.json (attention entropy,
AER / attention-on-gold and their one-position-shifted readings on built-in tasks, Kendall tau
between the attention and gradient x input, the counterfactual interventions permute / uniform /
zero_top) and diagnose_entropy.png, diagnose_tau.png, diagnose_counterfactual.png; prints a short
table. A Transformer run also gets entropy and the gold-alignment scores per layer and head
(diagnose.json "heads", diagnose_heads.png); its counterfactuals replace the cross-attention of
every layer and head at one output step, and then of each layer alone. See
attn/inspection/diagnosis.py for the definitions. A workdir that is not a finished run, or a run
without attention (decoder=none), exits with status 2 and one `error:` line. The flags are the
fields of attn.inspection.diagnosis.DiagnoseSettings.
"""

from absl import flags

from attn.inspection.diagnosis import DiagnoseSettings
from attn.launching import cli


def main(argv):
  del argv
  settings = cli.settings_from_flags(DiagnoseSettings)
  # pylint: disable-next=import-outside-toplevel  (after flag parsing)
  from attn import training
  from attn.inspection import diagnosis, diagnosis_report
  run = training.load_run(settings.workdir, task="translate")
  diag = diagnosis.diagnose(run, split=settings.split, max_examples=settings.max_examples,
                            seed=settings.seed, interventions=settings.interventions,
                            ig_steps=settings.ig_steps)
  path = diagnosis_report.write(diag, settings.workdir)
  print(diagnosis_report.format_table(diag.report))
  print(f"\nwrote {path} and {', '.join(diagnosis_report.plots_of(diag.report))}")


if __name__ == "__main__":
  cli.define_settings_flags(DiagnoseSettings)
  flags.mark_flags_as_required(["workdir"])
  cli.run(main)
