"""The task interface of the training loop: what every application's run needs.

A task is what an application (attn/apps/<name>/) gives the loop: its train section and optimizer, its
data and the batches the loop trains on, its model and loss, its evaluation (and how it chooses
the best checkpoint) and its result files. The loop (attn.training.loop) reaches a task only
through these methods, so it names no application. Sequence-to-sequence tasks, which also decode
and score text, extend it in attn.training.seq2seq_task. `get_task(name)` finds the task of a
registered application.
"""

from __future__ import annotations

import abc

from attn.common import applications
from attn.errors import ConfigError

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

  # -- the train section and the optimizer

  def train_config(self, cfg):
    """The validated `train` section: a frozen LoopConfig (attn.training.config), or a subclass
    holding the task's own settings too; ConfigError naming the first bad field."""
    from attn.training.config import LoopConfig  # pylint: disable=import-outside-toplevel
    return LoopConfig.from_config(cfg)

  @abc.abstractmethod
  def make_optimizer(self, tc):
    """The optax transformation of train section `tc` (the loop steps it: nnx.Optimizer)."""

  # -- data

  @abc.abstractmethod
  def data_config(self, cfg):
    """The validated `data` section: a frozen dataclass with `batch_size` and
    `tokens_per_batch`."""

  @abc.abstractmethod
  def load_data(self, cfg, workdir):
    """The data bundle the loop reads, of the validated `data` section `cfg`."""

  def has_eval(self, bundle) -> bool:
    """Whether the data has an eval split: without one the loop never evaluates and best/ stays
    empty."""
    return "eval" in bundle.splits

  @abc.abstractmethod
  def train_batches(self, bundle, tc, start_step: int, select_rows=None):
    """An iterator of host training batches (dicts of numpy arrays), the batch of step
    `start_step` first: a resumed run reads the batches an uninterrupted one would.
    select_rows: this process's rows of a global batch (attn.training.distributed.RowShard
    .select); None: the whole batch."""

  @abc.abstractmethod
  def train_tokens(self, bundle, tc, step: int) -> float:
    """The tokens (or positions) the loss counts in the whole global batch of `step`, the same
    on every process: what tok/s and results.json's tokens_per_sec count."""

  def device_batch(self, batch) -> dict:
    """The arrays of a host batch that the model reads (no example metadata); all of them by
    default."""
    return batch

  # -- the model and its loss

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

  def describe_model(self, model_config) -> str:
    """A few words naming the model for the run's log line (e.g. "rnn/additive/softmax")."""
    return type(model_config).__name__

  @abc.abstractmethod
  def loss(self, model, batch, dropout_key=None, **options):
    """(sum of token losses, number of tokens, sum of unsmoothed NLL), float32 scalars.
    options: the static settings of `loss_options` (none when the loss is only evaluated)."""

  def loss_options(self, tc) -> dict:
    """Static keyword arguments of `loss` in the train step, from train section `tc` (e.g.
    label smoothing); none by default."""
    del tc
    return {}

  @abc.abstractmethod
  def uniform_loss(self, model_config) -> float:
    """The mean token loss of a uniform guess over the outputs (log of their number): the
    divergence guard stops a run whose loss exceeds train.divergence_factor times it."""

  # -- evaluation and results

  @abc.abstractmethod
  def evaluate(self, run, role: str = "eval") -> dict:
    """{metric: float} of the current parameters (`run.state`) on split `role`; must hold every
    name of `selection_metrics` (higher is better)."""

  @abc.abstractmethod
  def write_results(self, run, ckpt) -> dict:
    """After training: restores the best checkpoint (else keeps the last), evaluates the test
    split and writes the run's result files, results.json last (its presence means the run
    finished); returns the results. Only process 0 writes."""

  def check_resumed_data(self, recorded: dict, dc) -> None:
    """Before resuming a run whose config.json recorded the data section `recorded`: a
    ConfigError when the validated data section `dc` would make other data than its checkpoints
    were trained on (`refuse_changed_data`). None by default: the text pipeline checks its own
    (the vocabularies' record, attn.data.vocab_record)."""
    del recorded, dc

  @abc.abstractmethod
  def selection_metrics(self, bundle) -> tuple[str, ...]:
    """The eval metrics (higher is better) that pick the best checkpoint, compared in order: the
    later ones break ties of the earlier."""


def refuse_changed_data(recorded: dict, dc, *, free=("batch_size",)) -> None:
  """ConfigError naming the first `data` setting of dataclass `dc` that differs from the
  `recorded` data section of the run being resumed (config.json): its checkpoints were trained
  on the data those settings made. `free`: settings a resumed run may change."""
  import dataclasses  # pylint: disable=import-outside-toplevel
  import json  # pylint: disable=import-outside-toplevel
  for field in dataclasses.fields(dc):
    if field.name in free or field.name not in recorded:
      continue
    now = json.loads(json.dumps(getattr(dc, field.name), default=list))
    if now != recorded[field.name]:
      raise ConfigError(
          f"data.{field.name}={getattr(dc, field.name)!r} differs from the run being resumed "
          f"(data.{field.name}={recorded[field.name]!r} in its config.json): its checkpoints were "
          "trained on the data those settings made; resume with the recorded settings or use "
          "another --workdir")


def get_task(name: str) -> Task:
  """A fresh instance of the task of registered application `name`
  (attn.common.applications.APPS); ConfigError listing the known ones if none."""
  return applications.app(name).task_class()


def application_of(task: Task) -> str:
  """The name of the registered application whose task `task` is
  (attn.common.applications.APPS); for a task no application registers, its class name."""
  for name, entry in applications.registry().items():
    if entry.task is not None and entry.task_class is type(task):
      return name
  return type(task).__name__
