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
    # listed value alone), three seeds each; exact match per source-length bucket (one column
    # each) and AER, each mean ± std, marked where a setting beats or trails base beyond both stds
    python launch.py --experiment=translate --config=experiments/configs/translate.py:demo_transformer \
        --workdir=workdirs/ablate_heads --vary=model.transformer.num_heads=1,2,8 --seeds=0,1,2 \
        --parallel=2 --metrics=exact_match,exact_match_by_src_len,aer,attention_on_gold
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
--config.<key>=<value> ...`; <name> is its axis settings, each key by its last component
(`decoder=none,seed=0`), or where two axes share that, by the shortest dotted suffix that tells
them apart (`enc_self.normalizer=sparsemax`, `cross.normalizer=sparsemax`); a value listed twice
in one --sweep/--vary axis is refused, as a seed listed twice in --seeds is. It is started by the
launcher --launcher names (attn/launching/launchers.py):
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
of each column (an integer equal over seeds, like params, is shown once), with n, the number of
seeds it averages; the per-seed rows follow in a second table, and the plot shows the means with
std error bars. Without --seeds the table has one row per run. With --vary and --seeds, a cell
is marked "(better)" or "(worse)" than the `base` row's only when the means differ by more than
the sum of the two stds, in the direction that is better for its metric (lower for aer, higher
for exact match; attn/launching/spread.py holds both the rule and the directions); the notes
under the table state the rule.

launch writes <workdir>/results.md (the command and the table; failed and refused runs say
"failed", unfinished ones "pending") and <workdir>/results.png (the first column), and exits 1
if any run failed or was refused (with --collect, also if any is pending), else 0. The table's
columns are --metrics, by default the experiment's own (translate: BLEU and exact match;
summarize: ROUGE); a name no run of the experiment reports is refused before anything runs. A
field that holds a dict or list (translate's exact_match_by_src_len, by source-length bucket) is
tabulated one column per entry, named <field>.<key> (exact_match_by_src_len.10-19), each with its
own mean ± std; --metrics=exact_match_by_src_len.10-19 tabulates that one entry. A field a
finished run's results.json lacks (aer where no attention weights were formed, a bucket with no
example) is not averaged over the others: the cell says "missing" (per run) or "missing in k of
n" (per combination), and a line on stderr names the runs.

--experiment names one of the experiments launch.py runs (attn/launching/entry_points.py:
translate, summarize); the other entry points under experiments/ are run directly. This file
only parses flags: the sweep is attn/launching/sweeps.py, the run directories rundirs.py, the
table and plot report.py.
"""

import sys

from absl import app, flags

import attn.apps  # noqa: F401  (registers the built-in applications)
from attn.errors import AttnError
from attn.launching import cli, entry_points, launchers, sweeps

_HELP = {"-h", "-?", "--help", "--helpshort", "--helpfull"}


def define_flags(fv):
  """launch's flags, on their own FlagValues: launch imports the experiment module (to check its
  configs), and that module defines --config and --workdir on absl's global FLAGS."""
  flags.DEFINE_string("experiment", "translate", "Experiment to run: "
                      f"{', '.join(entry_points.EXPERIMENTS.names())}.", flag_values=fv)
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
  flags.DEFINE_list("seeds", [], f"Run every combination once per seed (sets {sweeps.SEED_KEY}); "
                    "the table reports mean ± std over seeds.", flag_values=fv)
  flags.DEFINE_list("metrics", [], "results.json fields tabulated (the first column is plotted); "
                    "a dict- or list-valued field (exact_match_by_src_len) gives one column per "
                    "entry, <field>.<key> picks one (exact_match_by_src_len.10-19); default: "
                    "the experiment's own (" + "; ".join(
                        f"{n}: {','.join(e.metrics)}" for n, e in entry_points.EXPERIMENTS.items())
                    + ").", flag_values=fv)
  flags.DEFINE_bool("dry_run", False, "Check every combination's config and print the commands.",
                    flag_values=fv)
  flags.DEFINE_bool("collect", False, "Run and submit nothing: tabulate the finished runs and "
                    "list the pending and failed ones.", flag_values=fv)
  flags.DEFINE_string("launcher", "local", "Where runs execute: "
                      f"{', '.join(launchers.LAUNCHERS.names())} (attn/launching/launchers.py).",
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
    given = [a.split("=", 1)[0] for a in argv[1:] if a.startswith("--config.")]
    hint = (f"; launch.py passes config overrides as --set={given[0][len('--config.'):]}=VALUE "
            "(every run) or --sweep=KEY=V1,V2 (one run each)" if given else "")
    cli.fail(cli.last_line(e) + hint)
  if not flags.FLAGS.is_parsed():
    flags.FLAGS(argv[:1])  # absl's own flags keep their defaults; app.run wants them parsed
  return opts


def main(opts, argv=None):
  """The sweep for the parsed flags; its exit status. argv: the command recorded in results.md."""
  try:
    return sweeps.launch(opts, argv or sys.argv)
  except AttnError as e:
    cli.fail(str(e))


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
