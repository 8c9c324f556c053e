r"""Launch one experiment, or sweep a grid of config overrides; tabulate and plot the results.

    # one run
    python launch.py --experiment=translate --config=experiments/configs/translate.py:reverse \
        --workdir=workdirs/rev --set=model.decoder=bahdanau
    # a grid: every combination of the --sweep values, one subdirectory each
    python launch.py --experiment=translate --config=experiments/configs/translate.py:demo \
        --workdir=workdirs/demo --sweep=model.decoder=none,bahdanau \
        --sweep=model.score=additive,general

Before anything runs, every combination's config is built exactly as the experiment will see it
(`--config=... --config.<key>=<value> ...`, locked, so a misspelled field fails with a suggestion)
and checked by the experiment module's `validate_config(config)` where it has one. Bad
combinations end the launch with one `error:` line each and exit status 2; `--dry_run` checks too.

Each run is a subprocess `python -m experiments.<experiment> --workdir=<dir>/<name> --config=...
--config.<key>=<value> ...`, so a crashed run does not take the sweep down. Launch records each
run's experiment, config and overrides in <run dir>/launch.json before starting it, and its exit
status when it ends. Rerunning the same command skips finished runs (exit status 0 and a readable
results.json) and reruns the others, which resume from their checkpoints. A run directory recorded
with other overrides (or one launch did not start) is refused with one line naming the difference:
its checkpoints belong to another config, so use a new --workdir. The sweep writes
<workdir>/results.md (a table of every run's results.json; failed and refused runs say "failed")
and <workdir>/results.png (the first --metric per run), and exits 1 if any run failed.
"""

import dataclasses
import datetime
import importlib
import itertools
import json
import os
import pkgutil
import subprocess
import sys
import time

from absl import app, flags
from ml_collections import config_flags

from attn import viz
from attn.errors import AttnError, ConfigError
from attn.training.results import results_table, write_json
from experiments import cli

USAGE_ERROR = cli.USAGE_ERROR  # a user mistake, reported before anything runs
FAILED = 1  # some run failed or was refused
RECORD = "launch.json"  # per run directory: what launch ran there (see Run.identity)
_OWN_FILES = ("results.md", "results.png", RECORD)  # launch's own files in --workdir
_NOT_EXPERIMENTS = ("cli",)  # modules under experiments/ that are not entry points
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
  flags.DEFINE_list("metrics", ["bleu", "exact_match", "params", "tokens_per_sec", "wall_s"],
                    "results.json fields tabulated (the first is plotted).", flag_values=fv)
  flags.DEFINE_bool("dry_run", False, "Check every combination's config and print the commands.",
                    flag_values=fv)
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
  """'model.decoder=none,bahdanau' -> ('model.decoder', ['none', 'bahdanau'])."""
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


def command(experiment, config, workdir, overrides):
  cmd = [sys.executable, "-m", f"experiments.{experiment}", f"--workdir={workdir}"]
  if config:
    cmd.append(f"--config={config}")
  cmd += [f"--config.{k}={v}" for k, v in overrides]
  return cmd


@dataclasses.dataclass(frozen=True)
class Run:
  """One combination: its name, run directory and overrides (--set ones, then --sweep values)."""
  name: str
  workdir: str
  experiment: str
  config: str | None
  overrides: tuple

  @property
  def command(self):
    return command(self.experiment, self.config, self.workdir, self.overrides)

  def identity(self) -> dict:
    """What launch.json records and a rerun must match: experiment, config file and overrides
    (a later override of the same key wins, as on the experiment's command line). Values compare
    as written: `1e-3` and `0.001` differ, which refuses rather than reuses."""
    return {"experiment": self.experiment, "config": self.config or "",
            "overrides": dict(self.overrides)}


def plan(experiment, config, workdir, sets, sweeps) -> list:
  """The runs of a launch: one per combination of `sweeps`, each with all of `sets`."""
  fixed = [(k, ",".join(vs)) for k, vs in map(parse_axis, sets)]
  return [Run(name, os.path.join(workdir, name) if sweeps else workdir, experiment, config,
              tuple(fixed + combo)) for name, combo in grid(sweeps)]


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


def read_record(path):
  """(the JSON object in path, "") or (None, why not: missing, truncated, not an object)."""
  try:
    with open(path, encoding="utf-8") as f:
      obj = json.load(f)
  except FileNotFoundError:
    return None, f"no {path}"
  except (OSError, ValueError) as e:  # ValueError: bad JSON or bytes that are not UTF-8
    return None, f"{path} is unreadable ({type(e).__name__}: {e})"
  if not isinstance(obj, dict):
    return None, f"{path} is not a JSON object"
  return obj, ""


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


