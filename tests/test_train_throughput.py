"""bench_train's runs (attn.benchmarks.train_throughput): a compute dtype's fresh run compiles
its step once per shape."""

import jax
import pytest

from attn import training
from attn.benchmarks import train_throughput
from attn.training.evaluation import device_batch
from experiments.configs import translate as translate_config


def _smoke_config():
  config = translate_config.get_config("smoke")
  config.data.num_buckets = 1  # one batch shape: one compilation per run
  return config


@pytest.fixture(scope="module")
def smoke_base(tmp_path_factory):
  return training.setup(_smoke_config(), str(tmp_path_factory.mktemp("bench_train")))


def test_a_fresh_dtype_run_keeps_one_compiled_step_per_shape(smoke_base):
  """The fresh run's state is placed as the base run's, so the state its step returns is the
  state it was compiled for: a second step with it compiles nothing new."""
  run = train_throughput.with_compute_dtype(smoke_base, "float32")
  for fresh, placed in zip(jax.tree.leaves(run.state), jax.tree.leaves(smoke_base.state)):
    assert fresh.sharding == placed.sharding
  step, key = run.step_fn(), jax.random.PRNGKey(0)
  batch = device_batch(next(smoke_base.bundle.train_iter(0)))
  state, _ = step(run.state, batch, key)
  jax.block_until_ready(step(state, batch, key))
  assert step._cache_size() == 1  # pylint: disable=protected-access
