"""bench_train's runs (attn.benchmarks.train_throughput): a compute dtype's fresh run compiles
its step once per shape, XLA option sets reach the compiler and are timed beside the defaults,
and a bad option set is refused before anything is set up."""

import json
import os
import subprocess
import sys

import jax
import pytest

from attn import training
from attn.benchmarks import train_throughput
from attn.errors import ConfigError
from attn.training.evaluation import device_batch
from experiments.configs import caption as caption_config
from experiments.configs import translate as translate_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
                                       compute_dtypes=("float32",), xla_options=NO_YNN,
                                       workdir=str(tmp_path))
  table = train_throughput.run(_smoke_config(), settings)
  assert "| float32 |" in table and "| float32, no_ynn |" in table
  assert "tokens/s relative to float32: float32, no_ynn " in table
  out = capsys.readouterr().out
  assert "round 1 float32:" in out and "round 1 float32, no_ynn:" in out
  assert "compiled 1 bucket shapes x 2 runs" in out


@pytest.mark.parametrize("field, value, says", [
    ("steps", 0, "--steps must be >= 1, got 0"),
    ("rounds", 0, "--rounds must be >= 1, got 0"),
    ("ceiling_sizes", (1024, 0), r"--ceiling_sizes must be integers >= 1, got \[1024, 0\]"),
])
def test_bench_train_settings_refuse_what_would_time_nothing(field, value, says):
  """(And its dtype is auto unless one is named: chosen by measurement on the machine.)"""
  assert train_throughput.Settings().compute_dtypes == ("auto",)
  with pytest.raises(ConfigError, match=says):
    train_throughput.Settings(**{field: value})


def test_bench_train_refuses_a_bad_flag_in_one_line_before_any_setup(tmp_path):
  done = subprocess.run([sys.executable, "-m", "experiments.bench_train", "--steps=0",
                         f"--workdir={tmp_path / 'w'}"], cwd=REPO, capture_output=True,
                        text=True, check=False, timeout=120)
  assert done.returncode == 2, done.stderr[-2000:]
  assert done.stderr.strip().splitlines() == ["error: --steps must be >= 1, got 0"]
  assert not (tmp_path / "w").exists()


def test_no_ceiling_sizes_time_the_steps_without_a_ceiling(tmp_path, capsys):
  """An empty --ceiling_sizes measures no ceiling, as in bench_decode: the table says n/a
  where a share of it would go."""
  settings = train_throughput.Settings(steps=1, rounds=1, ceiling_sizes=(),
                                       compute_dtypes=("float32",), workdir=str(tmp_path))
  table = train_throughput.run(_smoke_config(), settings)
  row = [l for l in table.splitlines() if l.startswith("| float32 |")]
  assert len(row) == 1 and row[0].rstrip(" |").endswith("| n/a | n/a | n/a")
  assert "ceiling:" not in capsys.readouterr().out


def test_a_caption_config_times_the_captioners_own_step(tmp_path, capsys):
  """The registry says whose config it is (its data section is the captioner's): bench_train
  sets up that task and times its step, on its batches of image regions."""
  config = caption_config.get_config("tiny")
  assert train_throughput.application_of_config(config) == "caption"
  settings = train_throughput.Settings(steps=1, rounds=1, ceiling_sizes=(),
                                       compute_dtypes=("float32",), workdir=str(tmp_path))
  table = train_throughput.run(config, settings)
  assert len([l for l in table.splitlines() if l.startswith("| float32 |")]) == 1
  out = capsys.readouterr().out
  assert "compiled 1 bucket shapes x 1 runs" in out and "round 1 float32:" in out
  assert "the rates below use the traced step's count" in out  # its image encoder is no RNN's
  assert json.loads((tmp_path / "application.json").read_text()) == {"application": "caption"}


def test_a_config_whose_task_is_not_seq2seq_is_refused_in_one_line(tmp_path):
  done = subprocess.run([sys.executable, "-m", "experiments.bench_train",
                         "--config=experiments/configs/recommend.py", "--steps=1",
                         f"--workdir={tmp_path / 'w'}"], cwd=REPO, capture_output=True,
                        text=True, check=False, timeout=120)
  assert done.returncode == 2, done.stderr[-2000:]
  (line,) = done.stderr.strip().splitlines()
  assert line.startswith("error: --config is a recommend config: bench_train times the training "
                         "step of an application whose task is sequence to sequence (")
  assert all(name in line for name in train_throughput.seq2seq_applications())
  assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("faster", ["float32", "bfloat16"])
def test_an_auto_row_runs_the_dtype_the_measurement_chose(tmp_path, capsys, monkeypatch, faster):
  """--compute_dtypes=float32,auto: auto is resolved as a training run resolves it (here with
  the measurement faked and no cache), and its row says which dtype it ran."""
  from attn.training import dtype_choice
  monkeypatch.setenv("ATTN_COMPILE_CACHE", "off")
  rates = {"float32": 100.0, "bfloat16": 100.0}
  rates[faster] = 300.0
  monkeypatch.setattr(dtype_choice, "measure", lambda shapes: dict(rates))
  settings = train_throughput.Settings(steps=1, rounds=1, ceiling_sizes=(),
                                       compute_dtypes=("float32", "auto"), workdir=str(tmp_path))
  table = train_throughput.run(_smoke_config(), settings)
  assert len([l for l in table.splitlines() if l.startswith("| float32 |")]) == 1
  assert len([l for l in table.splitlines() if l.startswith(f"| auto ({faster}) |")]) == 1
  out = capsys.readouterr().out
  assert f"compute dtype {faster} (train.compute_dtype=auto: the model's matmuls at" in out
  assert f"round 1 auto ({faster}):" in out


def test_shape_ceiling_columns_time_each_dot_of_the_traced_step(tmp_path, capsys, monkeypatch,
                                                                 smoke_base):
  """--shape_ceiling: every dot of the traced step timed alone (here a fake timer: 1 ns a call),
  so the rate column is the step's matmul FLOPs over its dots' executions, counted apart on the
  same step's jaxpr."""
  from attn.benchmarks import shape_ceiling
  from attn.models import cost
  monkeypatch.setattr(shape_ceiling, "time_dot", lambda dot: 1e-9)
  batch = device_batch(next(smoke_base.bundle.train_iter(0)))
  run = train_throughput.with_compute_dtype(smoke_base, "float32")
  matmuls = cost.jaxpr_matmuls(jax.make_jaxpr(run.step_fn())(run.state, batch,
                                                             jax.random.PRNGKey(0)))
  expected = sum(m.flops for m in matmuls) / sum(m.executions for m in matmuls)
  settings = train_throughput.Settings(steps=1, rounds=1, ceiling_sizes=(),
                                       compute_dtypes=("float32",), shape_ceiling=True,
                                       workdir=str(tmp_path))
  table = train_throughput.run(_smoke_config(), settings)
  header, _, row = table.splitlines()[:3]
  assert header.endswith("| GFLOP/s of its matmuls alone at their shapes | % of the step's time "
                         "they take alone |")
  assert row.rstrip(" |").split(" | ")[-2:] == [f"{expected:.0f}", "0%"]
  assert "distinct matmuls timed alone so far" in capsys.readouterr().out
