"""launch's results table: nested results.json fields as columns (attn.launching.columns), each
column's mean ± std over seeds against the statistics module and numpy float64, the better/worse
marks against an ablation's base at the rule's boundary (attn.launching.spread), and fields a
run does not report, which are said to be missing rather than averaged over the other seeds.
The end-to-end cases drive launch in-process with the fake experiment of tests/test_launch.py."""

import json
import statistics

import numpy as np
import pytest

from attn.launching import columns, entry_points, report, spread, sweeps
from attn.launching.columns import MISSING
from test_launch import fake, sweep  # noqa: F401  pylint: disable=unused-import


def ref(values) -> str:
  """'mean ± std' (ddof 1) from the statistics module, checked against numpy float64."""
  mean, std = statistics.fmean(values), statistics.stdev(values)
  arr = np.asarray(values, np.float64)
  assert abs(arr.mean() - mean) < 1e-12 and abs(arr.std(ddof=1) - std) < 1e-12
  return f"{mean:.3f} ± {std:.3f}"


# ---------------------------------------------------------------------------------------------
# nested fields as columns

RUN_A = {"bleu": 50.0, "exact_match_by_src_len": {"0-9": 0.9, "10-19": 0.5},
         "by_layer": [0.1, 0.2], "grid": [{"1-5": 0.3}, {"1-5": 0.4, "6-9": None}]}
RUN_B = {"bleu": 52.0, "exact_match_by_src_len": {"0-9": 0.8, "10-19": 0.4, "20-29": 0.1}}


@pytest.mark.parametrize("metrics,expected", [
    (["bleu"], ["bleu"]),
    # a dict: one column per key, in the order the runs first report them (B adds 20-29)
    (["exact_match_by_src_len"], ["exact_match_by_src_len.0-9", "exact_match_by_src_len.10-19",
                                  "exact_match_by_src_len.20-29"]),
    (["exact_match_by_src_len.10-19"], ["exact_match_by_src_len.10-19"]),
    (["by_layer"], ["by_layer.0", "by_layer.1"]),  # a list: by index
    (["grid"], ["grid.0.1-5", "grid.1.1-5", "grid.1.6-9"]),  # nested all the way down
    (["grid.1"], ["grid.1.1-5", "grid.1.6-9"]),
    (["aer"], ["aer"]),  # no run has it: one column, missing in every row
    (["bleu", "exact_match_by_src_len.0-9", "exact_match_by_src_len"],
     ["bleu", "exact_match_by_src_len.0-9", "exact_match_by_src_len.10-19",
      "exact_match_by_src_len.20-29"]),  # a column named twice appears once
])
def test_metrics_expand_into_one_column_per_entry_of_a_nested_field(metrics, expected):
  assert columns.expand(metrics, [RUN_A, RUN_B]) == expected


@pytest.mark.parametrize("column,expected", [
    ("bleu", 50.0), ("exact_match_by_src_len.10-19", 0.5), ("by_layer.1", 0.2),
    ("grid.1.1-5", 0.4),
    ("grid.1.6-9", MISSING),  # null: an empty bucket
    ("exact_match_by_src_len.20-29", MISSING), ("by_layer.2", MISSING), ("by_layer.x", MISSING),
    ("aer", MISSING), ("bleu.0", MISSING)])
def test_lookup_walks_dict_keys_and_list_indexes(column, expected):
  assert columns.lookup(RUN_A, column) == expected


# ---------------------------------------------------------------------------------------------
# cells: mean ± std, missing values, marks against base

@pytest.mark.parametrize("values", [
    [0.211, 0.199, 0.223], [55.0, 54.1, 55.9], [0.62, 0.71, 0.53, 0.66], [12.5, 13.25],
    [0.5, 0.5, 0.5]])
def test_a_cell_is_the_mean_and_sample_std_over_seeds(values):
  assert report.seed_cell(values, "exact_match") == ref(values)


@pytest.mark.parametrize("values,column,expected", [
    ([0.2, MISSING, 0.4], "aer", "missing in 1 of 3"),  # not 0.300 ± 0.141 over two of them
    ([MISSING, MISSING], "aer", "missing in 2 of 2"),
    ([0.2], "aer", "0.200"),  # one seed: its value, no std, no mark
    ([170776, 170776, 170776], "params", "170,776"),  # an integer equal over seeds: once
])
def test_a_cell_says_what_it_cannot_average(values, column, expected):
  assert report.seed_cell(values, column, base_values=[0.9, 1.0, 1.1]) == expected


BASE = [0.0, 1.0, 2.0]  # mean 1, std 1


