"""launch.py: grid expansion, commands, tables, and one real (tiny) sweep end to end."""

import json
import os
import subprocess
import sys

import pytest

import launch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_grid_is_the_cartesian_product_with_readable_names():
  runs = launch.grid(["model.decoder=none,bahdanau", "model.score=dot,additive,general"])
  assert len(runs) == 6
  assert runs[0] == ("decoder=none,score=dot", [("model.decoder", "none"), ("model.score", "dot")])
  assert launch.grid([]) == [("run", [])]


def test_bad_axis_is_a_usage_error():
  with pytest.raises(launch.app.UsageError, match="key=value"):
    launch.parse_axis("model.decoder")


def test_command_passes_overrides_as_config_flags():
  cmd = launch.command("translate", "c.py:demo", "/w/x", [("model.decoder", "none")])
  assert cmd[1:] == ["-m", "experiments.translate", "--workdir=/w/x", "--config=c.py:demo",
                     "--config.model.decoder=none"]


def test_table_marks_failed_runs():
  table = launch.results_table([("a", {"bleu": 1.5, "params": 10}), ("b", None)], ["bleu", "params"])
  assert "| a | 1.500 | 10 |" in table and "| b | failed | failed |" in table


def test_a_sweep_runs_each_combination_and_writes_table_and_plot(tmp_path):
  p = subprocess.run(
      [sys.executable, "launch.py", "--experiment=translate",
       "--config=experiments/configs/translate.py:smoke", f"--workdir={tmp_path}",
       "--sweep=model.decoder=none,luong", "--set=model.score=dot"],
      cwd=REPO, capture_output=True, text=True, timeout=600)
  assert p.returncode == 0, p.stderr[-3000:]
  for name in ("decoder=none", "decoder=luong"):
    res = json.loads((tmp_path / name / "results.json").read_text())
    assert res["decoder"] == name.split("=")[1] and res["score"] == "dot"
  md = (tmp_path / "results.md").read_text()
  assert "| decoder=none |" in md and "| decoder=luong |" in md
  assert (tmp_path / "results.png").stat().st_size > 1000
