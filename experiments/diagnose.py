r"""Can this run's attention be read as an explanation? Diagnose a finished run.

    python -m experiments.diagnose --workdir=workdirs/demo/decoder=bahdanau
    python -m experiments.diagnose --workdir=workdirs/rec_sasrec --max_examples=2000

The run's recorded experiment (attn.launching.entry_points.experiment_of) picks the diagnosis:
its application's hook (attn.common.applications.App.diagnose), else the seq2seq diagnosis (translate,
summarize, caption).

Seq2seq: loads the best checkpoint of a finished run (experiments/translate.py or
summarize.py), greedy-decodes the first --max_examples examples of --split and writes into the
workdir (or --out=DIR; a run directory that cannot be written to is refused before any work, in
one line saying to pass --out): diagnose.json (attention entropy, AER / attention-on-gold and
their one-position-shifted readings on built-in tasks, Kendall tau between the attention and
gradient x input, the counterfactual interventions permute / uniform / zero_top) and
diagnose_entropy.png, diagnose_tau.png, diagnose_counterfactual.png; prints a short table. A
Transformer run also gets entropy and the gold-alignment scores per layer and head
(diagnose.json "heads", diagnose_heads.png); its counterfactuals replace the cross-attention of
every layer and head at one output step, and then of each layer alone. See
attn/inspection/diagnosis.py for the definitions. A workdir that is not a finished run, a run
without attention (decoder=none), or a pointer-generator (its output also copies the attention
weights, which the measures do not describe) exits with status 2 and one `error:` line.

Recommend (experiments/recommend.py, model.kind=sasrec): the first --max_examples users of
--split (test or valid); the final position's attention (last block, head average) against
gradient x input over the history items and the planted trigger, and the final position's
attention row replaced by each intervention in every block at once, then in each block alone:
the held-out item's log-probability and rank, HR@10, NDCG@10 (attn/apps/recommend/
diagnosis.py); diagnose.json, diagnose_tau.png, diagnose_counterfactual.png. A
meanpool or gru run is refused in one line naming its model.kind; --ig_steps is seq2seq only.

The flags are the fields of attn.inspection.diagnosis.DiagnoseSettings.
"""

import os

from absl import flags

import attn.apps  # noqa: F401  (registers the built-in applications)
from attn.common import applications
from attn.errors import ConfigError
from attn.inspection import outputs
from attn.inspection.diagnosis import DiagnoseSettings
from attn.launching import cli, entry_points, launchers


def _seq2seq(settings, out, experiment):
  """The diagnosis of a sequence-to-sequence run (every application without a hook of its own)."""
  # pylint: disable-next=import-outside-toplevel  (after flag parsing)
  from attn import training
  from attn.inspection import diagnosis, diagnosis_report
  res, _ = launchers.read_record(os.path.join(settings.workdir, "results.json"))
  diagnosis.check_model(settings.workdir, (res or {}).get("model_config") or {})  # before loading
  run = training.load_run(settings.workdir, task=experiment)
  diag = diagnosis.diagnose(run, split=settings.split, max_examples=settings.max_examples,
                            seed=settings.seed, interventions=settings.interventions,
                            ig_steps=settings.ig_steps)
  os.makedirs(out, exist_ok=True)
  path = diagnosis_report.write(diag, out)
  return path, diagnosis_report.plots_of(diag.report), diagnosis_report.format_table(diag.report)


def main(argv):
  del argv
  settings = cli.settings_from_flags(DiagnoseSettings)
  out = outputs.output_dir(settings.out, settings.workdir, "diagnose.json and its plots")
  other = applications.not_a_run_of(settings.workdir, "python -m experiments.diagnose")
  if other:
    raise ConfigError(other)
  experiment = entry_points.experiment_of(settings.workdir) or "translate"  # its own task
  hook = entry_points.experiment(experiment).diagnose_fn
  path, plots, table = (hook(settings, out) if hook is not None
                        else _seq2seq(settings, out, experiment))
  print(table)
  print(f"\nwrote {path} and {', '.join(plots)}")


if __name__ == "__main__":
  cli.define_settings_flags(DiagnoseSettings)
  flags.mark_flags_as_required(["workdir"])
  cli.run(main)
