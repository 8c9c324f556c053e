"""The task interface of the training loop: what every application's run needs.

A task is what an application (attn/apps/<name>/) gives the loop: its config sections, its train section
and optimizer, its data and the batches the loop trains on, its model and loss, its evaluation
(and how it chooses the best checkpoint) and its result files. The loop (attn.training.loop),
the results table and launch.py reach a task only through the members of `Task`, so they name no
application. Sequence-to-sequence tasks, which also decode and score text, extend it in
attn.training.seq2seq_task. `get_task(name)` finds the task of a registered application.

The contract, in one place: what a task must supply is abstract here (the methods) or listed in
`REQUIRED` (the class attributes); everything else has a shared default. The application
registry (attn.common.applications) refuses a class that leaves any of it out
(`Task.missing_members`), in one line naming what is missing, when an application is registered
with its task class, and when the function that imports a lazily named task is first called.

What the loop reads of the objects a task returns: the data section (`data_config`) has
`batch_size` (and `tokens_per_batch` where batches are sized by tokens; 0, fixed sizes, when it
has none); the model config (`model_config`) is recorded in model.json by its `record()` (a
dataclass without one is recorded whole) and may name fields a resumed run may switch on
(`SWITCH_ON_WHEN_RESUMING`, with `replace_paths`); the data bundle (`load_data`) is passed back
to the task's own methods only (`train_batches`, `train_tokens`, `has_eval`, ...), except that the
default `has_eval` looks for "eval" in its `splits`.
"""

from __future__ import annotations

import abc
import dataclasses

from attn.config import configurable
from attn.common import applications
from attn.errors import ConfigError

from attn.decoding import Search  # noqa: F401  (re-exported: the settings `decode` takes)

# What every run's results.json holds besides its task's scores (attn.training.evaluation).
RUN_FIGURES = ("params", "step", "best_step", "tokens_per_sec", "tokens_per_sec_steady", "wall_s",
               "decode_s", "eval_s", "beam_size")

# The sections of every training config, each a frozen dataclass the task declares (`sections`).
SECTIONS = ("data", "model", "train")
# The class attributes every task declares (no shared default), and those a task of an
# application launch.py runs declares too (its results table).
REQUIRED = ("sections", "scores", "metrics")
REQUIRED_LAUNCHABLE = ("columns",)


