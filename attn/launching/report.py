"""A sweep's report: the results table (one row per run, or with seeds mean ± std per
combination, marked better or worse than an ablation's base by spread.RULE, then the runs), the
bar plot of the first column, <workdir>/results.md, and the lines naming the runs that failed or
have not finished. The columns are --metrics with nested fields expanded (attn.launching.columns);
a field a finished run lacks is said to be missing, never averaged over the runs that have it."""

from __future__ import annotations

import os
import sys

from attn.common.files import write_text
from attn.common.tables import format_cell, markdown_table
from attn.common import plots
from attn.launching import columns as columns_lib
from attn.launching import rundirs, spread
from attn.launching.columns import MISSING, lookup
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
  s = spread.spread(nums)
  return f"{s.mean:.3f} ± {s.std:.3f}"


def _spread(values):
  """The spread.Spread of `values` when they are all numbers (and some), else None."""
  return spread.spread(values) if values and all(map(_number, values)) else None


def seed_cell(values, column, base_values=None) -> str:
  """One cell of the seed table from the finished seeds' values of `column`: 'missing in k of n'
  when k of them lack it (no mean over the others: it would not be the n seeds' mean), else
  `mean_std`, followed by ' (better)' or ' (worse)' where it differs from `base_values` (the
  base's seeds' values) by spread.RULE."""
  missing = sum(v is MISSING for v in values)
  if missing:
    return f"missing in {missing} of {len(values)}"
  text = mean_std(values)
  if base_values is None:
    return text
  mark = spread.verdict(_spread(values), _spread(base_values), spread.direction(column))
  return f"{text} ({mark})" if mark else text


def seed_table(states, columns, base=None) -> str:
  """A markdown table, one row per combination: n (finished seeds, 'k of n' when some are not)
  and each column's cell (`seed_cell`) over them, marked against the combination named `base`
  where one is given and has finished seeds; 'failed' / 'pending' when none has finished.
  states: [(run, state, detail)] as `rundirs.status` gives them."""
  groups = {}
  for run, state, detail in states:
    groups.setdefault(run.group, []).append((state, detail))
  done = {g: [detail for state, detail in members if state == "done"]
          for g, members in groups.items()}
  ref = done.get(base) or None
  rows = []
  for group, members in groups.items():
    results = done[group]
    n = str(len(results)) if len(results) == len(members) else f"{len(results)} of {len(members)}"
    if results:
      against = None if group == base else ref
      cells = [seed_cell([lookup(r, c) for r in results], c,
                         None if against is None else [lookup(r, c) for r in against])
               for c in columns]
    else:
      word = "failed" if any(s in ("failed", "refuse") for s, _ in members) else "pending"
      cells = [word] * len(columns)
    rows.append([group, n, *cells])
  return markdown_table(["run", "n", *columns], rows)


def notes(columns, base, missing) -> str:
  """What the seed table's cells mean: mean ± std over the n seeds; with a `base`, spread.RULE
  and each metric's better direction; with `missing` cells, what those say."""
  lines = ["Each cell: mean ± std (ddof 1) over the row's n finished seeds."]
  if base:
    fields = list(dict.fromkeys(map(columns_lib.field, columns)))
    by_way = {}
    for f in fields:
      way = spread.direction(f)
      by_way.setdefault(f"{way.better} is better" if way else "not marked", []).append(f)
    lines.append(spread.RULE.replace("`base`", f"`{base}`") + " Here "
                 + "; ".join(f"{k}: {', '.join(v)}" for k, v in by_way.items()) + ".")
  if missing:
    lines.append("'missing in k of n': k of the n finished seeds' results.json lack the field, "
                 "so no mean is given.")
  return "\n\n".join(lines)


def _row(detail, columns) -> dict:
  """A finished run's results with each column's value (MISSING where it has none) added, less
  the nested fields the columns spread out (results_table would list them again per run)."""
  spread_out = {columns_lib.field(c) for c in columns if c != columns_lib.field(c)}
  return {**{k: v for k, v in detail.items() if k not in spread_out},
          **{c: lookup(detail, c) for c in columns}}


