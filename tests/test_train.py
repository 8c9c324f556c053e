"""Training end to end: a tiny model learns a tiny task, resuming equals not stopping, the CLI's files."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

import attn
from attn import training
from attn import decoding as decode
from attn.models import build_model
from experiments.configs import translate as translate_config
from experiments.configs import use_arch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tiny_config(**train_kw):
  c = translate_config.get_config("smoke")
  c.data.task = "copy"
  c.data.update(dict(min_len=2, max_len=5, task_vocab_size=5, train_size=256, eval_size=32,
                     test_size=32, max_src_len=8, max_tgt_len=8, num_buckets=1, batch_size=32))
  c.model.rnn.update(dict(emb_dim=16, enc_hidden=32, dec_hidden=32, d_attn=32))
  c.train.update(dict(steps=250, learning_rate=1e-2, warmup_steps=10, eval_every=250,
                      checkpoint_every=250, log_every=50, eval_decode_sentences=32))
  c.train.update(train_kw)
  return c


def test_a_tiny_attention_model_learns_to_copy_exactly(tmp_path):
  results = training.train_and_evaluate(_tiny_config(), str(tmp_path))
  assert results["exact_match"] == 1.0, results
  assert results["bleu"] == pytest.approx(100.0)
  # copying needs the diagonal: the argmax of attention should mostly land on it
  assert results["aer"] < 0.3 and results["attention_on_gold"] > 0.6, results
  assert results["params"] > 0 and results["tokens_per_sec"] > 0 and results["wall_s"] > 0


TINY_TRANSFORMER = dict(d_model=16, num_heads=2, d_ff=32)


@pytest.mark.parametrize("arch", ["rnn", "transformer"])
def test_resuming_after_a_kill_gives_the_same_model_as_an_uninterrupted_run(tmp_path, arch):
  cfg = _tiny_config(steps=8, checkpoint_every=4, eval_every=100, log_every=4)
  cfg.model.dropout = 0.3  # dropout keys must also follow the step, not the process
  if arch == "transformer":
    use_arch(cfg, "transformer", **TINY_TRANSFORMER)

  def run_steps(workdir, stop_after=None, resume=False):
    run = training.setup(cfg, workdir)
    ckpt = training.Checkpoints(workdir)
    if resume:
      assert ckpt.restore(ckpt.latest, run)
    training.train(run, ckpt, training.MetricsWriter(workdir), stop_after=stop_after)
    ckpt.close()
    return run

  straight = run_steps(str(tmp_path / "a"))
  killed = run_steps(str(tmp_path / "b"), stop_after=6)  # "killed" after step 6; last save at 4
  assert killed.progress.step == 6
  resumed = run_steps(str(tmp_path / "b"), resume=True)
  assert resumed.progress.step == 8
  as_np = lambda x: np.asarray(jax.random.key_data(x) if jax.dtypes.issubdtype(
      x.dtype, jax.dtypes.prng_key) else x)
  leaves = lambda r: jax.tree.leaves(r.state)
  assert len(leaves(straight)) == len(leaves(resumed))
  for x, y in zip(leaves(straight), leaves(resumed)):
    np.testing.assert_allclose(as_np(x), as_np(y), rtol=1e-6, atol=1e-7)
  last = lambda wd: [m for m in map(json.loads, open(os.path.join(wd, "metrics.jsonl")))
                     if m["split"] == "train"][-1]
  a, b = last(str(tmp_path / "a")), last(str(tmp_path / "b"))
  assert a["step"] == b["step"] == 8 and a["loss"] == pytest.approx(b["loss"], rel=1e-6)


# slow: tests/test_decode.py::test_beam_size_1_equals_greedy pins it fast on the decoder itself
@pytest.mark.slow
def test_beam_size_one_equals_greedy_on_a_real_model():
  from attn.models import ModelConfig, RNNConfig
  model = build_model(ModelConfig(src_vocab=11, tgt_vocab=9, dropout=0.0, rnn=RNNConfig(
      emb_dim=8, enc_hidden=8, dec_hidden=8, d_attn=8)))
  src = jax.numpy.asarray(np.random.default_rng(0).integers(4, 11, (3, 6)), "int32")
  lengths = jax.numpy.asarray([6, 4, 2], "int32")
  init = model.initial_decode_state(src, lengths)
  g = decode.greedy_decode(model.step_fn(), init, 3, 9)
  b = decode.beam_search(model.step_fn(), init, 3, 9, beam_size=1, length_penalty=0.0)
  np.testing.assert_array_equal(g.tokens, b.tokens)
  np.testing.assert_allclose(g.weights, b.weights, atol=1e-6)


def _cli(args, cwd=REPO):
  return subprocess.run([sys.executable, "-m", "experiments.translate", *args], cwd=cwd,
                        capture_output=True, text=True, timeout=600)


def test_translate_cli_writes_every_promised_file(tmp_path):
  wd = tmp_path / "wd"
  p = _cli(["--config=experiments/configs/translate.py:smoke", f"--workdir={wd}",
            "--config.model.rnn.decoder=luong", "--config.model.rnn.score=general"])
  assert p.returncode == 0, p.stderr[-3000:]
  for name in ("config.json", "metrics.jsonl", "predictions.txt", "results.json", "attention.npz",
               "attention.png", "checkpoints", "best"):
    assert (wd / name).exists(), name
  results = json.loads((wd / "results.json").read_text())
  for key in ("bleu", "params", "tokens_per_sec", "wall_s"):
    assert key in results
  assert len((wd / "predictions.txt").read_text().splitlines()) == 64  # smoke test split
  assert "| decoder |" in p.stdout
  # attention.npz: what the run viewer reads (weights, raw scores that renormalize to them,
  # token labels, references) for the first `attention_samples` test examples.
  z = np.load(wd / "attention.npz")
  assert str(z["normalizer"]) == results["normalizer"] and str(z["score"]) == "general"
  predictions = (wd / "predictions.txt").read_text().splitlines()
  for n, i in enumerate(z["example_ids"]):
    w, e = z[f"weights_{i}"], z[f"scores_{i}"]
    assert w.shape == e.shape == (len(z[f"tgt_tokens_{i}"]), len(z[f"src_tokens_{i}"]))
    again = attn.normalize(np.where(np.isfinite(e), e, 0), np.isfinite(e),
                           kind=str(z["normalizer"]), temperature=float(z["temperature"]))
    np.testing.assert_allclose(again, w, atol=1e-4)
    assert z["predictions"][n] == predictions[i]
  # load_run restores the best checkpoint: decoding with it reproduces predictions.txt.
  run = training.load_run(str(wd))
  batch = next(run.bundle.batches("test"))
  max_len = run.tc.max_output_len(batch["src"].shape[1])  # as the run decoded
  out = run.task.decode(run.model, batch, max_len=max_len, search=run.tc.search())
  first = int(batch["example_id"][0])
  assert run.bundle.tgt_vocab.decode(np.asarray(out.tokens[0]).tolist()) == predictions[first]
  # The records hold the settings that took effect: the shared ones and model.rnn, no Transformer.
  written = json.loads((wd / "config.json").read_text())["model"]
  assert written["rnn"]["decoder"] == "luong" and "transformer" not in written
  assert results["model_config"]["rnn"]["score"] == "general"
  assert "transformer" not in results["model_config"]
  # A run written before the sections (every model field flat, the other architecture's too)
  # still loads: its fields move into model.rnn, the Transformer's are dropped.
  flat = {k: v for k, v in written.items() if k != "rnn"} | written["rnn"] | {"d_model": 512}
  (wd / "config.json").write_text(json.dumps({**json.loads((wd / "config.json").read_text()),
                                              "model": flat}))
  (wd / "model.json").write_text(json.dumps(flat))
  old = training.load_run(str(wd))
  assert old.mc == run.mc
  again = old.task.decode(old.model, batch, max_len=max_len, search=old.tc.search())
  np.testing.assert_array_equal(again.tokens, out.tokens)


def test_load_run_names_what_is_missing(tmp_path):
  with pytest.raises(training.workdir.WorkdirError, match="no config.json: not a finished run"):
    training.load_run(str(tmp_path))


def test_mismatched_parallel_files_fail_before_training_with_one_line(tmp_path):
  data = tmp_path / "corpus"
  data.mkdir()
  (data / "train.de").write_text("".join(f"satz {i}\n" for i in range(100)))
  (data / "train.en").write_text("".join(f"sentence {i}\n" for i in range(97)))
  for split in ("val", "test_2016_flickr"):
    (data / f"{split}.de").write_text("a\n")
    (data / f"{split}.en").write_text("b\n")
  wd = tmp_path / "wd"
  p = _cli(["--config=experiments/configs/translate.py:multi30k", f"--workdir={wd}",
            f"--config.data.dir={data}"])
  assert p.returncode != 0
  err = [l for l in p.stderr.splitlines() if l.startswith("error:")]
  assert len(err) == 1 and "Traceback" not in p.stderr, p.stderr[-2000:]
  assert "train.de" in err[0] and "train.en" in err[0] and "100" in err[0] and "97" in err[0]
  assert not (wd / "checkpoints").exists()


def test_max_wall_s_stops_training_then_evaluates_and_saves(tmp_path):
  cfg = _tiny_config(steps=50, max_wall_s=1e-3, eval_every=100)
  results = training.train_and_evaluate(cfg, str(tmp_path))
  assert results["step"] == 1  # the first step already used the budget
  metrics = [json.loads(l) for l in open(tmp_path / "metrics.jsonl")]
  assert [m["split"] for m in metrics if m["step"] == 1].count("eval") == 1
  assert (tmp_path / "checkpoints" / "1").exists()


def test_results_report_the_whole_run_when_an_earlier_checkpoint_is_best(tmp_path, monkeypatch):
  """The test split is decoded with best/, but wall_s and tokens/s are the whole run's, not
  the counters saved with the best checkpoint."""
  from attn.training import loop
  evals = []
  monkeypatch.setattr(loop, "is_better", lambda score, best: not evals.append(score)
                      and len(evals) == 1)  # only the first evaluation is "best"
  res = training.train_and_evaluate(_tiny_config(steps=4, eval_every=2, checkpoint_every=2,
                                                 log_every=1), str(tmp_path))
  assert res["best_step"] == 2 and res["step"] == 4
  with open(tmp_path / "checkpoints" / "4" / "meta" / "metadata") as f:
    latest = json.load(f)
  with open(tmp_path / "best" / "2" / "meta" / "metadata") as f:
    best = json.load(f)
  assert best["wall_s"] < latest["wall_s"] <= res["wall_s"]  # (the clock runs past the save)
  assert res["tokens_per_sec"] * res["wall_s"] == pytest.approx(latest["train_tokens"])
