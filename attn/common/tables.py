"""The one markdown-table formatter: results tables, benchmark tables and reports all use it."""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence


def format_cell(v: Any, *, digits: int = 3) -> str:
  """A cell: thousands separators for ints, `digits` decimals for floats, "" for None."""
  if v is None:
    return ""
  if isinstance(v, bool):
    return str(v)
  if isinstance(v, int):
    return f"{v:,}"
  if isinstance(v, float):
    return f"{v:.{digits}f}"
  return str(v)


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]],
                   fmt: Callable[[Any], str] = format_cell) -> str:
  """`header` and one line per row; each cell through `fmt` (strings pass through unchanged)."""
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for row in rows:
    row = list(row)
    if len(row) != len(header):
      raise ValueError(f"a row of {len(row)} cells under a header of {len(header)}: {row}")
    lines.append("| " + " | ".join(c if isinstance(c, str) else fmt(c) for c in row) + " |")
  return "\n".join(lines)
