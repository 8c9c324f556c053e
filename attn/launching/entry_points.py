"""The experiments launch.py can launch, and checking a sweep's configs before anything runs.

An experiment is an entry point under experiments/ that trains in `--workdir`, takes
`--config=FILE:PRESET --config.KEY=VALUE`, resumes from its checkpoints and leaves its results
in <workdir>/results.json: the runs launch.py knows how to start, skip, refuse and tabulate.
Other entry points (benchmarks, the look-inside tools) are run directly.
"""

from __future__ import annotations

import importlib
import os

from absl import flags
from ml_collections import config_flags

from attn.common import applications
from attn.errors import AttnError, ConfigError
from attn.launching import cli, launchers


class _Launchable:
  """The registered applications launch.py runs (attn.common.applications.APPS entries with
  `launchable`), as a read-only registry: names(), items(), get(name), `name in`."""

  def items(self):
    return [(n, a) for n, a in applications.registry().items() if a.launchable]

  def names(self) -> list[str]:
    return [n for n, _ in self.items()]

  def __contains__(self, name) -> bool:
    return name in self.names()

  def get(self, name: str):
    return experiment(name)


EXPERIMENTS = _Launchable()


def experiment(name: str):
  """The launchable application `name` (an attn.common.applications.App: `module`, `doc`, and its task's
  `metrics`, `scores`, `figures`, `nested`, `known_metrics`); a ConfigError (one line) listing
  the known ones if none."""
  if name not in EXPERIMENTS:
    raise ConfigError(f"--experiment={name}: not an experiment launch.py runs; known: "
                      f"{', '.join(EXPERIMENTS.names())}")
  return applications.app(name)


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


def experiment_of(workdir) -> str | None:
  """The experiment that trained the run in `workdir`, read from its records: launch.json (a
  run launch.py started), else the scores its task reported (results.json, metrics.jsonl);
  None when they do not say."""
  rec, _ = launchers.read_record(os.path.join(workdir, launchers.RECORD))
  if rec and rec.get("experiment") in EXPERIMENTS:
    return rec["experiment"]
  return applications.app_of_records(workdir)


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
