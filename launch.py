r"""Launch one experiment, or sweep a grid of config overrides, here or on a Slurm cluster;
tabulate and plot the results.

    # one run
    python launch.py --experiment=translate --config=experiments/configs/translate.py:reverse \
        --workdir=workdirs/rev --set=model.rnn.decoder=bahdanau
    # a grid: every combination of the --sweep values, one subdirectory each, two at a time
    python launch.py --experiment=translate --config=experiments/configs/translate.py:demo \
        --workdir=workdirs/demo --sweep=model.rnn.decoder=none,bahdanau \
        --sweep=model.rnn.score=additive,general --parallel=2
    # each combination once per seed (run dirs decoder=none,seed=0 ...); the table: mean ± std
    python launch.py --experiment=translate --config=experiments/configs/translate.py:demo \
        --workdir=workdirs/seeds --sweep=model.rnn.decoder=none,bahdanau --seeds=0,1,2
    # an ablation, one factor at a time from the preset's values (a `base` run, then each
    # listed value alone), three seeds each
    python launch.py --experiment=translate --config=experiments/configs/translate.py:demo_transformer \
        --workdir=workdirs/ablate_heads --vary=model.transformer.num_heads=1,2,8 --seeds=0,1,2 \
        --parallel=2
    # the same as one Slurm job array; when it has ended, the same command with --collect
    python launch.py --experiment=translate --config=experiments/configs/translate.py:demo \
        --workdir=workdirs/cluster --sweep=model.rnn.decoder=none,bahdanau --seeds=0,1,2 \
        --launcher=slurm --slurm_partition=gpu --slurm_time=01:00:00 --slurm_gpus=1
    python launch.py --experiment=translate --config=experiments/configs/translate.py:demo \
        --workdir=workdirs/cluster --sweep=model.rnn.decoder=none,bahdanau --seeds=0,1,2 \
        --launcher=slurm --slurm_partition=gpu --slurm_time=01:00:00 --slurm_gpus=1 --collect

Before anything runs, every combination's config is built exactly as the experiment will see it
(`--config=... --config.<key>=<value> ...`, locked, so a misspelled field fails with a suggestion)
and checked by the experiment module's `validate_config(config)` where it has one. Bad
combinations end the launch with one `error:` line each and exit status 2; `--dry_run` checks too.

Each run is `python -m experiments.<experiment> --workdir=<dir>/<name> --config=...
--config.<key>=<value> ...`, started by the launcher --launcher names (attn/launching/launchers.py):
`local` runs them as subprocesses of launch, --parallel at a time (with more than one, each run's
output goes to <run dir>/launch.log); `slurm` submits them as one job array
(<workdir>/slurm/sweep.sbatch, with --slurm_partition, --slurm_time, --slurm_cpus, --slurm_gpus,
--slurm_mem, --slurm_account and repeatable --slurm_extra=<sbatch option>), prints the job id and
returns; each task's output goes to <workdir>/slurm/<job>_<task>.out. Either way a crashed run
does not take the sweep down, and each run's experiment, config and overrides are recorded in
<run dir>/launch.json before it starts (before submission), its exit status when it ends.

Rerunning the same command skips finished runs (exit status 0 and a readable results.json) and
runs (or submits) the others again; they resume from their checkpoints. A run directory recorded
with other overrides (or one launch did not start) is refused with one line naming the difference:
its checkpoints belong to another config, so use a new --workdir. With --collect, launch runs and
submits nothing: it reads the run directories, lists the runs still pending (submitted, running,
or never started) and the failed ones, and writes the table for what has finished.

--seeds=0,1,2 runs every combination once per seed (it sets train.seed; the run's name gains
`seed=K`), and the table reports, per combination, the mean ± std (ddof=1) over its finished seeds
of each metric (an integer equal over seeds, like params, is shown once), with n, the number of
seeds it averages; the per-seed rows follow in a second table, and the plot shows the means with
std error bars. Without --seeds the table has one row per run.

launch writes <workdir>/results.md (the command and the table; failed and refused runs say
"failed", unfinished ones "pending") and <workdir>/results.png (the first --metric), and exits 1
if any run failed or was refused (with --collect, also if any is pending), else 0.
"""

import dataclasses
import importlib
import itertools
import os
import pkgutil
import statistics
import sys

from absl import app, flags
from ml_collections import config_flags

