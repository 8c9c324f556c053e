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
