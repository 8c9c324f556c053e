"""launch's results table: nested results.json fields as columns (attn.launching.columns), each
column's mean ± std over seeds against the statistics module and numpy float64, and fields a
run does not report, which are said to be missing rather than averaged over the other seeds."""

import json
import statistics

import numpy as np
import pytest

from attn.launching import columns, report, sweeps
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
# cells: mean ± std, missing values

@pytest.mark.parametrize("values", [
    [0.211, 0.199, 0.223], [55.0, 54.1, 55.9], [0.62, 0.71, 0.53, 0.66], [12.5, 13.25],
    [0.5, 0.5, 0.5]])
def test_a_cell_is_the_mean_and_sample_std_over_seeds(values):
  assert report.seed_cell(values) == ref(values)


@pytest.mark.parametrize("values,expected", [
    ([0.2, MISSING, 0.4], "missing in 1 of 3"),  # not 0.300 ± 0.141 over two of them
    ([MISSING, MISSING], "missing in 2 of 2"),
    ([0.2], "0.200"),  # one seed: its value, no std
    ([170776, 170776, 170776], "170,776"),  # an integer equal over seeds: once
])
def test_a_cell_says_what_it_cannot_average(values, expected):
  assert report.seed_cell(values) == expected


# ---------------------------------------------------------------------------------------------
# the table of a sweep

def _states(results_by_name):
  """(run, "done", results) states of runs named `group,seed=k`."""
  return [(sweeps.Run(name, name, "translate", None, (), group=name.split(",seed=")[0]), "done",
           res) for name, res in results_by_name.items()]


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
  assert err.strip().splitlines()[-1] == (
      "1 finished run lacks a tabulated field in results.json (their cells say missing): "
      "decoder=luong,seed=1: aer")