from attn.inspection import plots as viz
from attn.errors import AttnError, ConfigError
from attn.training.results import results_table
from attn.launching import cli
from attn.launching import launchers
from attn.launching.launchers import LOG, RECORD, SLURM_DIR, read_record

USAGE_ERROR = cli.USAGE_ERROR  # a user mistake, reported before anything runs
FAILED = 1  # some run failed or was refused (with --collect: or has not finished)
SEED_KEY = "train.seed"  # the override --seeds sets (TrainConfig.seed: initialization, dropout)
_OWN_FILES = ("results.md", "results.png", RECORD, LOG, SLURM_DIR)  # launch's files in a workdir
_NOT_EXPERIMENTS = ("cli", "launchers")  # modules under experiments/ that are not experiments
_HELP = {"-h", "-?", "--help", "--helpshort", "--helpfull"}


def define_flags(fv):
  """launch's flags, on their own FlagValues: launch imports the experiment module (to check its
  configs), and that module defines --config and --workdir on absl's global FLAGS."""
  flags.DEFINE_string("experiment", "translate", "Module under experiments/ to run.",
                      flag_values=fv)
  flags.DEFINE_string("config", None, "Config file and preset passed to the experiment.",
                      flag_values=fv)
  flags.DEFINE_string("workdir", None, "Sweep directory; each run gets a subdirectory.",
                      flag_values=fv)
  flags.DEFINE_multi_string("set", [], "Override applied to every run: key=value (config.<key>).",
                            flag_values=fv)
  flags.DEFINE_multi_string("sweep", [], "Grid axis: key=v1,v2,... (one run per combination).",
                            flag_values=fv)
  flags.DEFINE_multi_string("vary", [], "Ablation axis: key=v1,v2,...; one factor at a time: a "
                            "`base` run at the config's own values, then one run per listed "
                            "value with every other key at its base (not a grid; list only "
                            "values other than the base's).", flag_values=fv)
  flags.DEFINE_list("seeds", [], f"Run every combination once per seed (sets {SEED_KEY}); the "
                    "table reports mean ± std over seeds.", flag_values=fv)
  flags.DEFINE_list("metrics", ["bleu", "exact_match", "params", "tokens_per_sec", "wall_s"],
                    "results.json fields tabulated (the first is plotted).", flag_values=fv)
  flags.DEFINE_bool("dry_run", False, "Check every combination's config and print the commands.",
                    flag_values=fv)
  flags.DEFINE_bool("collect", False, "Run and submit nothing: tabulate the finished runs and "
                    "list the pending and failed ones.", flag_values=fv)
  flags.DEFINE_string("launcher", "local", "Where runs execute: "
                      f"{', '.join(sorted(launchers.LAUNCHERS))} (attn/launching/launchers.py).",
                      flag_values=fv)
  flags.DEFINE_integer("parallel", None, "Runs at once: local subprocesses (default 1), or Slurm "
                       "array tasks running at once (--array=...%N; default no limit).",
                       lower_bound=1, flag_values=fv)
  flags.DEFINE_string("slurm_partition", None, "Slurm partition.", flag_values=fv)
  flags.DEFINE_string("slurm_time", None, "Slurm time limit per run, e.g. 01:00:00.",
                      flag_values=fv)
  flags.DEFINE_string("slurm_mem", None, "Slurm memory per run, e.g. 32G.", flag_values=fv)
  flags.DEFINE_string("slurm_account", None, "Slurm account to charge.", flag_values=fv)
  flags.DEFINE_integer("slurm_cpus", None, "Slurm CPUs per run (--cpus-per-task).", lower_bound=1,
                       flag_values=fv)
  flags.DEFINE_integer("slurm_gpus", None, "Slurm GPUs per run (--gpus).", lower_bound=0,
                       flag_values=fv)
  flags.DEFINE_multi_string("slurm_extra", [], "Another #SBATCH line, e.g. --qos=high "
                            "(repeatable).", flag_values=fv)
  flags.mark_flags_as_required(["workdir"], flag_values=fv)


def parse_args(argv):
  """launch's flags from argv (argv[0] is the program): a fresh FlagValues; flags.Error if bad."""
  fv = flags.FlagValues()
  define_flags(fv)
  rest = fv(argv)
  if rest[1:]:
    raise flags.Error(f"unexpected arguments {' '.join(rest[1:])} (flags are --name=value)")
  return fv


# ---------------------------------------------------------------------------------------------
# the grid


