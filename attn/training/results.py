"""What a finished run reports: the results.json a task writes by default (`write_results`), and
the one markdown table of results that the experiments and launch.py print."""

from __future__ import annotations

import dataclasses
import logging
import os

import numpy as np

from attn.common import applications, files
from attn.common.tables import format_cell, markdown_table

log = logging.getLogger(__name__)

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


def write_results(run, ckpt, role: str = "test") -> dict:
  """`Task.write_results`'s default: restores the best checkpoint (when the run evaluated;
  else the last step's parameters stay), evaluates split `role` through the task
  (`Task.evaluate`) and writes results.json (process 0 alone; every process returns the
  results). It holds the task's scores, the model config's top-level settings (e.g. score,
  normalizer: what a results table shows) and its whole record under `model_config`, and the
  run's figures: params, step and wall_s of the whole run, best_step (whose parameters were
  evaluated), tokens_per_sec (and its steady state), eval_s, best_eval."""
  from attn.models import count_params  # pylint: disable=import-outside-toplevel
  from attn.training import distributed, dtype_choice  # pylint: disable=import-outside-toplevel
  from attn.training.evaluation import eval_seconds  # pylint: disable=import-outside-toplevel
  from attn.training.workdir import model_record  # pylint: disable=import-outside-toplevel
  whole = run.progress  # the counters of the whole run, not those saved with best/
  if run.task.has_eval(run.bundle) and ckpt.best.latest_step() is not None:
    ckpt.restore(ckpt.best, run)
    log.info(f"restored best checkpoint (step {run.progress.step})")
  best_step = run.progress.step
  run.progress = p = dataclasses.replace(run.progress, step=whole.step, wall_s=whole.wall_s,
                                         train_tokens=whole.train_tokens)
  scores = run.task.evaluate(run, role)
  record = model_record(run.mc)
  results = {"split": role,
             **{k: v for k, v in record.items() if isinstance(v, (str, int, float, bool))},
             **scores, "params": count_params(run.model), "step": p.step,
             "best_step": best_step, "tokens_per_sec": p.train_tokens / max(p.wall_s, 1e-9),
             "wall_s": p.wall_s, "eval_s": eval_seconds(run.workdir), "model_config": record}
  if p.window_rates:  # steady state: median over logging windows, the first (compiling) left out
    results["tokens_per_sec_steady"] = float(np.median(p.window_rates[1:] or p.window_rates))
  if p.best_eval:
    results["best_eval"] = p.best_eval
  results.update(dtype_choice.figures(run))  # the compute dtype that ran, and what chose it
  if distributed.is_primary():
    files.write_json(os.path.join(run.workdir, "results.json"), results)
  return results
