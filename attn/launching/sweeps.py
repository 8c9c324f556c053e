"""A sweep: its runs (the --sweep grid or the --vary ablation, per --seeds seed, with the --set
overrides; each run's name, directory and command) and `launch`, which checks them all, starts the
unfinished ones with a launcher and writes the results table (see launch.py for the command line).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import sys

from attn.errors import ConfigError
from attn.launching import cli, entry_points, launchers, report, rundirs

SEED_KEY = "train.seed"  # the override --seeds sets (TrainConfig.seed: initialization, dropout)
BASE = "base"  # the --vary ablation's run at the config's own values, which the others vary


def parse_axis(spec):
  """'model.rnn.decoder=none,bahdanau' -> ('model.rnn.decoder', ['none', 'bahdanau'])."""
  key, sep, values = spec.partition("=")
  if not sep or not key or not values:
    raise ConfigError(f"--sweep/--set expects key=value[,value...], got {spec!r}")
  return key, values.split(",")


def labels(keys) -> dict:
  """Each dotted key's name in run names: its shortest suffix of whole components that no other
  key ends with ('model.rnn.decoder' -> 'decoder'; 'model.transformer.enc_self.normalizer' and
  'model.transformer.cross.normalizer' -> 'enc_self.normalizer', 'cross.normalizer'), so two
  axes never share a name."""
  keys = list(dict.fromkeys(keys))
  parts = {k: k.split(".") for k in keys}
  out = {}
  for k in keys:
    for n in range(1, len(parts[k]) + 1):
      tail = parts[k][-n:]
      if not any(o != k and parts[o][-n:] == tail for o in keys):
        break
    out[k] = ".".join(tail)
  return out


def _axes(specs, flag):
  """The parsed axes of `--sweep`/`--vary` specs; ConfigError (one line) for a key given twice or
  a value listed twice in one axis (two runs would share one directory, and with --seeds the
  table would count each seed twice)."""
  axes, seen = [], set()
  for spec in specs:
    key, values = parse_axis(spec)
    if key in seen:
      raise ConfigError(f"--{flag} {key} is given twice: list all its values in one --{flag}")
    seen.add(key)
    # Values compare as written, like seeds: `1e-3` and `0.001` are two runs.
    twice = next((v for i, v in enumerate(values) if v in values[:i]), None)
    if twice is not None:
      raise ConfigError(f"--{flag}={spec}: value {twice!r} is listed twice")
    axes.append((key, values))
  return axes


def grid(sweeps, names=None):
  """All combinations: [(name, [(key, value), ...])] with names like 'decoder=none,score=dot'.
  names: key -> its name in run names (default `labels` of the axes' keys)."""
  axes = _axes(sweeps, "sweep")
  names = names or labels(k for k, _ in axes)
  runs = []
  for combo in itertools.product(*[[(k, v) for v in vs] for k, vs in axes]):
    name = ",".join(f"{names[k]}={v}" for k, v in combo) or "run"
    runs.append((name, list(combo)))
  return runs


def one_at_a_time(varies, names=None):
  """An ablation: [(BASE, [])] then one run per value of each axis, alone:
  [('heads=2', [('model.heads', '2')]), ...]. Refuses an axis given twice (ConfigError).
  names: as for `grid`."""
  axes = _axes(varies, "vary")
  names = names or labels(k for k, _ in axes)
  runs = [(BASE, [])]
  for key, values in axes:
    runs += [(f"{names[key]}={v}", [(key, v)]) for v in values]
  return runs


def command(experiment, config, workdir, overrides):
  """The run's command line: `python -m <the experiment's module> --workdir=... --config=...`."""
  module = entry_points.experiment(experiment).module
  cmd = [sys.executable, "-m", module, f"--workdir={workdir}"]
  if config:
    cmd.append(f"--config={config}")
  cmd += [f"--config.{k}={v}" for k, v in overrides]
  return cmd


def parse_seeds(values, sets=(), sweeps=()) -> list:
  """--seeds as ints; ConfigError (one line) for a non-integer, a duplicate, or a --set/--sweep
  of the key the seeds set."""
  seeds = []
  for v in values:
    try:
      seed = int(v)
    except ValueError:
      raise ConfigError(f"--seeds={','.join(values)}: {v!r} is not an integer") from None
    if seed in seeds:
      raise ConfigError(f"--seeds={','.join(values)}: seed {seed} is listed twice")
    seeds.append(seed)
  if seeds and any(parse_axis(a)[0] == SEED_KEY for a in [*sets, *sweeps]):
    raise ConfigError(f"--seeds sets {SEED_KEY}: give either --seeds or a --set/--sweep of "
                      f"{SEED_KEY}, not both")
  return seeds


@dataclasses.dataclass(frozen=True)
class LaunchedRun:
  """One run of a launch (a sweep's combination and seed, or the single run): its name, run
  directory and overrides (--set ones, then --sweep values, then the seed); group: the
  combination's name without the seed (what the seed table averages over)."""
  name: str
  workdir: str
  experiment: str
  config: str | None
  overrides: tuple
  group: str = ""

  @property
  def command(self):
    return command(self.experiment, self.config, self.workdir, self.overrides)

  def identity(self) -> dict:
    """What launch.json records and a rerun must match: experiment, config file and overrides
    (a later override of the same key wins, as on the experiment's command line). Values compare
    as written: `1e-3` and `0.001` differ, which refuses rather than reuses."""
    return {"experiment": self.experiment, "config": self.config or "",
            "overrides": dict(self.overrides)}


def plan(experiment, config, workdir, sets, sweeps, seeds=(), varies=()) -> list:
  """The runs of a launch: one per combination of `sweeps` (or per setting of the one-at-a-time
  `varies`), and per seed, each with all of `sets`. A single run (no sweeps, varies or seeds)
  runs in `workdir` itself."""
  if sweeps and varies:
    raise ConfigError("--sweep (a grid) and --vary (one factor at a time) do not combine; "
                      "give one of them")
  fixed = [(k, ",".join(vs)) for k, vs in map(parse_axis, sets)]
  axes = sweeps or varies
  names = labels([parse_axis(a)[0] for a in axes] + ([SEED_KEY] if seeds else []))
  runs = []
  for name, combo in one_at_a_time(varies, names) if varies else grid(sweeps, names):
    for seed in seeds or [None]:
      run_name, overrides = name, fixed + combo
      if seed is not None:
        seed_name = f"{names[SEED_KEY]}={seed}"
        run_name = f"{name},{seed_name}" if axes else seed_name
        overrides = overrides + [(SEED_KEY, str(seed))]
      run_dir = os.path.join(workdir, run_name) if axes or seeds else workdir
      runs.append(LaunchedRun(run_name, run_dir, experiment, config, tuple(overrides), group=name))
  return runs


def launch(opts, argv) -> int:
  """Checks every combination, then starts the unfinished ones with the launcher (or, with
  --collect, only reads the run directories) and writes the table; the exit status (0, 1 or 2).
  opts: launch.py's parsed flags; argv: the command line recorded in results.md."""
  launcher = launchers.make(opts)
  metrics = entry_points.metrics(opts.experiment, opts.metrics)
  module = entry_points.load_experiment(opts.experiment)
  seeds = parse_seeds(opts.seeds, opts.set, [*opts.sweep, *opts.vary])
  runs = plan(opts.experiment, opts.config, opts.workdir, opts.set, opts.sweep, seeds, opts.vary)
  errors = entry_points.check_configs(module, opts.config, runs)
  for e in errors:
    print(f"error: {e}", file=sys.stderr)
  if errors:
    return cli.USAGE_ERROR  # a user mistake, reported before anything runs
  if opts.dry_run:
    for i, run in enumerate(runs, 1):
      print(f"[{i}/{len(runs)}] {run.name}: {' '.join(run.command[1:])}", flush=True)
    return 0
  todo = rundirs.survey(runs, opts.collect)
  if todo:
    launcher.start(todo, opts.workdir)
  return report.summarize(runs, opts.workdir, list(metrics), seeds, argv, collect=opts.collect,
                          base=BASE if opts.vary else None)
