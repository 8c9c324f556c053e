"""A new application from the recipe alone (docs/architectures.md, "Adding an application").

"Is this digit sequence sorted?": a plain `Task` (not a Seq2SeqTask) whose model is one
self-attention layer through `attn.attend`, its score and normalizer config fields declared as
registry names. Everything the application is lives in this file: its config sections, data,
model, task and presets (`get_config`, so this file is also its config file). The tests register
it, train it through the shared loop, sweep it with launch.py (through a two-line entry module
written into tmp_path, as experiments/<name>.py would be), and check that a bad registry name is
refused before anything is written and that a task missing a member of the contract is refused
when it is registered.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import attn
from attn.config import configurable
from attn.config.configurable import option
from attn.models.params import as_params, values
from attn.training.config import LoopConfig
from attn.training.task import Task

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAME = "sorted_digits"
ENTRY = "sorted_digits_entry"  # the entry point module the tests write (experiments/<name>.py)

# ----------------------------------------------------------------------------- config sections


@dataclasses.dataclass(frozen=True)
class SortedData:
  """The `data` section: sequences of `length` digits, about half of them sorted."""
  length: int = option(5, "digits per sequence")
  train_size: int = option(256, "training sequences")
  eval_size: int = option(64, "sequences evaluated during training")
  test_size: int = option(64, "sequences of the results")
  batch_size: int = option(32, "sequences per training batch")
  seed: int = option(0, "generation seed")


@dataclasses.dataclass(frozen=True)
class SortedModel:
  """The `model` section: one self-attention layer, its score and normalizer by name."""
  dim: int = option(16, "embedding, query, key and value size")
  score: str = option("scaled_dot", "attention score", names=attn.VARIANTS["score"])
  normalizer: str = option("softmax", "attention normalizer", names=attn.VARIANTS["normalizer"])
  length: int = option(0, "digits per sequence (from the data)", derived=True)


@dataclasses.dataclass(frozen=True)
class SortedTrain(LoopConfig):
  """The `train` section: the loop's settings, at a few steps."""
  steps: int = option(8, "optimizer steps")
  learning_rate: float = option(1e-2, "Adam's learning rate")
  warmup_steps: int = option(0, "linear warm-up from 0")
  log_every: int = option(4, "steps between progress lines")
  eval_every: int = option(8, "steps between evaluations")
  checkpoint_every: int = option(8, "steps between checkpoints")


def get_config(preset: str = "tiny"):
  """The application's config file: `--config=tests/test_new_application.py:tiny`. Every
  section at its dataclass's defaults (the one home of each), which a preset only overrides."""
  import ml_collections  # pylint: disable=import-outside-toplevel
  if preset != "tiny":
    raise ValueError(f"unknown preset {preset!r}; known: tiny")
  config = ml_collections.ConfigDict()
  config.data = configurable.config_dict(SortedData)
  config.model = configurable.config_dict(SortedModel)
  config.train = configurable.config_dict(SortedTrain)
  return config


# ----------------------------------------------------------------------------- data and model


def generate(n: int, length: int, rng) -> tuple[np.ndarray, np.ndarray]:
  """(digits [n, length] int32, sorted [n] int32): half the rows sorted, then labelled by
  whether they are (a random row may be sorted too)."""
  x = rng.integers(0, 10, (n, length))
  pick = rng.random(n) < 0.5
  x[pick] = np.sort(x[pick], axis=1)
  y = np.all(np.diff(x, axis=1) >= 0, axis=1)
  return x.astype(np.int32), y.astype(np.int32)


@dataclasses.dataclass(frozen=True)
class Sequences:
  """The data bundle: the data section and its splits, role -> (digits, labels). The loop
  hands it back to the task only (`train_batches`, `train_tokens`, `has_eval`: "eval" in
  `splits`)."""
  config: SortedData
  splits: dict


