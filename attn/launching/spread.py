"""Seeds' values summarized (mean, std with ddof=1, n), and when a setting of an ablation counts
as better or worse than its `base`: the rule, and which direction is better for each metric."""

from __future__ import annotations

import dataclasses
import statistics

from attn.launching import columns
from attn.registry import Registry


@dataclasses.dataclass(frozen=True)
class Direction:
  """Which way a metric improves. better: "higher" or "lower" (the notes' word); sign: +1 when a
  larger value is better, -1 when a smaller one is."""
  better: str
  sign: int


HIGHER = Direction("higher", 1)
LOWER = Direction("lower", -1)

# The one place a metric's better direction is decided; a column of a nested field takes its
# field's (`exact_match_by_src_len.10-19`: exact_match_by_src_len's). A field not here (params,
# step, shares such as copied_share that are neither good nor bad) is never marked.
DIRECTIONS: Registry[Direction] = Registry("metric direction")
# The tasks' scores; a run that decodes with a beam also reports each as `<score>_greedy`.
for _score in ("bleu", "chrf", "exact_match", "digit_accuracy", "rouge1", "rouge2", "rougeL",
               "rouge1_max", "rouge2_max", "rougeL_max", "rouge1_subject", "rouge2_subject",
               "rougeL_subject", "hr10", "ndcg10"):
  DIRECTIONS.add(_score, HIGHER)
  DIRECTIONS.add(f"{_score}_greedy", HIGHER)
for _name in ("exact_match_by_src_len", "exact_match_by_digits", "digit_accuracy_by_digits",
              "hr10_by_length", "ndcg10_by_length", "attention_on_gold",
              "attention_on_gold_by_layer", "attention_on_gold_by_length",
              "attention_on_gold_by_layer_and_length", "gold_is_argmax_by_layer",
              "tokens_per_sec", "tokens_per_sec_steady"):
  DIRECTIONS.add(_name, HIGHER)
for _name in ("aer", "repeated_trigram_rate", "wall_s", "decode_s", "eval_s"):
  DIRECTIONS.add(_name, LOWER)


def direction(column: str) -> Direction | None:
  """The better direction of a table column (a dotted column: its field's), or None."""
  name = columns.field(column)
  return DIRECTIONS.get(name) if name in DIRECTIONS else None


@dataclasses.dataclass(frozen=True)
class Spread:
  """The seeds' values of one cell: mean, std (ddof=1; None for a single value) and n."""
  mean: float
  std: float | None
  n: int


def spread(values) -> Spread:
  """mean, std (ddof=1) and n of `values` (numbers; at least one)."""
  values = list(values)
  std = statistics.stdev(values) if len(values) > 1 else None
  return Spread(statistics.fmean(values), std, len(values))


# The rule: a setting differs from base only when |mean - base mean| > std + base std, strictly.
# Why this one: it is the test a reader applies by eye to a table of mean ± std (the two ±1 std
# intervals do not overlap), and it is stricter than the spread of the difference itself,
# sqrt(std² + base std²) <= std + base std. It is a screening rule, not a significance test: at
# three seeds each with equal stds it amounts to Welch's t > 2.45 (4 degrees of freedom,
# two-sided p ≈ 0.07), and with so few seeds a test's normality assumption cannot be checked.
RULE = ("A setting's cell is marked (better) or (worse) than `base` only when its mean differs "
        "from base's by more than the sum of the two standard deviations, |mean − base mean| > "
        "std + base std (ddof 1, each over its finished seeds; a difference equal to the sum is "
        "not marked), in the direction that is better for the column's metric; a cell of one "
        "seed, and a column whose metric has no better direction, is never marked.")


def verdict(setting: Spread | None, base: Spread | None, better: Direction | None) -> str:
  """"better" or "worse" when `setting` differs from `base` by the RULE, else ""."""
  if better is None or setting is None or base is None or None in (setting.std, base.std):
    return ""
  gain = better.sign * (setting.mean - base.mean)
  if abs(gain) <= setting.std + base.std:
    return ""
  return "better" if gain > 0 else "worse"
