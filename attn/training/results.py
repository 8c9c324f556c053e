"""The one markdown table of results that the experiments and launch.py print."""

from __future__ import annotations

from attn.common import applications
from attn.common.tables import format_cell, markdown_table

# The table of a run whose task the registry cannot tell (no registered task's first score).
COLUMNS = ("decoder", "score", "normalizer", "params", "tokens_per_sec", "wall_s")


def _task_of(named):
  """The task class of the first result a registered application's task claims, or None."""
  for _, res in named:
    name = applications.app_of_results(res) if res is not None else None
    if name is not None:
      return applications.app(name).task_class
  return None


def results_table(rows, columns=None) -> str:
  """A markdown table, one row per run.

  rows: results dicts, or (name, results dict or None) pairs; a named table gets a `run` column,
  and a None result (a run that failed) shows "failed" in every column. The columns are those
  of the task that reported the results (`Task.columns`); the fields it notes (`Task.notes`: exact match by source length, by number of
  digits) get one line each under the table.
  """
  named = [r if isinstance(r, tuple) else (None, r) for r in rows]
  task = _task_of(named)
  if columns is None:
    columns = task.columns if task is not None else COLUMNS
  with_names = any(name is not None for name, _ in named)
  head = (["run"] if with_names else []) + list(columns)
  body = [([name] if with_names else [])
          + [format_cell(res.get(c, "")) if res is not None else "failed" for c in columns]
          for name, res in named]
  lines = [markdown_table(head, body)]
  for field, label in (task.notes if task is not None else ()):
    for name, res in named:
      if res and field in res:
        head = name if with_names else res.get("decoder", "")
        lines.append(f"\n{head}: {label} " + ", ".join(f"{k}: {v:.2f}"
                                                        for k, v in res[field].items()))
  return "\n".join(lines)