class Classifier(nnx.Module):
  """Digits [B, T] -> logits [B, 2]: embeddings plus learned positions, one self-attention
  layer (attn.attend with the configured score and normalizer), mean over positions, linear."""

  def __init__(self, mc: SortedModel, rngs: nnx.Rngs):
    self.mc = mc
    self.embed = nnx.Embed(10, mc.dim, rngs=rngs)
    self.pos = nnx.Param(0.1 * jax.random.normal(rngs.params(), (mc.length, mc.dim)))
    self.qkv = nnx.Linear(mc.dim, 3 * mc.dim, rngs=rngs)
    self.score_params = as_params(attn.init_score(mc.score, rngs.params(), mc.dim, mc.dim,
                                                  d_attn=mc.dim, max_len=mc.length))
    self.out = nnx.Linear(mc.dim, 2, rngs=rngs)

  def __call__(self, x):
    h = self.embed(x) + self.pos[...]  # [B, T, d]
    q, k, v = jnp.split(self.qkv(h), 3, axis=-1)  # [B, T, d] each
    ctx, _ = attn.attend(values(self.score_params), q, k, v, score=self.mc.score,
                         normalizer=self.mc.normalizer)  # [B, T, d]
    return self.out(jnp.mean(ctx, axis=1))  # [B, 2]


# ----------------------------------------------------------------------------- the task


class SortedTask(Task):
  """Is this digit sequence sorted? Batches are {"x": digits [B, T], "y": labels [B]}; the
  loss counts sequences. What it leaves out has the shared defaults (attn/training/task.py)."""
  sections = {"data": SortedData, "model": SortedModel, "train": SortedTrain}
  scores = ("sorted_accuracy",)
  metrics = ("sorted_accuracy", "params")
  columns = ("score", "normalizer", "params", "sorted_accuracy")

  def load_data(self, cfg, workdir) -> Sequences:
    del workdir  # generated: nothing is read or written
    dc = self.data_config(cfg)
    rng = np.random.default_rng(dc.seed)
    return Sequences(dc, {role: generate(n, dc.length, rng) for role, n in (
        ("train", dc.train_size), ("eval", dc.eval_size), ("test", dc.test_size))})

  def train_batches(self, bundle: Sequences, tc, start_step: int, select_rows=None):
    x, y = bundle.splits["train"]
    step = start_step
    while True:  # the rows of a step are a function of the seed and the step: resumable
      rows = np.random.default_rng([tc.seed, step]).choice(len(y), bundle.config.batch_size,
                                                            replace=False)
      rows = rows if select_rows is None else select_rows(rows)
      yield {"x": x[rows], "y": y[rows]}
      step += 1

  def train_tokens(self, bundle: Sequences, tc, step: int) -> float:
    return float(bundle.config.batch_size)

  def model_config(self, cfg, bundle: Sequences) -> SortedModel:
    return configurable.from_config(SortedModel, cfg, section="model",
                                    length=bundle.config.length)

  def build_model(self, model_config, seed: int, compute_dtype: str = "float32"):
    del compute_dtype  # float32 only
    return Classifier(model_config, nnx.Rngs(params=seed))

  def loss(self, model, batch, dropout_key=None, **options):
    del dropout_key, options
    logp = jax.nn.log_softmax(model(batch["x"]))  # [B, 2]
    nll = -jnp.sum(jnp.take_along_axis(logp, batch["y"][:, None], axis=-1))
    return nll, jnp.float32(batch["y"].shape[0]), nll

  def uniform_loss(self, model_config) -> float:
    return float(np.log(2))

  def selection_metrics(self, bundle) -> tuple[str, ...]:
    return ("sorted_accuracy",)

  def evaluate(self, run, role: str = "eval") -> dict:
    model, _ = nnx.merge(run.graphdef, run.state)
    x, y = run.bundle.splits[role]
    predicted = np.asarray(jnp.argmax(model(jnp.asarray(x)), axis=-1))
    return {"sorted_accuracy": float(np.mean(predicted == y))}


