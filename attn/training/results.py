"""The one markdown table of results that the experiments and launch.py print."""

from __future__ import annotations

from attn.common.tables import format_cell, markdown_table

COLUMNS = ("decoder", "score", "normalizer", "params", "bleu", "chrf", "exact_match",
           "tokens_per_sec", "wall_s")
# The summarization task's scores replace the translation ones (results_table picks by content).
SUMMARY_COLUMNS = ("decoder", "score", "normalizer", "params", "rouge1", "rouge2", "rougeL",
                   "tokens_per_sec", "wall_s")
# The captioning task's (attn.training.captioning), picked the same way.
CAPTION_COLUMNS = ("decoder", "score", "normalizer", "params", "exact_match", "digit_accuracy",
                   "aer", "attention_on_gold", "wall_s")


def results_table(rows, columns=None) -> str:
  """A markdown table, one row per run.

  rows: results dicts, or (name, results dict or None) pairs; a named table gets a `run` column,
  and a None result (a run that failed) shows "failed" in every column. Runs with exact match by
  source length (built-in tasks) get one line each under the table.
  """
  named = [r if isinstance(r, tuple) else (None, r) for r in rows]
  if columns is None:
    has = lambda field: any(res is not None and field in res for _, res in named)
    columns = (SUMMARY_COLUMNS if has("rouge1") else CAPTION_COLUMNS if has("digit_accuracy")
               else COLUMNS)
  with_names = any(name is not None for name, _ in named)
  head = (["run"] if with_names else []) + list(columns)
  body = [([name] if with_names else [])
          + [format_cell(res.get(c, "")) if res is not None else "failed" for c in columns]
          for name, res in named]
  lines = [markdown_table(head, body)]
  for name, res in named:
    if res and "exact_match_by_src_len" in res:
      label = name if with_names else res.get("decoder", "")
      lines.append(f"\n{label}: exact match by source length " + ", ".join(
          f"{k}: {v:.2f}" for k, v in res["exact_match_by_src_len"].items()))
    if res and "exact_match_by_digits" in res:
      label = name if with_names else res.get("decoder", "")
      lines.append(f"\n{label}: exact match by number of digits " + ", ".join(
          f"{k}: {v:.2f}" for k, v in res["exact_match_by_digits"].items()))
  return "\n".join(lines)
