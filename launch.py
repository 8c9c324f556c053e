r"""Launch one experiment, or sweep a grid of config overrides; tabulate and plot the results.

    # one run
    python launch.py --experiment=translate --config=experiments/configs/translate.py:reverse \
        --workdir=workdirs/rev --set=model.decoder=bahdanau
    # a grid: every combination of the --sweep values, one subdirectory each
    python launch.py --experiment=translate --config=experiments/configs/translate.py:demo \
        --workdir=workdirs/demo --sweep=model.decoder=none,bahdanau --sweep=model.score=additive,dot

Each run is a subprocess `python -m experiments.<experiment> --config=... --workdir=<dir>/<name>
--config.<key>=<value> ...`, so a crashed run does not take the sweep down and a rerun of the same
command resumes each unfinished run from its checkpoint and skips finished ones (results.json
present). The sweep writes <workdir>/results.md (a table of every run's results.json) and
<workdir>/results.png (the first --metric per run).
"""

import itertools
import json
import os
import subprocess
import sys
import time

from absl import app, flags

from attn import viz
from attn.training.results import results_table

FLAGS = flags.FLAGS


def define_flags():
  """Defined on demand, so tests can import this module next to other flag-defining ones."""
  flags.DEFINE_string("experiment", "translate", "Module under experiments/ to run.")
  flags.DEFINE_string("config", None, "Config file and preset passed to the experiment.")
  flags.DEFINE_string("workdir", None, "Sweep directory; each run gets a subdirectory.")
  flags.DEFINE_multi_string("set", [], "Override applied to every run: key=value (config.<key>).")
  flags.DEFINE_multi_string("sweep", [], "Grid axis: key=v1,v2,... (one run per combination).")
  flags.DEFINE_list("metrics", ["bleu", "exact_match", "params", "tokens_per_sec", "wall_s"],
                    "results.json fields tabulated (the first is plotted).")
  flags.DEFINE_bool("dry_run", False, "Print the commands only.")
  flags.mark_flags_as_required(["workdir"])


def parse_axis(spec):
  """'model.decoder=none,bahdanau' -> ('model.decoder', ['none', 'bahdanau'])."""
  key, sep, values = spec.partition("=")
  if not sep or not key or not values:
    raise app.UsageError(f"--sweep/--set expects key=value[,value...], got {spec!r}")
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


def main(argv):
  del argv
  fixed = [parse_axis(s) for s in FLAGS.set]
  fixed = [(k, ",".join(v)) for k, v in fixed]
  runs = grid(FLAGS.sweep)
  os.makedirs(FLAGS.workdir, exist_ok=True)
  rows = []
  for i, (name, combo) in enumerate(runs, 1):
    wd = os.path.join(FLAGS.workdir, name) if FLAGS.sweep else FLAGS.workdir
    cmd = command(FLAGS.experiment, FLAGS.config, wd, fixed + combo)
    res_path = os.path.join(wd, "results.json")
    print(f"[{i}/{len(runs)}] {name}: {' '.join(cmd[1:])}", flush=True)
    if FLAGS.dry_run:
      continue
    if not os.path.exists(res_path):
      t0 = time.time()
      rc = subprocess.call(cmd)
      print(f"[{i}/{len(runs)}] {name}: exit {rc} after {time.time() - t0:.0f} s", flush=True)
    rows.append((name, json.load(open(res_path)) if os.path.exists(res_path) else None))
  if FLAGS.dry_run:
    return
  table = results_table(rows, FLAGS.metrics)
  with open(os.path.join(FLAGS.workdir, "results.md"), "w") as f:
    f.write(f"command: {' '.join(sys.argv)}\n\n{table}\n")
  print("\n" + table)
  if plot(rows, FLAGS.metrics[0], os.path.join(FLAGS.workdir, "results.png")):
    print(f"\nwrote {FLAGS.workdir}/results.md and {FLAGS.workdir}/results.png")
  if any(r is None for _, r in rows):
    sys.exit(1)


if __name__ == "__main__":
  define_flags()
  app.run(main)