def register(module: str = ENTRY) -> None:
  """The application's registry entry (attn/apps/<name>/__init__.py's one line); once."""
  from attn import apps  # pylint: disable=import-outside-toplevel
  if NAME not in apps.APPS:
    apps.APPS.add(NAME, apps.App(module, "is this digit sequence sorted?", task=SortedTask))


# ----------------------------------------------------------------------------- the tests


@pytest.fixture
def sorted_app():
  from attn import apps  # pylint: disable=import-outside-toplevel
  register()
  yield NAME
  apps.APPS.remove(NAME)


def _entry_module(tmp_path) -> str:
  """Writes the entry point (experiments/<name>.py's few lines) and launch.py's wrapper that
  imports it first (launch.py knows the built-in applications; this one lives in a test file);
  returns the PYTHONPATH that finds them."""
  config = f"{os.path.abspath(__file__)}:tiny"
  (tmp_path / f"{ENTRY}.py").write_text(textwrap.dedent(f"""\
      import sys
      sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
      import test_new_application
      from attn.launching import cli

      test_new_application.register()
      cli.define_training_flags({config!r})
      validate_config, main = cli.training_entry_point({NAME!r})

      if __name__ == "__main__":
        cli.run(main)
      """))
  # (launch.py imports the entry point itself, after parsing its own flags)
  (tmp_path / "launch_with_app.py").write_text(textwrap.dedent(f"""\
      import runpy, sys
      sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
      import test_new_application
      test_new_application.register()
      sys.argv[0] = {os.path.join(REPO, "launch.py")!r}
      runpy.run_path(sys.argv[0], run_name="__main__")
      """))
  return os.pathsep.join([str(tmp_path), REPO, os.environ.get("PYTHONPATH", "")])


def _run(args, pythonpath):
  return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True,
                        timeout=300, env={**os.environ, "PYTHONPATH": pythonpath})


def test_a_task_missing_a_member_is_refused_when_it_is_registered():
  from attn import apps  # pylint: disable=import-outside-toplevel

  class Unfinished(Task):  # no uniform_loss, no evaluate; no columns, so launch could not tabulate
    sections = SortedTask.sections
    scores = metrics = ("sorted_accuracy",)
    load_data = SortedTask.load_data
    train_batches, train_tokens = SortedTask.train_batches, SortedTask.train_tokens
    model_config, build_model, loss = (SortedTask.model_config, SortedTask.build_model,
                                       SortedTask.loss)
    selection_metrics = SortedTask.selection_metrics

  with pytest.raises(TypeError) as e:
    apps.App(ENTRY, "unfinished", task=Unfinished)
  assert str(e.value) == (f"the task {Unfinished.__qualname__} of {ENTRY} lacks evaluate, "
                          "uniform_loss, columns (the Task contract: attn/training/task.py)")
  assert "\n" not in str(e.value)
  # A task given by a loader function is checked when the loader is first called.
  lazy = apps.App(ENTRY, "unfinished", task=lambda: Unfinished, launchable=False)
  with pytest.raises(TypeError, match=r"lacks evaluate, uniform_loss \(the Task contract"):
    lazy.task_class  # pylint: disable=pointless-statement
  assert apps.App(ENTRY, "finished", task=SortedTask).task_class is SortedTask


