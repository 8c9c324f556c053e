"""The experiments launch.py can launch, and checking a sweep's configs before anything runs.

An experiment is an entry point under experiments/ that trains in `--workdir`, takes
`--config=FILE:PRESET --config.KEY=VALUE`, resumes from its checkpoints and leaves its results
in <workdir>/results.json: the runs launch.py knows how to start, skip, refuse and tabulate.
Other entry points (benchmarks, the look-inside tools) are run directly.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os

from absl import flags
from ml_collections import config_flags

from attn.errors import AttnError, ConfigError
from attn.launching import cli, launchers
from attn.registry import Registry


# What every run's results.json holds besides its task's scores (attn.training.evaluation).
RUN_FIGURES = ("params", "step", "best_step", "tokens_per_sec", "tokens_per_sec_steady", "wall_s",
               "decode_s", "eval_s", "beam_size")


@dataclasses.dataclass(frozen=True)
class Experiment:
  """An experiment trains the task of its name (attn.training.TASKS). module: what `python -m`
  runs; doc: one line for listings; metrics: the results.json fields launch tabulates by default
  (the first is plotted); scores: the task's scores (each also `<name>_greedy` when a run decodes
  with a beam); figures: its other figures; nested: its fields that hold a dict (by bucket) or a
  list (by layer) of numbers, tabulated one column per entry (attn.launching.columns)."""
  module: str
  doc: str = ""
  metrics: tuple[str, ...] = ()
  scores: tuple[str, ...] = ()
  figures: tuple[str, ...] = ()
  nested: tuple[str, ...] = ()

  @property
  def known_metrics(self) -> tuple[str, ...]:
    """Every numeric field a finished run of this experiment can have in results.json (the
    nested ones apart)."""
    return (self.scores + tuple(f"{s}_greedy" for s in self.scores) + self.figures
            + RUN_FIGURES)


_ROUGE = ("rouge1", "rouge2", "rougeL")
EXPERIMENTS: Registry[Experiment] = Registry("experiment", error=ConfigError)
EXPERIMENTS.add("translate", Experiment(
    "experiments.translate", "seq2seq translation",
    metrics=("bleu", "exact_match", "params", "tokens_per_sec", "wall_s"),
    scores=("bleu", "chrf", "exact_match"), figures=("aer", "attention_on_gold"),
    nested=("exact_match_by_src_len",)))
EXPERIMENTS.add("summarize", Experiment(
    "experiments.summarize", "summarization: attention, pointer-generator, coverage",
    metrics=(*_ROUGE, "params", "tokens_per_sec", "wall_s"),
    scores=(*_ROUGE, *(f"{r}_max" for r in _ROUGE), *(f"{r}_subject" for r in _ROUGE)),
    figures=("annotated_examples", "repeated_trigram_rate", "source_token_share",
             "oov_in_references", "oov_recovered", "oov_copies", "copied_share", "mean_p_gen")))
EXPERIMENTS.add("caption", Experiment(
    "experiments.caption", "image captioning: attention over image regions",
    metrics=("exact_match", "digit_accuracy", "aer", "attention_on_gold", "params", "wall_s"),
    scores=("digit_accuracy", "exact_match"), figures=("aer", "attention_on_gold"),
    nested=("exact_match_by_digits", "digit_accuracy_by_digits")))
EXPERIMENTS.add("recommend", Experiment(
    "experiments.recommend", "next-item recommendation: self-attention, mean-pooling, GRU",
    metrics=("hr10", "ndcg10", "attention_on_gold", "params", "wall_s"),
    scores=("hr10", "ndcg10"), figures=("attention_on_gold", "random_hr10", "users"),
    nested=("hr10_by_length", "ndcg10_by_length", "attention_on_gold_by_length",
            "attention_on_gold_by_layer", "attention_on_gold_by_layer_and_length",
            "gold_is_argmax_by_layer")))


def experiment(name: str) -> Experiment:
  """The registered experiment `name`; a ConfigError (one line) listing the known ones if none."""
  if name not in EXPERIMENTS:
    raise ConfigError(f"--experiment={name}: not an experiment launch.py runs; known: "
                      f"{', '.join(EXPERIMENTS.names())}")
  return EXPERIMENTS.get(name)


def _not_a_metric(exp: Experiment, name: str) -> bool:
  """Whether --metrics `name` names nothing a run of `exp` reports: neither a known field nor,
  dotted, an entry of one of its nested fields (which entries exist depends on the data)."""
  field, dotted, _ = name.partition(".")
  return field not in (exp.nested if dotted else exp.known_metrics + exp.nested)


def metrics(name: str, given=None) -> tuple[str, ...]:
  """The results.json fields a launch of experiment `name` tabulates: `given` (--metrics), else
  the experiment's own default. A nested field (exp.nested) is given whole (one column per entry)
  or dotted (`exact_match_by_src_len.10-19`: one entry). ConfigError (one line) naming the
  misspelled ones and listing the known names."""
  exp = experiment(name)
  if not given:
    return exp.metrics
  unknown = [m for m in given if _not_a_metric(exp, m)]
  if unknown:
    nested = (f"; nested (whole, or <field>.<key> for one entry): {', '.join(exp.nested)}"
              if exp.nested else "")
    raise ConfigError(f"--metrics={','.join(given)}: {', '.join(unknown)} "
                      f"{'is' if len(unknown) == 1 else 'are'} not in a {name} run's results; "
                      f"known: {', '.join(exp.known_metrics)}"
                      f"{nested}")
  return tuple(given)


def _recorded_fields(workdir):
  """The field names of the scores a run recorded: results.json's, then metrics.jsonl's first
  evaluation's (a run stopped before its final evaluation)."""
  res, _ = launchers.read_record(os.path.join(workdir, "results.json"))
  if res:
    yield set(res)
  try:
    with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
      for line in f:
        try:
          rec = json.loads(line)
        except ValueError:  # a line cut short by a killed run
          continue
        if isinstance(rec, dict) and rec.get("split") == "eval":
          yield set(rec)
          return
  except OSError:
    return