@pytest.mark.parametrize("setting,column,gap,both,mark", [
    # |3 - 1| = 2 = 1 + 1: on the boundary, not marked ("exceeds" is strict)
    ([2.0, 3.0, 4.0], "exact_match", 2.0, 2.0, ""),
    ([2.5, 3.5, 4.5], "exact_match", 2.5, 2.0, "better"),
    ([2.5, 3.5, 4.5], "aer", 2.5, 2.0, "worse"),  # lower is better
    ([-2.0, -1.0, 0.0], "aer", 2.0, 2.0, ""),  # the boundary from below
    ([-2.5, -1.5, -0.5], "aer", 2.5, 2.0, "better"),
    ([-2.5, -1.5, -0.5], "bleu", 2.5, 2.0, "worse"),
    ([2.5, 3.5, 4.5], "exact_match_by_src_len.10-19", 2.5, 2.0, "better"),  # its field's way
    ([2.5, 3.5, 4.5], "params", 2.5, 2.0, ""),  # no better direction
    ([3.0, 3.0, 3.0], "bleu", 2.0, 1.0, "better"),  # no spread of its own
    ([1.5, 3.5, 5.5], "bleu", 2.5, 3.0, ""),  # beyond base's std, not beyond both
    ([3.5], "bleu", 2.5, None, ""),  # one seed: no spread to compare
])
def test_a_setting_is_marked_only_when_its_difference_exceeds_both_stds(setting, column, gap,
                                                                        both, mark):
  s, b = np.asarray(setting, np.float64), np.asarray(BASE, np.float64)
  assert abs(s.mean() - b.mean()) == gap  # the hand-computed figures, exact in float64
  if both is not None:
    assert s.std(ddof=1) + b.std(ddof=1) == both
  text = report.mean_std(setting)
  assert report.seed_cell(setting, column, base_values=BASE) == (
      f"{text} ({mark})" if mark else text)


def test_no_mark_against_a_base_that_lacks_the_column_or_has_one_seed():
  assert report.seed_cell([2.5, 3.5, 4.5], "bleu", [0.0, MISSING, 2.0]) == "3.500 ± 1.000"
  assert report.seed_cell([2.5, 3.5, 4.5], "bleu", [0.0]) == "3.500 ± 1.000"


def test_every_score_and_nested_field_has_a_better_direction():
  for name, exp in entry_points.EXPERIMENTS.items():
    fields = [*exp.scores, *(f"{s}_greedy" for s in exp.scores), *exp.nested]
    assert [f for f in fields if spread.direction(f) is None] == [], name
  assert spread.direction("aer") is spread.LOWER
  assert spread.direction("exact_match_by_src_len.0-9") is spread.HIGHER
  assert spread.direction("params") is None


# ---------------------------------------------------------------------------------------------
# the table of a sweep

def _states(results_by_name):
  """(run, "done", results) states of runs named `group,seed=k`."""
  return [(sweeps.LaunchedRun(name, name, "translate", None, (), group=name.split(",seed=")[0]),
           "done", res) for name, res in results_by_name.items()]


def test_a_run_without_seeds_shows_missing_not_an_empty_cell():
  states = _states({"a": {"bleu": 1.0, "aer": 0.5}, "b": {"bleu": 2.0}})
  table = report.tables(states, ["bleu", "aer"], seeds=[])
  assert "| a | 1.000 | 0.500 |" in table and "| b | 2.000 | missing |" in table


def test_the_plot_leaves_out_a_combination_with_a_missing_seed():
  states = _states({"x,seed=0": {"aer": 0.5}, "x,seed=1": {"aer": 0.7},
                    "y,seed=0": {"aer": 0.2}, "y,seed=1": {}})
  assert report.bars(states, "aer", [0, 1]) == [("x", statistics.fmean([0.5, 0.7]),
                                                 statistics.stdev([0.5, 0.7]))]