def test_the_application_trains_through_the_shared_loop_and_is_checked_by_it(sorted_app,
                                                                              tmp_path):
  from attn import training  # pylint: disable=import-outside-toplevel
  from attn.errors import ConfigError  # pylint: disable=import-outside-toplevel
  from attn.launching import entry_points  # pylint: disable=import-outside-toplevel
  assert isinstance(training.get_task(sorted_app), SortedTask)
  assert sorted_app in entry_points.EXPERIMENTS.names()
  assert entry_points.metrics(sorted_app) == ("sorted_accuracy", "params")

  results = training.train_and_evaluate(get_config(), str(tmp_path / "run"), task=sorted_app)
  assert results["step"] == 8 and results["split"] == "test"
  assert 0.0 <= results["sorted_accuracy"] <= 1.0
  assert (results["score"], results["normalizer"]) == ("scaled_dot", "softmax")
  written = json.loads((tmp_path / "run" / "results.json").read_text())
  assert written["sorted_accuracy"] == results["sorted_accuracy"]
  assert json.loads((tmp_path / "run" / "model.json").read_text())["normalizer"] == "softmax"
  assert entry_points.experiment_of(str(tmp_path / "run")) == sorted_app
  assert training.results_table([results]).splitlines()[0].split("|")[1:-1] == [
      f" {c} " for c in SortedTask.columns]

  # The registry names its config declares are checked by the shared layers, which the task
  # never asked for: a ConfigError naming the field, the value and the known names.
  config = get_config()
  config.model.normalizer = "nope"
  with pytest.raises(ConfigError, match="^unknown model.normalizer 'nope'; known: entmax15, "):
    training.validate_config(config, task=sorted_app)
  with pytest.raises(ConfigError, match="^unknown model.normalizer 'nope'"):
    training.train_and_evaluate(config, str(tmp_path / "bad"), task=sorted_app)
  assert not (tmp_path / "bad").exists()


def test_launch_sweeps_the_application_and_a_bad_name_is_one_line_before_anything_is_written(
    tmp_path):
  pythonpath = _entry_module(tmp_path)
  sweep = tmp_path / "sweep"
  p = _run([str(tmp_path / "launch_with_app.py"), f"--experiment={NAME}",
            f"--workdir={sweep}", "--sweep=model.normalizer=softmax,sparsemax"], pythonpath)
  assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
  table = (sweep / "results.md").read_text()
  header = next(l for l in table.splitlines() if l.startswith("| run"))
  assert "sorted_accuracy" in header and "params" in header, table
  for normalizer in ("softmax", "sparsemax"):
    row = next(l for l in table.splitlines() if l.startswith(f"| normalizer={normalizer} "))
    assert "failed" not in row and "pending" not in row, table
    results = json.loads((sweep / f"normalizer={normalizer}" / "results.json").read_text())
    assert results["normalizer"] == normalizer

  workdir = tmp_path / "bad"
  p = _run(["-m", ENTRY, "--config.model.normalizer=nope", f"--workdir={workdir}"], pythonpath)
  lines = p.stderr.strip().splitlines()
  assert p.returncode == 2 and len(lines) == 1, p.stderr[-3000:]
  assert lines[0].startswith("error: unknown model.normalizer 'nope'; known: entmax15, "), lines
  assert not workdir.exists()  # no application.json, config.json, checkpoints/, best/ or tb/
  # launch.py checks every combination the same way before it starts any.
  p = _run([str(tmp_path / "launch_with_app.py"), f"--experiment={NAME}",
            f"--workdir={tmp_path / 'bad_sweep'}", "--sweep=model.score=dot,nope"], pythonpath)
  assert p.returncode == 2 and "unknown model.score 'nope'" in p.stderr, p.stderr[-3000:]
  assert not (tmp_path / "bad_sweep" / "score=dot").exists()


def test_a_task_named_by_a_string_is_refused_with_the_form_the_registry_takes():
  """The registry imports no application: a task or diagnosis named as "module:Class" (the old
  form) is refused when the entry is made, naming what to give instead."""
  from attn import apps  # pylint: disable=import-outside-toplevel
  for field in ("task", "diagnose"):
    with pytest.raises(TypeError, match=rf"{ENTRY}: App.{field} must be a class or a function "
                                        "of no arguments that imports and returns it"):
      apps.App(ENTRY, "named", **{field: "attn.apps.translate.task:TranslationTask"})
