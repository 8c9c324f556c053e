"""Smoke test of `make run`'s demo: a few steps end to end, outputs land in the workdir."""

import json

from experiments import demo


def test_demo_learns_with_a_parametric_score_and_writes_outputs(tmp_path):
  rows = demo.run_demo(str(tmp_path), scores=["additive", "dot"], normalizers=["softmax"],
                       steps=60, num_keys=6, dim=8, noise=0.1, seed=0)
  acc = {r["score"]: r["accuracy"] for r in rows}
  assert acc["additive"] > 0.8 > acc["dot"]  # the learned score beats the fixed one
  assert json.loads((tmp_path / "results.json").read_text()) == rows
  assert (tmp_path / "attention.png").stat().st_size > 1000


def test_the_demo_writes_apart_from_make_runs_sweep():
  """`make demo` and `make run` write to different directories, neither inside the other (the
  demo's results.json and attention.png once landed among the sweep's run directories)."""
  import os
  import re
  from experiments.demo import Settings
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  with open(os.path.join(root, "Makefile")) as f:
    makefile = f.read()
  run_recipe = makefile.split("\nrun:", 1)[1].split("\n\n", 1)[0]
  demo_recipe = makefile.split("\ndemo:", 1)[1].split("\n\n", 1)[0]
  run_dir = os.path.normpath(re.search(r"--workdir=(\S+)", run_recipe).group(1))
  demo_dir = re.search(r"--workdir=(\S+)", demo_recipe)
  demo_dir = os.path.normpath(demo_dir.group(1) if demo_dir else Settings().workdir)
  assert os.path.commonpath([run_dir, demo_dir]) not in (run_dir, demo_dir), (run_dir, demo_dir)
