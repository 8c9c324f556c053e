"""The results table's columns: results.json fields as --metrics names them.

A dotted name walks into a nested field: `exact_match_by_src_len.10-19` is the "10-19" key of
that dict, `attention_on_gold_by_layer.0` the first entry of that list. A field whose value is a
dict or a list becomes one column per entry, named the same way (`exact_match_by_src_len`
gives `exact_match_by_src_len.0-9`, `exact_match_by_src_len.10-19`, ...), so that every column
holds one number per run and can be averaged over seeds like any other.
"""

from __future__ import annotations

SEP = "."


class _Missing:
  """What `lookup` gives for a field a run's results.json lacks; its cells say so."""

  def __repr__(self):
    return "missing"

  __str__ = __repr__


MISSING = _Missing()


def field(column: str) -> str:
  """The results.json field a column reads (`exact_match_by_src_len.10-19`: the dict's name)."""
  return column.split(SEP, 1)[0]


def lookup(results: dict, column: str):
  """The value at `column` in `results`: each dotted component a dict key or, in a list, an
  index. MISSING where the path ends early or the value is null (an empty bucket)."""
  value = results
  for part in column.split(SEP):
    if isinstance(value, dict) and part in value:
      value = value[part]
    elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
      value = value[int(part)]
    else:
      return MISSING
  return MISSING if value is None else value


def _leaves(value, name) -> list:
  """The column names under `name` for `value`: itself for a scalar, else one per entry."""
  if isinstance(value, dict):
    items = value.items()
  elif isinstance(value, list):
    items = enumerate(value)
  else:
    return [name]
  return [leaf for key, v in items for leaf in _leaves(v, f"{name}{SEP}{key}")]


def expand(metrics, results) -> list:
  """The table's columns for `metrics` over the finished runs' `results` (dicts): each metric as
  named, or, where a run holds a dict or list there, one column per entry (nested ones too), in
  the order the runs first report them; a metric no run holds stays one column, whose cells say
  "missing". A column named twice appears once."""
  columns = []
  for m in metrics:
    found = [leaf for r in results if (v := lookup(r, m)) is not MISSING
             for leaf in _leaves(v, m)]
    columns += found or [m]
  return list(dict.fromkeys(columns))


def absent(results: dict, columns) -> list:
  """The columns `results` (one finished run's) has no value for."""
  return [c for c in columns if lookup(results, c) is MISSING]
