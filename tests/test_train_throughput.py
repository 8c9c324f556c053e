"""bench_train's runs (attn.benchmarks.train_throughput): a compute dtype's fresh run compiles
its step once per shape, XLA option sets reach the compiler and are timed beside the defaults,
and a bad option set is refused before anything is set up."""

import jax
import pytest

from attn import training
from attn.benchmarks import train_throughput
from attn.training.evaluation import device_batch
from experiments.configs import translate as translate_config

NO_YNN = '{"no_ynn": {"xla_cpu_experimental_ynn_fusion_type": ""}}'


def _smoke_config():
  config = translate_config.get_config("smoke")
  config.data.num_buckets = 1  # one batch shape: one compilation per run
  return config


@pytest.fixture(scope="module")
def smoke_base(tmp_path_factory):
  return training.setup(_smoke_config(), str(tmp_path_factory.mktemp("bench_train")))


def test_option_sets_parse_and_name_what_is_wrong():
  assert train_throughput.xla_option_sets("") == {}
  assert train_throughput.xla_option_sets(NO_YNN) == {
      "no_ynn": {"xla_cpu_experimental_ynn_fusion_type": ""}}
  with pytest.raises(ValueError, match="not JSON"):
    train_throughput.xla_option_sets("{no_ynn: 1}")
  with pytest.raises(ValueError, match="must map names to option dicts"):
    train_throughput.xla_option_sets('{"a": 1}')
  with pytest.raises(ValueError, match="must map names to option dicts"):
    train_throughput.xla_option_sets('{"": {}}')  # the defaults' own row
  with pytest.raises(ValueError, match="'typo'.*xla_cpu_no_such_option"):
    train_throughput.xla_option_sets('{"typo": {"xla_cpu_no_such_option": true}}')


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


def test_step_fn_hands_its_options_to_the_compiler(smoke_base):
  step = smoke_base.step_fn({"xla_cpu_no_such_option": True})
  batch = device_batch(next(smoke_base.bundle.train_iter(0)))
  with pytest.raises(Exception, match="xla_cpu_no_such_option"):
    step(smoke_base.state, batch, jax.random.PRNGKey(0))


def test_bench_times_each_option_set_beside_the_defaults(tmp_path, capsys):
  settings = train_throughput.Settings(steps=1, rounds=1, ceiling_sizes=(32,),
                                       xla_options=NO_YNN, workdir=str(tmp_path))
  table = train_throughput.run(_smoke_config(), settings)
  assert "| float32 |" in table and "| float32, no_ynn |" in table
  assert "tokens/s relative to float32: float32, no_ynn " in table
  out = capsys.readouterr().out
  assert "round 1 float32:" in out and "round 1 float32, no_ynn:" in out
  assert "compiled 1 bucket shapes x 2 runs" in out