def parse_axis(spec):
  """'model.rnn.decoder=none,bahdanau' -> ('model.rnn.decoder', ['none', 'bahdanau'])."""
  key, sep, values = spec.partition("=")
  if not sep or not key or not values:
    raise ConfigError(f"--sweep/--set expects key=value[,value...], got {spec!r}")
  return key, values.split(",")


def grid(sweeps):
  """All combinations: [(name, [(key, value), ...])] with names like 'decoder=none,score=dot'."""
  axes = [parse_axis(s) for s in sweeps]
  runs = []
  for combo in itertools.product(*[[(k, v) for v in vs] for k, vs in axes]):
    name = ",".join(f"{k.split('.')[-1]}={v}" for k, v in combo) or "run"
    runs.append((name, list(combo)))
  return runs


def one_at_a_time(varies):
  """An ablation: [("base", [])] then one run per value of each axis, alone:
  [('heads=2', [('model.heads', '2')]), ...]. Refuses an axis given twice (ConfigError)."""
  runs, seen = [("base", [])], set()
  for key, values in map(parse_axis, varies):
    if key in seen:
      raise ConfigError(f"--vary {key} is given twice: list all its values in one --vary")
    seen.add(key)
    runs += [(f"{key.split('.')[-1]}={v}", [(key, v)]) for v in values]
  return runs


def command(experiment, config, workdir, overrides):
  cmd = [sys.executable, "-m", f"experiments.{experiment}", f"--workdir={workdir}"]
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
class Run:
  """One run: its name, run directory and overrides (--set ones, then --sweep values, then the
  seed); group: the combination's name without the seed (what the seed table averages over)."""
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
  runs = []
  for name, combo in one_at_a_time(varies) if varies else grid(sweeps):
    for seed in seeds or [None]:
      run_name, overrides = name, fixed + combo
      if seed is not None:
        run_name = f"{name},seed={seed}" if axes else f"seed={seed}"
        overrides = overrides + [(SEED_KEY, str(seed))]
      run_dir = os.path.join(workdir, run_name) if axes or seeds else workdir
      runs.append(Run(run_name, run_dir, experiment, config, tuple(overrides), group=name))
  return runs


# ---------------------------------------------------------------------------------------------
# checking every combination before anything runs


def load_experiment(name):
  """The module experiments.<name>; ConfigError listing the known ones if there is none."""
  import experiments  # pylint: disable=import-outside-toplevel
  known = sorted(m.name for m in pkgutil.iter_modules(experiments.__path__)
                 if not m.ispkg and m.name not in _NOT_EXPERIMENTS)
  if name not in known:
    raise ConfigError(f"--experiment={name}: there is no experiments/{name}.py; known: "
                      f"{', '.join(known)}")
  return importlib.import_module(f"experiments.{name}")


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
  """One 'name: what is wrong' per combination whose config the experiment would reject.

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


# ---------------------------------------------------------------------------------------------
# run directories: what was run there, and whether it finished


def differences(recorded: dict, current: dict) -> list:
  """'what: before -> now' for each part of the two identities that differs."""
  out = [f"--{part} {recorded.get(part)!r} -> {current[part]!r}"
         for part in ("experiment", "config") if recorded.get(part) != current[part]]
  old, new = recorded.get("overrides") or {}, current["overrides"]
  show = lambda v: "(unset)" if v is None else v  # pylint: disable=unnecessary-lambda-assignment
  for k in list(old) + [k for k in new if k not in old]:
    if old.get(k) != new.get(k):
      out.append(f"{k}: {show(old.get(k))} -> {show(new.get(k))}")
  return out


def unfinished(rec) -> str:
  """Why a run recorded without an exit status has none."""
  job = rec.get("slurm_job")
  if not rec.get("started"):
    if job:
      return f"submitted as Slurm job {job} and not started (if still queued: scancel {job})"
    return "recorded but never started (its submission failed or was interrupted)"
  where = f" as Slurm job {job}" if job else ""
  return (f"started {rec['started']}{where} and recorded no exit status (still running, or "
          "stopped: interrupted, or at its time limit)")


def status(run):
  """What the run directory holds, as (state, detail):
  ("new", "") nothing yet; ("done", results) finished by this command;
  ("failed", why) the last attempt exited non-zero, or cleanly without a readable results.json;
  ("pending", why) recorded without an exit status yet (submitted, running or interrupted);
  ("refuse", why) another config's run, or one launch did not start."""
  rec_path = os.path.join(run.workdir, RECORD)
  if not os.path.exists(rec_path):
    present = sorted(f for f in os.listdir(run.workdir) if f not in _OWN_FILES
                     and not f.startswith(".")) if os.path.isdir(run.workdir) else []
    if present:
      return "refuse", (f"{run.workdir} holds a run launch did not start (no {RECORD}; it has "
                        f"{', '.join(present[:4])}{', ...' if len(present) > 4 else ''}), so its "
                        "config is unknown: use a new --workdir")
    return "new", ""
  rec, why = read_record(rec_path)
  if rec is None:
    return "refuse", f"{why}, so the config of {run.workdir} is unknown: use a new --workdir"
  diff = differences(rec, run.identity())
  if diff:
    return "refuse", (f"{run.workdir} was run with other settings ({'; '.join(diff)}) and holds "
                      "that config's checkpoints: use a new --workdir for the new settings")
  if rec.get("exit_code") is None:
    return "pending", unfinished(rec)
  log = rec.get("slurm_log") or os.path.join(run.workdir, LOG)
  seen = f" (output: {log})" if os.path.exists(log) else ""
  if rec["exit_code"] != 0:
    return "failed", f"the last attempt exited {rec['exit_code']}{seen}"
  res, why = read_record(os.path.join(run.workdir, "results.json"))
  if res is None:
    return "failed", f"{why}{seen}: not finished"
  return "done", res


