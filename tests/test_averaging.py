"""Checkpoint averaging (train.keep_checkpoints, experiments.average, scoring the average) and the
Transformer's one embedding for source and target (model.transformer.share_embeddings)."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attn import training
from attn.errors import ConfigError
from attn.models.config import ModelConfig, TransformerConfig
from attn.models.seq2seq import build_model
from attn.training import averaging, evaluation, scoring
from attn.training.checkpoints import Checkpoints
from attn.training.config import TrainConfig
from experiments import average as average_cli
from experiments.configs import translate as translate_config
from experiments.configs import use_arch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# -- the mean of parameter trees


@pytest.mark.parametrize("dtype,tol", [(np.float32, 1e-6), (jnp.bfloat16, 1e-2)])
def test_mean_tree_is_the_leafwise_mean(dtype, tol):
  rng = np.random.default_rng(0)
  arrays = [rng.normal(size=(3, 4)) for _ in range(4)]
  trees = [{"w": jnp.asarray(a, dtype), "n": jnp.asarray(i)} for i, a in enumerate(arrays)]
  got = averaging.mean_tree(trees)
  assert got["w"].dtype == dtype
  np.testing.assert_allclose(np.asarray(got["w"], np.float64), np.mean(
      [np.asarray(jnp.asarray(a, dtype), np.float64) for a in arrays], axis=0), atol=tol)
  assert int(got["n"]) == 3  # an integer leaf is the last tree's, not a mean


@pytest.mark.parametrize("keep", [0, -1])
def test_keep_checkpoints_refused(keep):
  with pytest.raises(ConfigError, match=f"keep_checkpoints={keep} must be >= 1"):
    TrainConfig(keep_checkpoints=keep)


# -- a run that kept its last three checkpoints


@pytest.fixture(scope="module")
def kept_run(tmp_path_factory):
  """A finished smoke run (6 steps, a checkpoint every 2) that kept its last three: 2, 4, 6."""
  workdir = str(tmp_path_factory.mktemp("kept"))
  config = translate_config.get_config("smoke")
  config.model.rnn.decoder = "bahdanau"
  config.data.num_buckets = 1
  config.train.update(steps=6, eval_every=6, checkpoint_every=2, keep_checkpoints=3,
                      learning_rate=3e-2)  # steps far apart, so the mean differs from each
  training.train_and_evaluate(config, workdir)
  return workdir


def _params(workdir, step):
  """{path: float64 array} of the parameters in checkpoints/ at `step`."""
  run = training.load_run(workdir)
  ckpt = Checkpoints(workdir, keep=run.tc.keep_checkpoints)
  try:
    assert ckpt.restore(ckpt.latest, run, step=step)
  finally:
    ckpt.close()
  nnx.update((run.model, run.optimizer), run.state)
  return {jax.tree_util.keystr(p): np.asarray(x, np.float64)
          for p, x in jax.tree_util.tree_leaves_with_path(nnx.state(run.model, nnx.Param))}


def test_checkpoints_keeps_the_last_steps(kept_run):
  assert sorted(os.listdir(os.path.join(kept_run, "checkpoints"))) == ["2", "4", "6"]


def test_average_is_the_mean_of_the_kept_checkpoints(kept_run):
  info = averaging.average_last(kept_run, 3)
  assert info["steps"] == [2, 4, 6] and info["step"] == 6
  assert set(info["eval"]) >= {"bleu", "perplexity"} and set(info["best_eval"]) >= {"bleu"}
  assert sorted(os.listdir(averaging.averaged_dir(kept_run))) == ["6", averaging.INFO]
  each = [_params(kept_run, s) for s in (2, 4, 6)]
  run = training.load_run(kept_run, checkpoint_dir=averaging.averaged_dir(kept_run))
  got = {jax.tree_util.keystr(p): np.asarray(x, np.float64)
         for p, x in jax.tree_util.tree_leaves_with_path(nnx.state(run.model, nnx.Param))}
  assert set(got) == set(each[0])
  for path, value in got.items():
    want = np.mean([e[path] for e in each], axis=0)
    np.testing.assert_allclose(value, want, atol=1e-6, err_msg=path)
  assert any(np.abs(each[0][p] - each[2][p]).max() > 1e-3 for p in got)  # the steps differ
  # The eval scores it records are the averaged model's, recomputed here independently.
  ev = evaluation.evaluate(run, "eval", run.tc.eval_decode_sentences)
  assert info["eval"]["bleu"] == pytest.approx(ev["bleu"], abs=1e-9)
  assert info["eval"]["perplexity"] == pytest.approx(ev["perplexity"], rel=1e-5)


def test_scoring_the_average(kept_run):
  averaging.average_last(kept_run, 2)  # replaces the average (and its stale decodings)
  assert averaging.read_info(kept_run)["steps"] == [4, 6]
  rows = scoring.score_workdir(kept_run, which="best,averaged")
  assert [r["checkpoint"] for r in rows] == ["best", averaging.AVERAGED_DIR]
  run = training.load_run(kept_run, checkpoint_dir=averaging.averaged_dir(kept_run))
  hyps = evaluation.decode_split(run, "test", search=run.tc.search())
  assert rows[1]["bleu"] == pytest.approx(
      evaluation.score_outputs(run, "test", hyps)["bleu"], abs=1e-9)
  assert rows[1]["step"] == 6
  averaging.average_last(kept_run, 3)
  assert not os.path.exists(os.path.join(kept_run, "scores", averaging.AVERAGED_DIR))


def test_averaging_more_than_kept_is_refused(smoke_bahdanau_workdir, kept_run):
  with pytest.raises(ConfigError, match=r"keeps 1 checkpoint\(s\).*keep_checkpoints=5"):
    averaging.average_last(smoke_bahdanau_workdir, 5)
  with pytest.raises(ConfigError, match="fewer than --last=4"):
    averaging.average_last(kept_run, 4)
  with pytest.raises(ConfigError, match="at least 2"):
    averaging.average_last(kept_run, 1)
  with pytest.raises(ConfigError, match="has no averaged checkpoint"):
    scoring.kept_checkpoints(smoke_bahdanau_workdir, "averaged")


@pytest.mark.parametrize("which,want", [
    ("best", ["best"]), ("both", ["best", "marks"]), ("averaged,best", ["averaged", "best"]),
    ("all", ["best", "marks", "averaged"]), ("best, best", ["best"])])
def test_checkpoint_kinds(which, want):
  assert scoring._kinds(which) == want  # pylint: disable=protected-access


def test_average_command(kept_run, tmp_path):
  proc = subprocess.run([sys.executable, "-m", "experiments.average", f"--workdirs={kept_run}",
                         "--last=3"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                        check=False)
  assert proc.returncode == 0, proc.stderr[-2000:]
  info = json.loads(open(os.path.join(averaging.averaged_dir(kept_run), averaging.INFO)).read())
  assert f"average of steps 2, 4, 6 on the eval split: " in proc.stdout
  assert f"bleu {info['eval']['bleu']:.3f} (best/ {info['best_eval']['bleu']:.3f})" in proc.stdout
  with pytest.raises(ConfigError, match="has no results.json: not a finished run"):
    average_cli.AverageSettings(workdirs=(str(tmp_path),))  # settings are fine ...
    average_cli.entry_points.finished_experiment(str(tmp_path), ("translate",))  # ... the run not


@pytest.mark.parametrize("settings,match", [(dict(), "--workdirs: give at least one"),
                                            (dict(workdirs=("w",), last=1), "at least 2")])
def test_average_settings_refused(settings, match):
  with pytest.raises(ConfigError, match=match):
    average_cli.AverageSettings(**settings)


# -- one embedding for source and target


def _transformer_config(share, src_vocab=11, tgt_vocab=11):
  return ModelConfig(arch="transformer", src_vocab=src_vocab, tgt_vocab=tgt_vocab, enc_layers=1,
                     dec_layers=1, dropout=0.0, transformer=TransformerConfig(
                         d_model=8, num_heads=2, d_ff=16, tie_embeddings=True,
                         share_embeddings=share))


def test_shared_embedding_is_one_matrix():
  shared = build_model(_transformer_config(True))
  apart = build_model(_transformer_config(False))
  assert shared.encoder.embedding.embed is shared.decoder.embedding.embed
  count = lambda m: sum(x.size for x in jax.tree.leaves(nnx.state(m, nnx.Param)))
  assert count(apart) - count(shared) == 11 * 8
  # A gradient step moves the one matrix by the sum of what both sides ask of it.
  src = jnp.array([[3, 4, 5]])
  def loss(model):
    memory = model.encoder(src, jnp.array([3]))
    logits, _ = model.decoder(memory, jnp.array([3]), jnp.array([[1, 6]]))
    return logits.sum() + memory.sum()
  grads = nnx.grad(loss)(shared)
  flat = jax.tree_util.tree_leaves_with_path(nnx.state(grads, nnx.Param))
  embeds = [p for p, _ in flat if "embed" in jax.tree_util.keystr(p)
            and "embedding" in jax.tree_util.keystr(p)]
  assert len(embeds) == 1  # one gradient for the one matrix


def test_shared_embedding_needs_one_vocabulary(tmp_path):
  with pytest.raises(ConfigError, match="share_embeddings=True needs one vocabulary.*"
                                        "src_vocab=11, tgt_vocab=12"):
    _transformer_config(True, tgt_vocab=12)
  config = translate_config.get_config("smoke")
  use_arch(config, "transformer", d_model=8, num_heads=2, d_ff=16, share_embeddings=True)
  with pytest.raises(ConfigError, match="share_embeddings=True needs data.shared_vocab=True"):
    training.train_and_evaluate(config, str(tmp_path / "run"))
  assert not os.path.exists(tmp_path / "run")  # refused before anything was written


# slow: test_shared_embedding_is_one_matrix pins the sharing and tests/test_train.py the resume
@pytest.mark.slow
def test_shared_embedding_trains_and_resumes(tmp_path):
  """A run with one embedding trains, saves, resumes (the shared variable restores once)."""
  config = translate_config.get_config("smoke")
  use_arch(config, "transformer", d_model=8, num_heads=2, d_ff=16, share_embeddings=True,
           tie_embeddings=True)
  config.model.update(dict(enc_layers=1, dec_layers=1))
  config.data.update(dict(shared_vocab=True, num_buckets=1))
  config.train.update(steps=2, eval_every=2, checkpoint_every=2)
  results = training.train_and_evaluate(config, str(tmp_path))
  assert np.isfinite(results["bleu"])
  run = training.load_run(str(tmp_path))
  assert run.model.encoder.embedding.embed is run.model.decoder.embedding.embed
  config.train.steps = 4
  again = training.train_and_evaluate(config, str(tmp_path))
  assert again["step"] == 4
