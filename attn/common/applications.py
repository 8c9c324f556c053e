"""The registry of applications, `APPS`: one `App` entry per application.

An application is a folder (`attn/apps/<name>/`) holding its task, model, data, diagnosis hooks
and defaults; its package's `__init__` adds its `App` here. The registry sits below the shared
layers (training loop, inspection, launching), which read it and never name an application; the
application packages above them fill it when the entry points and the tests import them.
"""

from __future__ import annotations

import dataclasses
import json
import os

from attn.common import files
from attn.errors import ConfigError
from attn.registry import Registry


@dataclasses.dataclass(frozen=True)
class App:
  """One application.

  module: the module of the entry point `python -m` runs.
  doc: one line for listings.
  task: its task class (an `attn.training.Task` subclass), or a function of no arguments that
    imports and returns it, defined in the application's package: listing applications then
    imports no model code, and this layer never imports an application. Either way the class is
    checked against the Task contract (attn.training.Task.missing_members: one TypeError line
    naming what it lacks) when the entry is made, or when the function is first called.
  launchable: launch.py starts it: it trains in --workdir from --config=FILE:PRESET, resumes,
    and leaves results.json, whose fields the task declares (`Task.scores`, `figures`,
    `nested`, `metrics`).
  results_file: the file a finished run leaves in its workdir (how the run tools recognise a run
    of an application that launch.py does not start).
  diagnose: a function of no arguments that imports and returns the diagnosis hook for a
    finished run of this application, `diagnose(settings: DiagnoseSettings, out: str) ->
    (report path, plot paths, table)`; None: the sequence-to-sequence diagnosis.
  """
  module: str
  doc: str = ""
  task: object = None
  launchable: bool = True
  diagnose: object = None
  results_file: str = "results.json"

  def __post_init__(self):
    for name in ("task", "diagnose"):
      value = getattr(self, name)
      if value is not None and not callable(value):
        raise TypeError(f"{self.module}: App.{name} must be a class or a function of no "
                        f"arguments that imports and returns it, got {value!r}")
    if isinstance(self.task, type):  # (a loader's class is checked when it is first called)
      _check_task(self)

  @property
  def task_class(self) -> type:
    """The task class (its loader called, and the class checked, on first use)."""
    return self.task if isinstance(self.task, type) else _check_task(self)

  @property
  def diagnose_fn(self):
    """The diagnosis hook (imported by its loader), or None."""
    return None if self.diagnose is None else self.diagnose()

  # What a finished run's results.json holds, as its task declares it.
  @property
  def metrics(self) -> tuple[str, ...]:
    """The results.json fields launch.py tabulates by default (the first is plotted)."""
    return self.task_class.metrics

  @property
  def scores(self) -> tuple[str, ...]:
    """The task's scores (each also `<name>_greedy` when a run decodes with a beam)."""
    return self.task_class.scores

  @property
  def figures(self) -> tuple[str, ...]:
    return self.task_class.figures

  @property
  def nested(self) -> tuple[str, ...]:
    """Fields holding a dict (by bucket) or a list (by layer) of numbers."""
    return self.task_class.nested

  @property
  def known_metrics(self) -> tuple[str, ...]:
    """Every numeric field a finished run can have in results.json (the nested ones apart)."""
    return (self.scores + tuple(f"{s}_greedy" for s in self.scores) + self.figures
            + self.task_class.run_figures)


def _check_task(entry: App) -> type:
  """The entry's task class when it fulfils the Task contract; else a TypeError, one line naming
  the task, the application's entry point and every member it is missing. The class says what
  it lacks (`attn.training.Task.missing_members`), so this layer imports no task code."""
  cls = entry.task if isinstance(entry.task, type) else entry.task()
  gaps = getattr(cls, "missing_members", None) if isinstance(cls, type) else None
  missing = gaps(launchable=entry.launchable) if gaps else ["attn.training.Task as its base class"]
  if missing:
    raise TypeError(f"the task {getattr(cls, '__qualname__', cls)} of {entry.module} lacks "
                    f"{', '.join(missing)} (the Task contract: attn/training/task.py)")
  return cls


APPS: Registry[App] = Registry("application", error=ConfigError)


def registry() -> Registry[App]:
  """`APPS`, once an application is registered in it; a RuntimeError while it is empty (nothing
  imported the package that registers the built-in applications, which the message names)."""
  if not APPS.names():
    raise RuntimeError("no application is registered: import attn.apps first (the entry points "
                       "and the tests do), or add one to attn.common.applications.APPS")
  return APPS


def app(name: str) -> App:
  """The registered application `name`; ConfigError listing the known ones if none."""
  return registry().get(name)


def _recorded_scores(workdir: str):
  """The dicts of scores a run recorded: results.json's, then metrics.jsonl's first
  evaluation's (a run stopped before its final evaluation)."""
  results = files.read_json(os.path.join(workdir, "results.json"))
  if isinstance(results, dict):
    yield results
  try:
    with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
      for line in f:
        try:
          rec = json.loads(line)
        except ValueError:  # a line cut short by a killed run
          continue
        if isinstance(rec, dict) and rec.get("split") == "eval":
          yield rec
          return
  except OSError:
    return


def app_of_records(workdir: str) -> str | None:
  """The launchable application whose scores the run in `workdir` recorded (results.json, else
  metrics.jsonl's first evaluation), or None."""
  registry()  # an empty registry is an error, not "no application"
  for scores in _recorded_scores(workdir):
    name = app_of_results(scores)
    if name is not None:
      return name
  return None


def app_of_workdir(workdir: str) -> str | None:
  """The application launch.py does not start whose finished run `workdir` holds (its
  `results_file`), or None."""
  for name, entry in registry().items():
    if not entry.launchable and os.path.exists(os.path.join(workdir, entry.results_file)):
      return name
  return None


def not_a_run_of(workdir: str, tool: str) -> str | None:
  """The one-line refusal of `tool` (the command a user ran) for a workdir that
  holds a run of an application it does not read, or None."""
  name = app_of_workdir(workdir)
  if name is None:
    return None
  entry = app(name)
  return (f"{workdir} holds a {name} run ({entry.results_file}: {entry.doc}), which {tool} does "
          f"not read; it reads the runs launch.py starts "
          f"({', '.join(n for n, a in registry().items() if a.launchable)}). The {name} run's own "
          f"tools: python -m {entry.module} --help")


def app_of_results(fields) -> str | None:
  """The launchable application whose first score is among `fields` (a results.json's or an
  evaluation's keys), or None: each task's first score is its own."""
  for name, entry in registry().items():
    if entry.launchable and entry.scores and entry.scores[0] in fields:
      return name
  return None
