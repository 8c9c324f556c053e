"""Smoke test of experiments/variant_costs.py (attn/benchmarks/variant_costs.py, recall.py): a
tiny sweep end to end into a temporary directory, its numbers checked against independent facts,
and its task against NumPy."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attn.errors import ConfigError
from attn.benchmarks import recall
from attn.benchmarks import variant_costs as vc

# Global and linear: the two ends (weights formed / never formed). Trained at T=16, tested at
# T=32: the train-once, test-longer path of the default run.
TINY = dict(variants=("global", "linear"), lengths=(16, 32), quality_lengths=(32,), d_model=8,
            heads=2, layers=1, d_ff=16, half_width=4, top_k=4, warmup=1, repeats=1,
            train_steps=2, train_batch=4, train_length=16, eval_examples=8)


def test_a_tiny_sweep_writes_its_files_and_sane_numbers(tmp_path):
  s = vc.Settings(**TINY)
  lines = []
  result = vc.run(s, str(tmp_path), command="pytest", log=lines.append)

  md = (tmp_path / "variant_costs.md").read_text()
  assert "| variant | T | encoder step ms" in md and "pytest" in md and result["table"] in md
  assert json.loads((tmp_path / "variant_costs.json").read_text())["table"] == result["table"]
  assert (tmp_path / "variant_costs.png").stat().st_size > 1000
  # One progress line per cost cell and per quality cell.
  assert sum(" cost " in l for l in lines) == 2 * 2
  assert sum(" quality " in l and "trained at" not in l for l in lines) == 2

  cost = {(r["variant"], r["T"]): r for r in result["cost"]}
  for r in cost.values():
    assert r["encoder_ms"] > 0 and r["attention_ms"] > 0, r  # every tiny cell ran
    # The train step holds the attention layer's work and more (FF, Adam, two copies of state).
    assert r["encoder_mib"] > r["attention_mib"] > 0
  # Global attention's [T, T] scores: doubling T grows the layer's memory, by more than the
  # linear growth of its [T, d] inputs.
  g16, g32 = cost["global", 16]["attention_mib"], cost["global", 32]["attention_mib"]
  assert g32 > g16
  assert cost["global", 32]["encoder_mib"] > cost["global", 16]["encoder_mib"]

  quality = result["quality"]
  assert {(r["variant"], r["T"]) for r in quality} == {("global", 32), ("linear", 32)}
  for r in quality:
    assert 0.0 <= r["accuracy"] <= 1.0
    w = np.array(r["gold_weight_by_layer_head"])
    assert w.shape == (1, 2) and np.all(w >= -1e-6) and np.all(w <= 1 + 1e-6)
    assert r["train_T"] == 16


def test_the_gold_probe_reads_the_weights_the_layer_forms():
  """gold_attention's one-hot-value probe equals the weights Attention returns (global)."""
  s = vc.Settings(**TINY)
  graphdef, state = nnx.split(recall.RecallModel(vc.model_config(s, "global", 16), s.num_values,
                                             rngs=nnx.Rngs(0)))
  tokens, _, gold = recall.recall_batch(jax.random.PRNGKey(3), 5, 16, s.num_keys, s.num_values)

  @jax.jit
  def probe_and_weights(state, tokens, gold):
    enc = nnx.merge(graphdef, state).encoder
    positions = jnp.arange(16)[None]
    layer = enc.layers[0]
    h = layer.norm_attn(enc.embedding(tokens, positions))
    kp, v = layer.attn.keys_values(h, positions)
    _, att = layer.attn(layer.attn.queries(h, positions), kp, v, q_pos=positions,
                        k_pos=positions, key_lengths=recall.full_lengths(tokens))
    return recall.gold_attention(enc, tokens, gold), att.weights  # [B, L, H], [B, H, T, T]

  probe, w = map(np.asarray, probe_and_weights(state, tokens, gold))
  want = w[np.arange(5), :, -1, np.asarray(gold)]  # [B, H]
  np.testing.assert_allclose(probe[:, 0], want, rtol=1e-5, atol=1e-6)
  assert np.all(want > 0)


@pytest.mark.parametrize("T", [2, 40])
def test_the_recall_gold_position_holds_the_queried_key_and_the_label(T):
  K, V = 5, 3
  tokens, labels, gold = map(np.asarray, recall.recall_batch(jax.random.PRNGKey(T), 64, T, K, V))
  assert tokens.shape == (64, T) and tokens.min() >= 0 and tokens.max() < K * (V + 1)
  pairs, query = tokens[:, :-1], tokens[:, -1]
  assert np.all(query >= K * V) and np.all(pairs < K * V)  # pair tokens, then one query token
  q = query - K * V
  keys, values = pairs // V, pairs % V
  rows = np.arange(64)
  assert np.all(keys[rows, gold] == q) and np.all(values[rows, gold] == labels)
  assert np.all((keys == q[:, None]).sum(1) == 1)  # nowhere else: the answer is unambiguous
  assert np.all((0 <= gold) & (gold < T - 1))


@pytest.mark.parametrize("bad, match", [
    (dict(variants=("global", "sliding")), "unknown variant.*sliding.*known: fused, global"),
    (dict(lengths=(256, 0)), "--lengths: lengths must be positive"),
    (dict(quality_lengths=(-4,)), "--quality_lengths"),
    (dict(d_model=10, heads=4), "not divisible"),
    (dict(pos_encoding="alibi", variants=("linear",)), "model.transformer.enc_self"),
    (dict(pos_encoding="alibi", variants=("fused",)), "--variants=fused: .*no kernel"),
])
def test_bad_settings_fail_with_one_clear_message(bad, match):
  with pytest.raises(ConfigError, match=match):
    vc.Settings(**bad)


def test_the_entry_point_reports_a_bad_flag_as_one_line():
  import subprocess
  import sys
  out = subprocess.run([sys.executable, "-m", "experiments.variant_costs", "--variants=sliding",
                        "--out=/nonexistent"], capture_output=True, text=True, timeout=60)
  assert out.returncode == 2
  assert out.stderr.strip().splitlines() == [
      "error: --variants: unknown variant(s) sliding; known: fused, global, linear, topk, window"]


def test_a_cell_over_a_limit_reports_its_memory_and_why_it_was_not_timed():
  s = vc.Settings(**{**TINY, "max_memory_gib": 1e-6})
  cell = vc.measure_cell(s, vc.attention_step, "global", 16, None)
  assert cell["ms"] is None and cell["mib"] > 0 and "--max_memory_gib" in cell["note"]
  # 1 ms at T=8, quadratic to T=16: 4 ms, over a 2 ms limit.
  s = vc.Settings(**{**TINY, "max_step_seconds": 0.002})
  cell = vc.measure_cell(s, vc.attention_step, "global", 16, (8, 0.001))
  assert cell["ms"] is None and cell["mib"] > 0 and cell["note"].startswith("predicted")