def survey(runs, collect):
  """Prints what each run directory holds; the [(tag, run)] to start (none with collect)."""
  todo = []
  for i, run in enumerate(runs, 1):
    tag = f"[{i}/{len(runs)}] {run.name}"
    state, detail = status(run)
    if collect:
      print(f"{tag}: " + {"done": "finished", "new": "not started"}.get(
          state, f"{'refused' if state == 'refuse' else state}: {detail}"), flush=True)
      continue
    print(f"{tag}: {' '.join(run.command[1:])}", flush=True)
    if state == "done":
      print(f"{tag}: finished before; its results.json is reused", flush=True)
    elif state == "refuse":
      print(f"{tag}: refused: {detail}", flush=True)
    else:
      if detail:
        print(f"{tag}: {detail}; running it again (it resumes from its checkpoint)", flush=True)
      todo.append((tag, run))
  return todo


# ---------------------------------------------------------------------------------------------
# tables and plots


def _number(v) -> bool:
  return isinstance(v, (int, float)) and not isinstance(v, bool)


def _fmt(v) -> str:
  return f"{v:,}" if isinstance(v, int) else f"{v:.3f}"


def mean_std(values) -> str:
  """One cell of the seed table: 'mean ± std' (ddof=1) of the seeds' values; an integer equal
  over seeds (params) once; one seed's value alone; a non-number if all seeds agree, else ''."""
  nums = [v for v in values if _number(v)]
  if not nums:
    return str(values[0]) if values and all(v == values[0] for v in values) else ""
  if len(nums) == 1 or (all(isinstance(v, int) for v in nums) and len(set(nums)) == 1):
    return _fmt(nums[0])
  return f"{statistics.fmean(nums):.3f} ± {statistics.stdev(nums):.3f}"


def seed_table(states, columns) -> str:
  """A markdown table, one row per combination: n (finished seeds, 'k of n' when some are not)
  and each metric's mean ± std over them; 'failed' / 'pending' when none has finished."""
  groups = {}
  for run, state, detail in states:
    groups.setdefault(run.group, []).append((state, detail))
  lines = ["| run | n | " + " | ".join(columns) + " |", "|" + "---|" * (len(columns) + 2)]
  for group, members in groups.items():
    done = [detail for state, detail in members if state == "done"]
    n = str(len(done)) if len(done) == len(members) else f"{len(done)} of {len(members)}"
    if done:
      cells = [mean_std([r[c] for r in done if c in r]) for c in columns]
    else:
      word = "failed" if any(s in ("failed", "refuse") for s, _ in members) else "pending"
      cells = [word] * len(columns)
    lines.append(f"| {group} | {n} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def plot(points, metric, path):
  """A bar per (name, value, std or None), std as error bars; False if there is nothing to plot."""
  if not points:
    return False
  plt = viz.pyplot()
  fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(points)), 3))
  errors = [e or 0 for _, _, e in points] if any(e is not None for _, _, e in points) else None
  ax.bar(range(len(points)), [v for _, v, _ in points], yerr=errors, capsize=4, color="#4c72b0")
  ax.set_xticks(range(len(points)), [n for n, _, _ in points], rotation=30, ha="right",
                fontsize=7)
  ax.set_ylabel(metric + (" (mean ± std over seeds)" if errors else ""))
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return True