def previous(run):
  """What the run directory holds, as (state, detail):
  ("new", "") nothing yet; ("rerun", why) started by this command but not finished;
  ("done", results) finished by this command; ("refuse", why) another config's run."""
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
  if rec.get("exit_code") != 0:
    last = "was interrupted" if rec.get("exit_code") is None else f"exited {rec['exit_code']}"
    return "rerun", f"the last attempt {last}; running it again (it resumes from its checkpoint)"
  res, why = read_record(os.path.join(run.workdir, "results.json"))
  if res is None:
    return "rerun", f"{why}: not finished; running it again (it resumes from its checkpoint)"
  return "done", res


def execute(run, tag):
  """Runs one experiment subprocess, recording it in launch.json; its results, or None if it
  failed (a non-zero exit, whatever files it left, or no readable results.json)."""
  os.makedirs(run.workdir, exist_ok=True)
  rec_path = os.path.join(run.workdir, RECORD)
  rec = {**run.identity(), "command": run.command[1:], "exit_code": None,
         "started": datetime.datetime.now().isoformat(timespec="seconds")}
  write_json(rec_path, rec)
  t0 = time.time()
  rc = subprocess.call(run.command)
  write_json(rec_path, {**rec, "exit_code": rc, "wall_s": round(time.time() - t0, 1)})
  print(f"{tag}: exit {rc} after {time.time() - t0:.0f} s", flush=True)
  if rc != 0:
    print(f"{tag}: failed (exit status {rc})", flush=True)
    return None
  res, why = read_record(os.path.join(run.workdir, "results.json"))
  if res is None:
    print(f"{tag}: failed: {why} after a clean exit", flush=True)
  return res


# ---------------------------------------------------------------------------------------------
# the launch


def plot(rows, metric, path):
  plt = viz.pyplot()
  done = [(n, r[metric]) for n, r in rows if r and isinstance(r.get(metric), (int, float))]
  if not done:
    return False
  fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(done)), 3))
  ax.bar(range(len(done)), [v for _, v in done], color="#4c72b0")
  ax.set_xticks(range(len(done)), [n for n, _ in done], rotation=30, ha="right", fontsize=7)
  ax.set_ylabel(metric)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return True


def launch(opts, argv=None) -> int:
  """Checks every combination, then runs the unfinished ones; the exit status (0, 1 or 2).
  opts: parsed flags (parse_args); argv: the command line recorded in results.md."""
  runs = plan(opts.experiment, opts.config, opts.workdir, opts.set, opts.sweep)
  errors = check_configs(load_experiment(opts.experiment), opts.config, runs)
  for e in errors:
    print(f"error: {e}", file=sys.stderr)
  if errors:
    return USAGE_ERROR
  if not opts.dry_run:
    os.makedirs(opts.workdir, exist_ok=True)
  rows = []
  for i, run in enumerate(runs, 1):
    tag = f"[{i}/{len(runs)}] {run.name}"
    print(f"{tag}: {' '.join(run.command[1:])}", flush=True)
    if opts.dry_run:
      continue
    state, detail = previous(run)
    if state == "done":
      print(f"{tag}: finished before; its results.json is reused", flush=True)
      rows.append((run.name, detail))
      continue
    if state == "refuse":
      print(f"{tag}: refused: {detail}", flush=True)
      rows.append((run.name, None))
      continue
    if detail:
      print(f"{tag}: {detail}", flush=True)
    rows.append((run.name, execute(run, tag)))
  if opts.dry_run:
    return 0
  table = results_table(rows, opts.metrics)
  with open(os.path.join(opts.workdir, "results.md"), "w", encoding="utf-8") as f:
    f.write(f"command: {' '.join(argv or sys.argv)}\n\n{table}\n")
  print("\n" + table)
  if plot(rows, opts.metrics[0], os.path.join(opts.workdir, "results.png")):
    print(f"\nwrote {opts.workdir}/results.md and {opts.workdir}/results.png")
  failed = [name for name, r in rows if r is None]
  if failed:
    print(f"\n{len(failed)} of {len(rows)} runs failed or were refused: {', '.join(failed)}",
          file=sys.stderr)
  return FAILED if failed else 0


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