def tables(states, columns, seeds, base=None) -> str:
  """The results table: one row per run, or with seeds one per combination (marked against
  `base`, see `seed_table`), its notes, then the runs. A cell a finished run has no value for
  says "missing"."""
  marks = {"new": "pending", "pending": "pending"}  # unfinished runs; failed and refused: None
  rows = [(run.name, _row(detail, columns) if state == "done" else
           {c: marks[state] for c in columns} if state in marks else None)
          for run, state, detail in states]
  if not seeds:
    return results_table(rows, columns)
  missing = any(state == "done" and columns_lib.absent(detail, columns)
                for _, state, detail in states)
  return (f"{seed_table(states, columns, base)}\n\n{notes(columns, base, missing)}"
          f"\n\nper seed:\n\n{results_table(rows, columns)}")


def bars(states, column, seeds):
  """What the plot shows: each finished run's `column`, or with seeds each combination's mean and
  std (None for one seed) over its finished seeds (none for a combination where some of them
  lack it)."""
  done = [(run, lookup(detail, column)) for run, state, detail in states if state == "done"]
  if not seeds:
    return [(run.name, v, None) for run, v in done if _number(v)]
  groups = {}
  for run, v in done:
    groups.setdefault(run.group, []).append(v)
  points = [(g, _spread(v)) for g, v in groups.items()]
  return [(g, s.mean, s.std) for g, s in points if s is not None]


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


def _note_missing(states, columns):
  """One stderr line naming the finished runs whose results.json lack a tabulated column."""
  lacking = [(run.name, columns_lib.absent(detail, columns)) for run, state, detail in states
             if state == "done"]
  lacking = [(name, cols) for name, cols in lacking if cols]
  if lacking:
    shown = "; ".join(f"{name}: {', '.join(cols)}" for name, cols in lacking[:4])
    runs = "1 finished run lacks" if len(lacking) == 1 else f"{len(lacking)} finished runs lack"
    print(f"\n{runs} a tabulated field in results.json (their cells say missing): {shown}"
          f"{'; ...' if len(lacking) > 4 else ''}", file=sys.stderr)


def summarize(runs, workdir, metrics, seeds, argv, *, collect=False, base=None) -> int:
  """Writes <workdir>/results.md (the command and the table) and results.png (the first column)
  from the run directories as they are now, and lists the runs that failed or have not finished;
  the exit status: FAILED if any failed or was refused (with `collect`, also if any is pending),
  else 0. metrics: --metrics, expanded into columns by `columns.expand`; base: the combination
  the others are marked against (with seeds), or None."""
  states = [(run, *rundirs.status(run)) for run in runs]
  columns = columns_lib.expand(metrics, [d for _, state, d in states if state == "done"])
  table = tables(states, columns, seeds, base)
  os.makedirs(workdir, exist_ok=True)
  write_text(os.path.join(workdir, "results.md"), f"command: {' '.join(argv)}\n\n{table}\n")
  print("\n" + table)
  if plot(bars(states, columns[0], seeds), columns[0], os.path.join(workdir, "results.png")):
    print(f"\nwrote {workdir}/results.md and {workdir}/results.png")
  _note_missing(states, columns)
  failed = [run.name for run, state, _ in states if state in ("failed", "refuse")]
  pending = [run.name for run, state, _ in states if state in ("pending", "new")]
  if pending:
    print(f"\n{len(pending)} of {len(runs)} runs have not finished: {', '.join(pending)}"
          + ("" if collect else "; when they have, rerun this command with --collect"))
  if failed:
    print(f"\n{len(failed)} of {len(runs)} runs failed or were refused: {', '.join(failed)}",
          file=sys.stderr)
  return FAILED if failed or (pending and collect) else 0
