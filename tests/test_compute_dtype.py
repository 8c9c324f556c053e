"""train.compute_dtype=auto (attn.training.dtype_choice): the choice follows the measurement and
its margin, the measurement is cached per machine and shapes, the training setup resolves it
before the model is built and records the concrete dtype, and a resumed run keeps the dtype it
started with."""

import json
import os

import pytest

import attn.apps  # noqa: F401  (registers the built-in applications)
from attn import training
from attn.errors import ConfigError
from attn.models.config import ModelConfig
from attn.training import dtype_choice
from attn.training.config import TrainConfig
from experiments.configs import translate as translate_config

SHAPES = ((64, 16, 32), (8, 16, 48))


class FakeMeasure:
  """Rates in GFLOP/s, counting its calls."""

  def __init__(self, float32, bfloat16):
    self.rates, self.calls = {"float32": float32, "bfloat16": bfloat16}, 0

  def __call__(self, shapes):
    del shapes
    self.calls += 1
    return dict(self.rates)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
  """A compilation cache directory of the test's own (the rates are kept beside it)."""
  path = tmp_path / "xla"
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
  monkeypatch.setenv("ATTN_COMPILE_CACHE", str(path))
  return path


@pytest.mark.parametrize("float32, bfloat16, chosen", [
    (100.0, 100.0 * dtype_choice.MARGIN + 1, "bfloat16"),  # faster by more than the margin
    (100.0, 100.0 * dtype_choice.MARGIN - 1, "float32"),  # faster, but within the margin
    (300.0, 180.0, "float32"),  # slower (the AVX512_BF16 Xeon without AMX)
])
def test_auto_follows_the_measurement_and_its_margin(cache_dir, float32, bfloat16, chosen):
  measure = FakeMeasure(float32, bfloat16)
  choice = dtype_choice.resolve("auto", lambda: SHAPES, measure_fn=measure)
  assert (choice.dtype, choice.how, measure.calls) == (chosen, "measured", 1)
  assert choice.rates == {"float32": float32, "bfloat16": bfloat16}
  assert choice.line().startswith(f"compute dtype {chosen} (train.compute_dtype=auto: the "
                                  f"model's matmuls at {float32:.0f} GFLOP/s in float32")


def test_the_measurement_is_cached_per_shapes_and_read_back(cache_dir):
  first = FakeMeasure(100.0, 200.0)
  assert dtype_choice.resolve("auto", lambda: SHAPES, measure_fn=first).dtype == "bfloat16"
  (cached,) = os.listdir(cache_dir / "dtype_choice")
  again = FakeMeasure(300.0, 100.0)  # would choose float32, were it called
  choice = dtype_choice.resolve("auto", lambda: SHAPES, measure_fn=again)
  assert (choice.dtype, choice.how, again.calls) == ("bfloat16", "cache", 0)
  assert choice.rates == {"float32": 100.0, "bfloat16": 200.0}
  saved = json.loads((cache_dir / "dtype_choice" / cached).read_text())
  assert saved["shapes"] == [list(s) for s in SHAPES] and saved["jaxlib"] and saved["cpu"]
  other = dtype_choice.resolve("auto", lambda: SHAPES[:1], measure_fn=again)  # other shapes
  assert (other.dtype, other.how, again.calls) == ("float32", "measured", 1)


def test_without_a_cache_every_resolution_measures(monkeypatch):
  monkeypatch.setenv("ATTN_COMPILE_CACHE", "off")
  measure = FakeMeasure(100.0, 200.0)
  for _ in range(2):
    assert dtype_choice.resolve("auto", lambda: SHAPES, measure_fn=measure).how == "measured"
  assert measure.calls == 2


def test_an_explicit_dtype_is_taken_as_asked_without_measuring(cache_dir):
  measure = FakeMeasure(100.0, 200.0)
  choice = dtype_choice.resolve("float32", lambda: SHAPES, measure_fn=measure)
  assert (choice.dtype, choice.how, measure.calls) == ("float32", "asked", 0)
  assert TrainConfig(compute_dtype="auto").compute_dtype == "auto"
  with pytest.raises(ConfigError, match="compute_dtype='bf16' unknown; known: float32, "
                     "bfloat16, auto"):
    TrainConfig(compute_dtype="bf16")


def test_the_shapes_are_the_models_own():
  tfm = ModelConfig(arch="transformer", src_vocab=8000, tgt_vocab=8000)
  tfm = tfm.replace(transformer=tfm.transformer.replace(d_model=256, d_ff=1024))
  shapes = dtype_choice.matmul_shapes(tfm, batch_size=32)
  rows = 32 * dtype_choice.TOKENS_PER_ROW
  assert (rows, 256, 1024) in shapes and (rows, 1024, 256) in shapes  # the feed-forward
  assert [s for s in shapes if s[1:] == (256, 8000)]  # the output layer [rows, d] x [d, V]
  assert all(2 * m * k * n <= dtype_choice.MAX_FLOP or m == dtype_choice.MIN_ROWS
             for m, k, n in shapes)
  rnn = ModelConfig(arch="rnn", src_vocab=500, tgt_vocab=500)
  assert (16, rnn.rnn.dec_hidden, 3 * rnn.rnn.dec_hidden) in dtype_choice.matmul_shapes(rnn, 16)


def test_a_real_measurement_gives_two_positive_rates_and_a_choice():
  rates = dtype_choice.measure(((64, 32, 48),), repeats=2)
  assert set(rates) == {"float32", "bfloat16"} and min(rates.values()) > 0
  assert dtype_choice.choose(rates) in ("float32", "bfloat16")


def test_a_resumed_run_keeps_the_dtype_it_started_with(tmp_path, cache_dir, monkeypatch):
  """The smoke preset, 2 steps with auto measuring bfloat16 faster, then resumed to 4 with auto
  measuring float32 faster (and its cache gone): the resumed run reads bfloat16 back from
  config.json and measures nothing."""
  cfg = translate_config.get_config("smoke")
  cfg.train.update(dict(steps=2, checkpoint_every=2, eval_every=2, compute_dtype="auto"))
  workdir = str(tmp_path / "run")
  first = FakeMeasure(100.0, 200.0)
  monkeypatch.setattr(dtype_choice, "measure", first)
  results = training.train_and_evaluate(cfg, workdir)
  assert first.calls == 1
  assert results["compute_dtype"] == "bfloat16"
  assert results["compute_dtype_choice"] == {"asked": "auto", "dtype": "bfloat16",
                                             "how": "measured",
                                             "rates": {"float32": 100.0, "bfloat16": 200.0}}
  config = json.load(open(os.path.join(workdir, "config.json")))
  assert config["train"]["compute_dtype"] == "bfloat16"  # the concrete dtype, never auto
  for name in os.listdir(cache_dir / "dtype_choice"):
    os.remove(cache_dir / "dtype_choice" / name)
  flipped = FakeMeasure(300.0, 100.0)
  monkeypatch.setattr(dtype_choice, "measure", flipped)
  cfg.train.update(dict(steps=4, eval_every=4))
  resumed = training.train_and_evaluate(cfg, workdir)
  assert resumed["step"] == 4 and flipped.calls == 0
  assert resumed["compute_dtype"] == "bfloat16"
  assert resumed["compute_dtype_choice"]["how"] == "resumed"
  assert resumed["compute_dtype_choice"]["rates"] == {"float32": 100.0, "bfloat16": 200.0}
  run = training.load_run(workdir)
  assert run.tc.compute_dtype == "bfloat16"
