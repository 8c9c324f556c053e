"""A sweep's report: the results table (one row per run, or with seeds mean ± std per
combination, then the runs), the bar plot of the first metric, <workdir>/results.md, and the
lines naming the runs that failed or have not finished."""

from __future__ import annotations

import os
import statistics
import sys

from attn.common.files import write_text
from attn.common.tables import format_cell, markdown_table
from attn.inspection import plots
from attn.launching import rundirs
from attn.training.results import results_table

FAILED = 1  # some run failed or was refused (with --collect: or has not finished)


def _number(v) -> bool:
  return isinstance(v, (int, float)) and not isinstance(v, bool)


def mean_std(values) -> str:
  """One cell of the seed table: 'mean ± std' (ddof=1) of the seeds' values; an integer equal
  over seeds (params) once; one seed's value alone; a non-number if all seeds agree, else ''."""
  nums = [v for v in values if _number(v)]
  if not nums:
    return str(values[0]) if values and all(v == values[0] for v in values) else ""
  if len(nums) == 1 or (all(isinstance(v, int) for v in nums) and len(set(nums)) == 1):
    return format_cell(nums[0])
  return f"{statistics.fmean(nums):.3f} ± {statistics.stdev(nums):.3f}"


def seed_table(states, columns) -> str:
  """A markdown table, one row per combination: n (finished seeds, 'k of n' when some are not)
  and each metric's mean ± std over them; 'failed' / 'pending' when none has finished.
  states: [(run, state, detail)] as `rundirs.status` gives them."""
  groups = {}
  for run, state, detail in states:
    groups.setdefault(run.group, []).append((state, detail))
  rows = []
  for group, members in groups.items():
    done = [detail for state, detail in members if state == "done"]
    n = str(len(done)) if len(done) == len(members) else f"{len(done)} of {len(members)}"
    if done:
      cells = [mean_std([r[c] for r in done if c in r]) for c in columns]
    else:
      word = "failed" if any(s in ("failed", "refuse") for s, _ in members) else "pending"
      cells = [word] * len(columns)
    rows.append([group, n, *cells])
  return markdown_table(["run", "n", *columns], rows)


def tables(states, metrics, seeds) -> str:
  """The results table: one row per run, or with seeds one per combination and then the runs."""
  marks = {"new": "pending", "pending": "pending"}  # unfinished runs; failed and refused: None
  rows = [(run.name, detail if state == "done" else
           {c: marks[state] for c in metrics} if state in marks else None)
          for run, state, detail in states]
  if not seeds:
    return results_table(rows, metrics)
  return f"{seed_table(states, metrics)}\n\nper seed:\n\n{results_table(rows, metrics)}"


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


def plot(points, metric, path):
  """A bar per (name, value, std or None), std as error bars; False if there is nothing to plot."""
  if not points:
    return False
  plt = plots.pyplot()
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


def summarize(runs, workdir, metrics, seeds, argv, *, collect=False) -> int:
  """Writes <workdir>/results.md (the command and the table) and results.png (the first metric)
  from the run directories as they are now, and lists the runs that failed or have not finished;
  the exit status: FAILED if any failed or was refused (with `collect`, also if any is pending),
  else 0."""
  states = [(run, *rundirs.status(run)) for run in runs]
  table = tables(states, metrics, seeds)
  os.makedirs(workdir, exist_ok=True)
  write_text(os.path.join(workdir, "results.md"), f"command: {' '.join(argv)}\n\n{table}\n")
  print("\n" + table)
  if plot(bars(states, metrics[0], seeds), metrics[0], os.path.join(workdir, "results.png")):
    print(f"\nwrote {workdir}/results.md and {workdir}/results.png")
  failed = [run.name for run, state, _ in states if state in ("failed", "refuse")]
  pending = [run.name for run, state, _ in states if state in ("pending", "new")]
  if pending:
    print(f"\n{len(pending)} of {len(runs)} runs have not finished: {', '.join(pending)}"
          + ("" if collect else "; when they have, rerun this command with --collect"))
  if failed:
    print(f"\n{len(failed)} of {len(runs)} runs failed or were refused: {', '.join(failed)}",
          file=sys.stderr)
  return FAILED if failed or (pending and collect) else 0