class Task(abc.ABC):
  """What a training run needs to know about its task. Methods are pure in the model (an
  nnx.Module merged inside jit) and the batch (dict of arrays).

  Class-level declarations of what a finished run's results.json holds (read by launch.py and
  the run tools without building anything): `scores` (the task's scores; the first is its own,
  no other task reports it), `figures` (its other figures), `nested` (fields holding a dict by
  bucket or a list by layer, tabulated one column per entry), `metrics` (the fields launch.py
  tabulates by default, the first plotted), `columns` (the results table the run prints) and
  `notes` (nested fields printed as one line under that table, with their label).

  `sections` maps each config section ("data", "model", "train") to the frozen dataclass of its
  settings (attn.config.configurable): the shared defaults of `data_config`, `train_config` and
  `check_model_config` build them, and the loop's validation checks every field declared as a
  registry name (`option(names=...)`) in them before anything is written. The train section's
  class is attn.training.config.LoopConfig or a subclass of it.
  """
  sections: dict[str, type] = {}
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
    holding the task's own settings too (`sections["train"]`); ConfigError naming the first bad
    field."""
    return configurable.from_config(self.sections["train"], cfg, section="train")

  def make_optimizer(self, tc):
    """The optax transformation of train section `tc` (the loop steps it: nnx.Optimizer). By
    default what LoopConfig's own fields say: Adam at train.learning_rate after a linear
    warm-up of train.warmup_steps, gradients clipped to global norm train.clip_norm."""
    import optax  # pylint: disable=import-outside-toplevel
    rate = optax.linear_schedule(0.0, tc.learning_rate, max(tc.warmup_steps, 1))
    return optax.chain(optax.clip_by_global_norm(tc.clip_norm), optax.adam(rate))

  # -- data

  def data_config(self, cfg):
    """The validated `data` section: a frozen dataclass (`sections["data"]`) with `batch_size`
    (and `tokens_per_batch` where batches are sized by tokens)."""
    return configurable.from_config(self.sections["data"], cfg, section="data")

  def check_data(self, cfg) -> None:
    """What `load_data` would refuse in the `data` section `cfg` without reading a record or
    writing a file (a missing data file, a setting the data needs): DataError. The loop calls it
    before it touches the workdir, so such a run leaves a fresh workdir as it was. None by
    default."""
    del cfg

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

  def check_model_config(self, cfg, data, train) -> None:
    """Validates the `model` section, and where it meets the validated data and train sections,
    before any data is read; raises ConfigError naming the fields. By default it builds
    `sections["model"]` (unknown fields, registry names and the dataclass's own checks); a task
    whose model section has derived fields without defaults, or rules across sections,
    overrides it."""
    del data, train
    configurable.from_config(self.sections["model"], cfg, section="model")

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

  def compiler_options(self, tc, model_config) -> dict | None:
    """XLA options the train step compiles with (`jax.jit(compiler_options=...)`), from train
    section `tc` and the model config; None, XLA's defaults, by default (see
    attn.common.jitting.XLA_REDUCTIONS for a step whose wide sums should fuse)."""
    del tc, model_config
    return None

  @abc.abstractmethod
  def uniform_loss(self, model_config) -> float:
    """The mean token loss of a uniform guess over the outputs (log of their number): the
    divergence guard stops a run whose loss exceeds train.divergence_factor times it."""

  # -- evaluation and results

  @abc.abstractmethod
  def evaluate(self, run, role: str = "eval") -> dict:
    """{metric: float} of the current parameters (`run.state`: `nnx.merge(run.graphdef,
    run.state)` gives the model and optimizer) on split `role` ("eval" during training, "test"
    for the results); must hold every name of `selection_metrics` (higher is better)."""

  def write_results(self, run, ckpt) -> dict:
    """After training: restores the best checkpoint (else keeps the last), evaluates the test
    split and writes the run's result files, results.json last (its presence means the run
    finished); returns the results. Only process 0 writes. By default
    (attn.training.results.write_results): `evaluate(run, "test")`, the model config's
    settings and the run's figures (params, step, best_step, tokens_per_sec, wall_s, eval_s);
    a task with more to write (predictions, attention arrays) overrides it."""
    from attn.training import results  # pylint: disable=import-outside-toplevel
    return results.write_results(run, ckpt)

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

  @classmethod
  def missing_members(cls, *, launchable: bool = True) -> list[str]:
    """The members of the contract this class leaves out: its abstract methods, the class
    attributes of `REQUIRED` (and for an application launch.py runs, `REQUIRED_LAUNCHABLE`)
    left empty, and the `sections` it does not declare as dataclasses (the data section with a
    `batch_size`). The application registry (attn.common.applications) asks the class itself,
    so it never imports this layer."""
    missing = sorted(getattr(cls, "__abstractmethods__", ()))
    missing += [a for a in REQUIRED + (REQUIRED_LAUNCHABLE if launchable else ())
                if not getattr(cls, a, None)]
    sections = cls.sections or {}
    if sections:
      missing += [f"sections[{s!r}]" for s in SECTIONS
                  if not (isinstance(sections.get(s), type)
                          and dataclasses.is_dataclass(sections.get(s)))]
      data = sections.get("data")
      if (isinstance(data, type) and dataclasses.is_dataclass(data)
          and "batch_size" not in {f.name for f in dataclasses.fields(data)}
          and not hasattr(data, "batch_size")):
        missing.append("sections['data'].batch_size")
    return missing


def missing_members(cls, *, launchable: bool = True) -> list[str]:
  """The members of the Task contract that task class `cls` leaves out (see the module
  docstring): its abstract methods, the class attributes of `REQUIRED` (and for an application
  launch.py runs, `REQUIRED_LAUNCHABLE`) left empty, and the `sections` it does not declare as
  dataclasses (the data section with a `batch_size`)."""
  if not (isinstance(cls, type) and issubclass(cls, Task)):
    return ["attn.training.Task as its base class"]
  return cls.missing_members(launchable=launchable)


def check_section_names(task: Task, config) -> None:
  """Every field of the config's sections that the task's `sections` declare as a registry name
  (`option(names=...)`) names a registered entry: ConfigError naming the field, the value and
  the known names (attn.config.configurable.check_names). Reads no data, writes nothing."""
  for section, cls in task.sections.items():
    if section in config:
      configurable.check_names(cls, config[section], section=section)


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
