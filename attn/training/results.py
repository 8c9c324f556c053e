"""Result records: atomic JSON writes and the one markdown table of results that the experiments
and launch.py print."""

from __future__ import annotations

import json
import os
import tempfile

COLUMNS = ("decoder", "score", "normalizer", "params", "bleu", "chrf", "exact_match",
           "tokens_per_sec", "wall_s")
# The summarization task's scores replace the translation ones (results_table picks by content).
SUMMARY_COLUMNS = ("decoder", "score", "normalizer", "params", "rouge1", "rouge2", "rougeL",
                   "tokens_per_sec", "wall_s")


def write_json(path, obj, **dump_kw):
  """Writes `obj` as JSON to `path` atomically: readers see the old file or the whole new one."""
  write_text(path, json.dumps(obj, indent=1, **dump_kw))


def write_text(path, text: str):
  """Writes `text` to `path` atomically (a temporary file in the same directory, then rename)."""
  directory = os.path.dirname(os.path.abspath(path))
  fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path), suffix=".tmp")
  try:
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would hide the record from other users
    with os.fdopen(fd, "w") as f:
      f.write(text)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise


def _fmt(v) -> str:
  if isinstance(v, bool):
    return str(v)
  if isinstance(v, int):
    return f"{v:,}"
  return f"{v:.3f}" if isinstance(v, float) else str(v)


def results_table(rows, columns=None) -> str:
  """A markdown table, one row per run.

  rows: results dicts, or (name, results dict or None) pairs; a named table gets a `run` column,
  and a None result (a run that failed) shows "failed" in every column. Runs with exact match by
  source length (built-in tasks) get one line each under the table.
  """
  named = [r if isinstance(r, tuple) else (None, r) for r in rows]
  if columns is None:
    summaries = any(res is not None and "rouge1" in res for _, res in named)
    columns = SUMMARY_COLUMNS if summaries else COLUMNS
  with_names = any(name is not None for name, _ in named)
  head = (["run"] if with_names else []) + list(columns)
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for name, res in named:
    cells = [_fmt(res.get(c, "")) if res is not None else "failed" for c in columns]
    lines.append("| " + " | ".join(([name] if with_names else []) + cells) + " |")
  for name, res in named:
    if res and "exact_match_by_src_len" in res:
      label = name if with_names else res.get("decoder", "")
      lines.append(f"\n{label}: exact match by source length " + ", ".join(
          f"{k}: {v:.2f}" for k, v in res["exact_match_by_src_len"].items()))
  return "\n".join(lines)
