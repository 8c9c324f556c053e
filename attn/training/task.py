"""The task interface of the training loop: what every application's run needs.

A task is what an application (attn.apps) gives the loop: its data, its model, its loss and how
its evaluations choose the best checkpoint. Sequence-to-sequence tasks, which also decode and
score text, extend it in attn.training.seq2seq_task. `get_task(name)` finds the task of a
registered application.
"""

from __future__ import annotations

import abc

from attn.decoding import Search  # noqa: F401  (re-exported: the settings `decode` takes)

# What every run's results.json holds besides its task's scores (attn.training.evaluation).
RUN_FIGURES = ("params", "step", "best_step", "tokens_per_sec", "tokens_per_sec_steady", "wall_s",
               "decode_s", "eval_s", "beam_size")


class Task(abc.ABC):
  """What a training run needs to know about its task. Methods are pure in the model (an
  nnx.Module merged inside jit) and the batch (dict of arrays).

  Class-level declarations of what a finished run's results.json holds (read by launch.py and
  the run tools without building anything): `scores` (the task's scores; the first is its own,
  no other task reports it), `figures` (its other figures), `nested` (fields holding a dict by
  bucket or a list by layer, tabulated one column per entry), `metrics` (the fields launch.py
  tabulates by default, the first plotted), `columns` (the results table the run prints) and
  `notes` (nested fields printed as one line under that table, with their label).
  """
  scores: tuple[str, ...] = ()
  figures: tuple[str, ...] = ()
  nested: tuple[str, ...] = ()
  metrics: tuple[str, ...] = ()
  columns: tuple[str, ...] = ()
  notes: tuple[tuple[str, str], ...] = ()
  run_figures: tuple[str, ...] = RUN_FIGURES

  @abc.abstractmethod
  def data_config(self, cfg):
    """The validated `data` section: a frozen dataclass with `batch_size` and
    `tokens_per_batch`."""

  @abc.abstractmethod
  def load_data(self, cfg, workdir):
    """The data bundle the loop reads, of the validated `data` section `cfg`."""

  @abc.abstractmethod
  def model_config(self, cfg, bundle):
    """The frozen model config from the config's `model` section and the loaded data."""

  @abc.abstractmethod
  def check_model_config(self, cfg, data, train) -> None:
    """Validates the `model` section, and where it meets the data and train sections (a
    DataConfig, a TrainConfig), before any data is read; raises ConfigError naming the
    fields."""

  @abc.abstractmethod
  def build_model(self, model_config, seed: int, compute_dtype: str = "float32"):
    """A freshly initialized model (float32 parameters) whose matmuls run in `compute_dtype`."""

  @abc.abstractmethod
  def loss(self, model, batch, dropout_key=None, label_smoothing=0.0):
    """(sum of token losses, number of tokens, sum of unsmoothed NLL), float32 scalars."""

  @abc.abstractmethod
  def selection_metrics(self, bundle) -> tuple[str, ...]:
    """The eval metrics (higher is better) that pick the best checkpoint, compared in order: the
    later ones break ties of the earlier."""


def get_task(name: str) -> Task:
  """A fresh instance of the task of registered application `name` (attn.apps.APPS);
  ConfigError listing the known ones if none."""
  from attn import apps  # pylint: disable=import-outside-toplevel  (registers the built-in ones)
  return apps.app(name).task_class()
