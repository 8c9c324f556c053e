"""train.steps_per_call: several optimizer steps as one compiled scan give the run one step at a
time gives (the same batches, dropout keys, parameters, counters and saves), fall back to one
step a call where batch shapes differ, stop on every progress line and save, and resume."""

import jax
import numpy as np
import pytest
from flax import nnx

import attn.apps  # noqa: F401  (registers the built-in applications)
from attn import training
from attn.apps.focus import sweep as focus
from attn.common import compile_cache
from attn.data import stories
from attn.errors import ConfigError
from attn.training import building, loop
from experiments.configs import translate as translate_config

FOCUS = focus.FocusConfig(stories=stories.StoryConfig(max_sentences=6), normalizers=("softmax",),
                          dim=8, steps=14, train_size=200, test_size=40, num_samples=1)


def _focus_config(**train):
  cfg = focus.run_config(FOCUS, "softmax")
  cfg.train.update(dict(log_every=6, checkpoint_every=10, **train))
  return cfg


def _translate_config(**train):
  c = translate_config.get_config("smoke")
  c.model.dropout = 0.3  # the keys matter
  c.train.update(dict(steps=7, checkpoint_every=4, eval_every=100, log_every=3, **train))
  return c


def _trained(cfg, workdir, task, *, stop_after=None, calls=None):
  """The run after `train` (and the (steps, stacked) of each call when `calls` is a list)."""
  run = training.setup(cfg, workdir, task=task)
  if calls is not None:
    real_one, real_many = run.step_fn, run.steps_fn

    def one():
      fn = real_one()
      return lambda state, batch, key: (calls.append(1), fn(state, batch, key))[1]

    def many():
      fn = real_many()
      return lambda state, batches, *args: (
          calls.append(int(jax.tree.leaves(batches)[0].shape[0])), fn(state, batches, *args))[1]
    run.step_fn, run.steps_fn = one, many
  ckpt = training.Checkpoints(workdir)
  try:
    ckpt.restore(ckpt.latest, run)
    training.train(run, ckpt, training.MetricsWriter(workdir), stop_after=stop_after)
  finally:
    ckpt.close()
  return run


def _params(run):
  model, _ = nnx.merge(run.graphdef, run.state)
  return jax.tree.leaves(nnx.state(model, nnx.Param))


def _assert_same_run(a, b, rtol):
  assert a.progress.step == b.progress.step
  assert a.progress.train_tokens == b.progress.train_tokens
  for x, y in zip(_params(a), _params(b)):
    np.testing.assert_allclose(x, y, rtol=rtol, atol=rtol)


def test_focus_steps_in_calls_of_four_train_the_same_model(tmp_path):
  """Fixed batch shapes: calls of 4 steps, cut at the progress lines (every 6 steps), the save
  (step 10) and the end (14): 4, 2 | 4, 4, 2 ... never past one of them."""
  calls = []
  many = _trained(_focus_config(steps_per_call=4), str(tmp_path / "many"), "focus", calls=calls)
  one = _trained(_focus_config(), str(tmp_path / "one"), "focus")
  assert calls == [4, 2, 4, 2, 2]  # ends at 6, 10 (save), 12 (progress), 14 (the last step)
  _assert_same_run(many, one, rtol=1e-5)


def test_translation_batches_of_other_shapes_run_one_step_a_call(tmp_path):
  """Buckets: consecutive batches of one shape are stacked, others run one by one, and the run
  (dropout keys included) is the one trained a step at a time."""
  calls = []
  many = _trained(_translate_config(steps_per_call=3), str(tmp_path / "many"), "translate",
                  calls=calls)
  one = _trained(_translate_config(), str(tmp_path / "one"), "translate")
  assert sum(calls) == 7 and set(calls) <= {1, 2, 3}
  _assert_same_run(many, one, rtol=2e-5)


def test_a_run_stopped_between_calls_resumes_to_the_uninterrupted_run(tmp_path):
  whole = _trained(_focus_config(steps_per_call=4), str(tmp_path / "whole"), "focus")
  first = _trained(_focus_config(steps_per_call=4), str(tmp_path / "run"), "focus", stop_after=10)
  assert first.progress.step == 10  # saved there (checkpoint_every=10)
  resumed = _trained(_focus_config(steps_per_call=4), str(tmp_path / "run"), "focus")
  _assert_same_run(resumed, whole, rtol=1e-6)


def test_steps_per_call_below_one_is_refused():
  with pytest.raises(ConfigError, match="train.steps_per_call=0 must be >= 1"):
    building.validate_config(_focus_config(steps_per_call=0), "focus")


@pytest.mark.parametrize("on_mesh", [True, False])
def test_the_loss_program_compiled_ahead_is_the_one_the_divergence_check_calls(tmp_path,
                                                                               on_mesh):
  """Run.compile_state_loss (started by the loop where several steps run a call) fills
  state_loss_fn's cache, on a mesh or on the default device (host batches then reach the call
  as numpy): the call after it compiles nothing and gives the loss a program compiled on the
  spot gives."""
  compile_cache.count_compiles()
  if on_mesh:
    run = training.setup(_focus_config(), str(tmp_path), task="focus")
  else:
    cfg, task = _focus_config(), loop.get_task("focus")
    run = building.build_run(cfg, str(tmp_path), task, building.validate_config(cfg, task))
    assert run.mesh is None
  host = next(run.task.train_batches(run.bundle, run.tc, 0))
  batch = run.device_batch(host)
  before = compile_cache.stats().programs
  run.compile_state_loss(host).join()
  assert compile_cache.stats().programs == before + 1
  ahead = run.state_loss_fn(run.state, batch)
  assert compile_cache.stats().programs == before + 1  # the call compiled nothing
  fresh = jax.jit(lambda state, batch: run.task.loss(nnx.merge(run.graphdef, state)[0], batch))
  np.testing.assert_allclose(np.asarray(ahead), np.asarray(fresh(run.state, batch)), rtol=1e-6)