def experiment_of(workdir) -> str | None:
  """The experiment that trained the run in `workdir`, read from its records: launch.json (a
  run launch.py started), else the scores its task reported (results.json, metrics.jsonl);
  None when they do not say."""
  rec, _ = launchers.read_record(os.path.join(workdir, launchers.RECORD))
  if rec and rec.get("experiment") in EXPERIMENTS:
    return rec["experiment"]
  for fields in _recorded_fields(workdir):
    for name, exp in EXPERIMENTS.items():
      if exp.scores[0] in fields:
        return name
  return None


def finished_experiment(workdir, allowed: tuple[str, ...]) -> str:
  """The experiment of the finished run in `workdir` (translate when its records do not say); a
  ConfigError when it has no results.json or is not one of `allowed`."""
  if not os.path.exists(os.path.join(workdir, "results.json")):
    raise ConfigError(f"{workdir} has no results.json: not a finished run")
  name = experiment_of(workdir) or "translate"
  if name not in allowed:
    raise ConfigError(f"{workdir} is a {name} run; only {', '.join(allowed)} runs are taken here")
  return name


def finished_experiments(workdirs, allowed: tuple[str, ...]) -> dict[str, str]:
  """{workdir: its experiment} of finished runs, every one checked (finished_experiment) before
  the caller does any work."""
  return {w: finished_experiment(w, allowed) for w in workdirs}


def load_experiment(name):
  """The experiment's module (it defines the experiment's flags on absl's global FLAGS)."""
  return importlib.import_module(experiment(name).module)


def default_config(module):
  """The experiment's own --config default (what it runs without --config), or None."""
  for f in flags.FLAGS.get_flags_for_module(module.__name__):
    if f.name == "config" and f.default_as_str:
      return f.default_as_str.strip("'")
  return None


def build_config(config, overrides):
  """The ConfigDict the experiment sees for `--config=<config> --config.<k>=<v> ...`: parsed by a
  fresh FlagValues with the experiments' flag definition (lock_config=True). ConfigError (one
  line) for a missing file, an unknown preset or field (with ml_collections' suggestion) or a value
  of the wrong type."""
  path = config.split(":", 1)[0]
  if not os.path.isfile(path):
    raise ConfigError(f"--config={config}: no file {path}")
  argv = ["launch", f"--config={config}"] + [f"--config.{k}={v}" for k, v in overrides]
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "Experiment config.", flag_values=fv,
                                  lock_config=True, sys_argv=argv)
  try:
    fv(argv)
  except (flags.Error, AttributeError, KeyError) as e:
    raise ConfigError(cli.describe_flag_error(e, argv)) from None
  return fv.config


def check_configs(module, config, runs) -> list:
  """One 'name: what is wrong' per run (anything with .name and .overrides) whose config the
  experiment would reject, by its `validate_config(config)` where it has one.

  ConfigError (raised, not listed) when the config file itself cannot be built: then every
  combination would fail the same way."""
  config = config or default_config(module)
  if not config:
    return []  # the experiment takes no config file: nothing to build
  build_config(config, ())
  validate = getattr(module, "validate_config", None)
  errors = []
  for run in runs:
    try:
      cfg = build_config(config, run.overrides)
      if validate is not None:
        validate(cfg)
    except AttnError as e:
      errors.append(f"{run.name}: {e}" if len(runs) > 1 else str(e))
  return errors