def test_a_seeded_grid_tabulates_each_bucket_over_its_seeds(tmp_path, fake, capsys):
  buckets = {"decoder=none": ([0.6, 0.7], [0.1, 0.3]), "decoder=luong": ([0.9, 0.8], [0.5, 0.2])}
  for group, (short, long) in buckets.items():
    for seed in (0, 1):
      res = {"exact_match_by_src_len": {"0-9": short[seed], "10-19": long[seed]}, "aer": 0.5}
      if group == "decoder=luong" and seed == 1:
        del res["aer"]  # as a run whose fused kernel formed no weights
      fake.outcome[f"{group},seed={seed}"] = (0, json.dumps(res))
  rc, _, err = sweep(tmp_path, "--sweep=model.rnn.decoder=none,luong", "--seeds=0,1",
                     "--metrics=exact_match_by_src_len,aer", capsys=capsys)
  assert rc == 0
  md = (tmp_path / "results.md").read_text()
  assert ("| run | n | exact_match_by_src_len.0-9 | exact_match_by_src_len.10-19 | aer |"
          in md)
  assert (f"| decoder=none | 2 | {ref([0.6, 0.7])} | {ref([0.1, 0.3])} | 0.500 ± 0.000 |"
          in md)
  assert (f"| decoder=luong | 2 | {ref([0.9, 0.8])} | {ref([0.5, 0.2])} | missing in 1 of 2 |"
          in md)
  assert "| decoder=luong,seed=1 | 0.800 | 0.200 | missing |" in md  # the per-seed table
  assert "exact match by source length" not in md  # not again under the table: in its columns
  assert "(better)" not in md and "(worse)" not in md and spread.RULE not in md  # no base
  assert err.strip().splitlines()[-1] == (
      "1 finished run lacks a tabulated field in results.json (their cells say missing): "
      "decoder=luong,seed=1: aer")


# the fake experiment's results.json per run: buckets, aer; luong's seed 1 formed no weights (no
# aer) and its seed 0 alone has a 20-29 bucket
EM = {"base": {"0-9": [0.6, 0.7, 0.8], "10-19": [0.1, 0.2, 0.3]},
      "decoder=none": {"0-9": [0.9, 0.95, 1.0], "10-19": [0.2, 0.3, 0.4]},
      "decoder=luong": {"0-9": [0.1, 0.2, 0.3], "10-19": [0.15, 0.25, 0.2]}}
AER = {"base": [0.5, 0.6, 0.7], "decoder=none": [0.1, 0.15, 0.2], "decoder=luong": [0.6, None, 0.8]}


def test_an_ablation_table_has_every_bucket_with_spread_and_marks(tmp_path, fake, capsys):
  for group, buckets in EM.items():
    for seed in range(3):
      res = {"exact_match_by_src_len": {k: v[seed] for k, v in buckets.items()}, "params": 10}
      if AER[group][seed] is not None:
        res["aer"] = AER[group][seed]
      if group == "decoder=luong" and seed == 0:
        res["exact_match_by_src_len"]["20-29"] = 0.05
      fake.outcome[f"{group},seed={seed}"] = (0, json.dumps(res))
  rc, _, err = sweep(tmp_path, "--vary=model.rnn.decoder=none,luong", "--seeds=0,1,2",
                     "--metrics=exact_match_by_src_len,aer,params", capsys=capsys)
  assert rc == 0 and len(fake.calls) == 9
  md = (tmp_path / "results.md").read_text()
  assert ("| run | n | exact_match_by_src_len.0-9 | exact_match_by_src_len.10-19 | "
          "exact_match_by_src_len.20-29 | aer | params |") in md
  em = {g: {k: ref(v) for k, v in b.items()} for g, b in EM.items()}
  assert (f"| base | 3 | {em['base']['0-9']} | {em['base']['10-19']} | missing in 3 of 3 | "
          f"{ref(AER['base'])} | 10 |") in md
  # 0-9: |0.95 - 0.7| > 0.05 + 0.1; 10-19: |0.3 - 0.2| < 0.1 + 0.1; aer 0.15 vs 0.6: lower
  assert (f"| decoder=none | 3 | {em['decoder=none']['0-9']} (better) | "
          f"{em['decoder=none']['10-19']} | missing in 3 of 3 | "
          f"{ref(AER['decoder=none'])} (better) | 10 |") in md
  assert (f"| decoder=luong | 3 | {em['decoder=luong']['0-9']} (worse) | "
          f"{em['decoder=luong']['10-19']} | missing in 2 of 3 | missing in 1 of 3 | 10 |") in md
  assert spread.RULE in md
  assert ("Here higher is better: exact_match_by_src_len; lower is better: aer; "
          "not marked: params.") in md
  assert "| decoder=luong,seed=1 | 0.200 | 0.250 | missing | missing | 10 |" in md  # per seed
  assert "exact match by source length" not in md  # not again under the table: in its columns
  lacking = err.strip().splitlines()[-1]
  assert lacking.startswith("8 finished runs lack a tabulated field in results.json (their "
                            "cells say missing): base,seed=0: exact_match_by_src_len.20-29; ")
  assert lacking.endswith("decoder=none,seed=0: exact_match_by_src_len.20-29; ...")