def bars(states, metric, seeds):
  """What the plot shows: each finished run's `metric`, or with seeds each combination's mean and
  std (None for one seed) over its finished seeds."""
  if not seeds:
    return [(run.name, detail[metric], None) for run, state, detail in states
            if state == "done" and _number(detail.get(metric))]
  groups = {}
  for run, state, detail in states:
    if state == "done" and _number(detail.get(metric)):
      groups.setdefault(run.group, []).append(detail[metric])
  return [(g, statistics.fmean(v), statistics.stdev(v) if len(v) > 1 else None)
          for g, v in groups.items()]


def tables(states, metrics, seeds) -> str:
  """The results table: one row per run, or with seeds one per combination and then the runs."""
  marks = {"new": "pending", "pending": "pending"}  # unfinished runs; failed and refused: None
  rows = [(run.name, detail if state == "done" else
           {c: marks[state] for c in metrics} if state in marks else None)
          for run, state, detail in states]
  if not seeds:
    return results_table(rows, metrics)
  return f"{seed_table(states, metrics)}\n\nper seed:\n\n{results_table(rows, metrics)}"


# ---------------------------------------------------------------------------------------------
# the launch


def launch(opts, argv=None) -> int:
  """Checks every combination, then starts the unfinished ones with the launcher (or, with
  --collect, only reads the run directories) and writes the table; the exit status (0, 1 or 2).
  opts: parsed flags (parse_args); argv: the command line recorded in results.md."""
  launcher = launchers.make(opts)
  seeds = parse_seeds(opts.seeds, opts.set, [*opts.sweep, *opts.vary])
  runs = plan(opts.experiment, opts.config, opts.workdir, opts.set, opts.sweep, seeds, opts.vary)
  errors = check_configs(load_experiment(opts.experiment), opts.config, runs)
  for e in errors:
    print(f"error: {e}", file=sys.stderr)
  if errors:
    return USAGE_ERROR
  if opts.dry_run:
    for i, run in enumerate(runs, 1):
      print(f"[{i}/{len(runs)}] {run.name}: {' '.join(run.command[1:])}", flush=True)
    return 0
  todo = survey(runs, opts.collect)
  if todo:
    launcher.start(todo, opts.workdir)
  return summarize(runs, opts, argv or sys.argv, seeds)


def summarize(runs, opts, argv, seeds) -> int:
  """Writes results.md and results.png from the run directories as they are now, lists the runs
  that failed or have not finished; the exit status."""
  states = [(run, *status(run)) for run in runs]
  table = tables(states, opts.metrics, seeds)
  os.makedirs(opts.workdir, exist_ok=True)
  with open(os.path.join(opts.workdir, "results.md"), "w", encoding="utf-8") as f:
    f.write(f"command: {' '.join(argv)}\n\n{table}\n")
  print("\n" + table)
  if plot(bars(states, opts.metrics[0], seeds), opts.metrics[0],
          os.path.join(opts.workdir, "results.png")):
    print(f"\nwrote {opts.workdir}/results.md and {opts.workdir}/results.png")
  failed = [run.name for run, state, _ in states if state in ("failed", "refuse")]
  pending = [run.name for run, state, _ in states if state in ("pending", "new")]
  if pending:
    print(f"\n{len(pending)} of {len(runs)} runs have not finished: {', '.join(pending)}"
          + ("" if opts.collect else "; when they have, rerun this command with --collect"))
  if failed:
    print(f"\n{len(failed)} of {len(runs)} runs failed or were refused: {', '.join(failed)}",
          file=sys.stderr)
  return FAILED if failed or (pending and opts.collect) else 0


def parse_flags(argv):
  """absl.app's flags_parser: launch's own flags (what main receives), one line for a bad one."""
  if _HELP & set(argv[1:]):
    fv = flags.FlagValues()
    define_flags(fv)
    print(f"{__doc__}\nflags:\n{fv.get_help()}")
    sys.exit(0)
  try:
    opts = parse_args(argv)
  except flags.Error as e:
    cli.fail(cli.last_line(e))
  if not flags.FLAGS.is_parsed():
    flags.FLAGS(argv[:1])  # absl's own flags keep their defaults; app.run wants them parsed
  return opts


def main(opts):
  try:
    return launch(opts)
  except AttnError as e:
    cli.fail(str(e))


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
