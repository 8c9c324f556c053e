"""The reading-focus demo's library: train one-hop readers (attn.models.reader) on bAbI-style
stories (attn.data.stories), one per normalizer; measure where they look and what they
answer at several inference temperatures; save them.

    results = train_and_evaluate(FocusConfig(), "workdirs/focus")   # focus.json, focus.md

Each reader trains through the one training loop (attn.training.loop; the task is
attn.apps.focus.task.FocusTask) in its own run, <workdir>/runs/<normalizer>/: it gets the
divergence guard, the Ctrl-C save, the workdir lock and the device mesh, and rerunning the same
command resumes an interrupted demo from its last checkpoint (finished readers are not trained
again). The settings the readers train with (`trained_settings`) are recorded beside them
(attn.apps.focus.trained_with): a rerun with others (another --train_size, --seed, ...) is
refused before anything is written. The page and its API are attn.apps.focus.server.

Metrics on the held-out test set, per normalizer and temperature T:
- evidence hit rate: argmax of the attention weights == the gold final supporting fact (for
  "Where is Mary?" the last move of Mary; for "Where is the apple?" the last move of its holder,
  which a one-hop reader can only find by luck: it would need a second hop through the pick-up);
- answer accuracy: argmax of the answer distribution == the gold place.
Every normalizer here preserves the order of the scores, so the argmax (and the hit rate) does not
move with T except through ties; the answer does, because it reads the weighted sum of values.
"""

from __future__ import annotations

import dataclasses
import os
import shutil

import numpy as np

from attn.apps.focus import task as focus_task
from attn.apps.focus import trained_with
from attn.common import files
from attn.common.tables import markdown_table
from attn.config import configurable
from attn.config.configurable import option
from attn.errors import ConfigError
from attn.data import stories
from attn.models import reader
from attn.training import loop
from attn.training import workdir as workdir_lib

MODEL_FILE = "model.json"  # story config, vocabulary, reader configs, sample stories
RESULTS_FILE = "focus.json"
TABLE_FILE = "focus.md"
PAGE_FILE = "focus.html"
TEMPERATURE_RANGE = (0.01, 100.0)  # what the page's slider and the API accept
RUNS_DIR = "runs"  # <workdir>/runs/<normalizer>/: the training run of each reader
# The FocusConfig fields (besides the stories') that change what a reader trains on or how: a
# rerun with other values is refused (trained_with); the others only measure or show the readers.
TRAINED_WITH = ("train_size", "seed", "batch_size", "steps", "learning_rate", "score", "dim",
                "d_attn")


def params_file(normalizer: str) -> str:
  return f"reader_{normalizer}.npz"


@dataclasses.dataclass(frozen=True)
class FocusConfig:
  """The demo's settings (`python -m experiments.focus` takes one flag per field, the stories'
  fields included); defaults train each normalizer in well under a minute on 2 CPU cores."""
  stories: stories.StoryConfig = option(stories.StoryConfig(), "What the stories are drawn from.")
  score: str = option("dot", "Attention score (registry name).")
  normalizers: tuple[str, ...] = option(("softmax", "sparsemax", "entmax15"),
                                        "Normalizers to train a reader with (registry names).")
  temperatures: tuple[float, ...] = option((0.1, 0.3, 1.0, 3.0, 10.0),
                                           "Inference temperatures to evaluate.")
  dim: int = option(32, "Embedding size d.")
  d_attn: int = option(32, "Hidden size of the additive score.")
  steps: int = option(3000, "Adam steps per normalizer.")
  batch_size: int = option(64, "Stories per Adam step.")
  learning_rate: float = option(0.01, "Adam learning rate.")
  train_size: int = option(10000, "Training stories (bAbI's larger set has 10k).")
  test_size: int = option(1000, "Test stories.")
  num_samples: int = option(20, "Test stories offered on the page.")
  seed: int = option(0, "Random seed (stories and initialization).")

  def __post_init__(self):
    if not self.normalizers:
      raise ConfigError("normalizers: name at least one")
    if len(set(self.normalizers)) != len(self.normalizers):
      raise ConfigError(f"normalizers: {', '.join(self.normalizers)} names one twice")
    for n in self.normalizers:
      self.reader_config(n, vocab_size=1)  # validates the score and normalizer names
    if not self.temperatures or not all(
        TEMPERATURE_RANGE[0] <= t <= TEMPERATURE_RANGE[1] for t in self.temperatures):
      raise ConfigError(f"temperatures must lie in [{TEMPERATURE_RANGE[0]}, "
                        f"{TEMPERATURE_RANGE[1]}], got {list(self.temperatures)}")
    for name in ("steps", "batch_size", "train_size", "test_size", "dim", "d_attn"):
      if getattr(self, name) < 1:
        raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
    if not self.learning_rate > 0:
      raise ConfigError(f"learning_rate must be > 0, got {self.learning_rate}")
    if self.num_samples < 0:
      raise ConfigError(f"num_samples must be >= 0, got {self.num_samples}")

  def reader_config(self, normalizer: str, vocab_size: int) -> reader.ReaderConfig:
    return reader.ReaderConfig(vocab_size=vocab_size, num_answers=len(self.stories.places),
                               max_sentences=self.stories.max_sentences, dim=self.dim,
                               score=self.score, normalizer=normalizer, d_attn=self.d_attn)


# ----------------------------------------------------------------------------- training

def data_config(cfg: FocusConfig) -> focus_task.FocusDataConfig:
  """The stories every reader of `cfg` trains and is measured on (the runs' data section)."""
  return focus_task.FocusDataConfig(train_size=cfg.train_size, test_size=cfg.test_size,
                                    batch_size=cfg.batch_size, seed=cfg.seed, stories=cfg.stories)


def run_config(cfg: FocusConfig, normalizer: str):
  """The training loop's config (an ml_collections ConfigDict: data, model and train sections,
  attn.apps.focus.task) of the run that trains the reader of `normalizer`."""
  import ml_collections  # pylint: disable=import-outside-toplevel
  config = ml_collections.ConfigDict()
  config.data = configurable.config_dict(focus_task.FocusDataConfig,
                                         **configurable.as_dict(data_config(cfg)))
  config.model = ml_collections.ConfigDict(
      {"score": cfg.score, "normalizer": normalizer, "dim": cfg.dim, "d_attn": cfg.d_attn})
  config.train = configurable.config_dict(
      focus_task.FocusTrainConfig, steps=cfg.steps, learning_rate=cfg.learning_rate,
      seed=cfg.seed, temperatures=tuple(cfg.temperatures))
  return config


def trained_settings(cfg: FocusConfig) -> dict:
  """The settings every reader of `cfg` trains with, named as their flags (the stories' fields
  and TRAINED_WITH): what trained_with.json records."""
  return {**dataclasses.asdict(cfg.stories), **{k: getattr(cfg, k) for k in TRAINED_WITH}}


def settings_of_run(config: dict) -> dict:
  """`trained_settings` of the FocusConfig that made run config `config` (a run's config.json,
  as `run_config` lays it out): what a workdir from before trained_with.json trained with."""
  data, model, train = config["data"], config["model"], config["train"]
  return {**data["stories"], "train_size": data["train_size"], "seed": data["seed"],
          "batch_size": data["batch_size"], "steps": train["steps"],
          "learning_rate": train["learning_rate"], "score": model["score"], "dim": model["dim"],
          "d_attn": model["d_attn"]}


def run_dir(workdir: str, normalizer: str) -> str:
  """The workdir of the run that trains the reader of `normalizer`."""
  return os.path.join(workdir, RUNS_DIR, normalizer)


def train_reader(cfg: FocusConfig, normalizer: str, workdir: str) -> dict:
  """Trains (or resumes, or finds finished) the reader of `normalizer` through the training
  loop in `run_dir(workdir, normalizer)`. Returns its results (focus_task.FocusTask
  .write_results: train_seconds, final_loss, eval, step)."""
  return loop.train_and_evaluate(run_config(cfg, normalizer), run_dir(workdir, normalizer),
                                 task=focus_task.FocusTask())


# ----------------------------------------------------------------------------- evaluation

def baselines(data: stories.Arrays, num_answers: int) -> dict:
  """Evidence hit rates of a uniform guess and of "the last sentence"; answer chance 1/A."""
  n = data.story_mask.sum(-1)
  return {"evidence_uniform": float(np.mean(1.0 / n)),
          "evidence_last_sentence": float(np.mean(data.support == n - 1)),
          "answer_uniform": 1.0 / num_answers}


# ----------------------------------------------------------------------------- files

def _copy_params(run_workdir: str, path: str):
  """The trained parameters of the run in `run_workdir` (focus_task.READER_FILE), to `path`."""
  with files.atomic_path(path) as tmp:
    shutil.copyfile(os.path.join(run_workdir, focus_task.READER_FILE), tmp)


def _sample_record(ex: stories.Example) -> dict:
  return {"sentences": ex.sentences, "question": ex.question, "answer": ex.answer,
          "support": ex.support, "supports": list(ex.supports), "kind": ex.kind}


def results_table(results: dict) -> str:
  """Markdown: a summary at T = 1 and one table per normalizer over the temperatures (with hit
  rate / accuracy per question kind when there are several kinds)."""
  base = results["baselines"]
  kinds = sorted({k for r in results["normalizers"].values() for row in r["eval"]
                  for k in row["by_kind"]})
  kinds = kinds if len(kinds) > 1 else []
  lines = [f"score `{results['config']['score']}`; test set of {results['config']['test_size']} "
           f"stories; chance: evidence {base['evidence_uniform']:.3f} (uniform), "
           f"{base['evidence_last_sentence']:.3f} (last sentence); answer "
           f"{base['answer_uniform']:.3f}", ""]
  summary = []
  for name, r in results["normalizers"].items():
    row = focus_task.nearest_to_one(r["eval"])
    summary.append([name, f"{row['evidence_hit_rate']:.3f}", f"{row['answer_accuracy']:.3f}",
                    f"{r['train_seconds']:.1f}", f"{r['final_loss']:.3f}"])
  lines.append(markdown_table(["normalizer", "evidence hit rate (T=1)", "answer accuracy (T=1)",
                               "train time (s)", "final loss"], summary))
  header = ["T", "evidence hit rate", "answer accuracy", "mean max weight",
            "mean non-zero weights"] + [f"{k}: hit / acc" for k in kinds]
  for name, r in results["normalizers"].items():
    rows = [[f"{row['temperature']:g}", f"{row['evidence_hit_rate']:.3f}",
             f"{row['answer_accuracy']:.3f}", f"{row['mean_max_weight']:.3f}",
             f"{row['mean_nonzero_weights']:.2f}"]
            + [f"{row['by_kind'][k]['evidence_hit_rate']:.3f} / "
               f"{row['by_kind'][k]['answer_accuracy']:.3f}" if k in row["by_kind"] else "-"
               for k in kinds] for row in r["eval"]]
    lines += ["", f"**{name}** by inference temperature", "", markdown_table(header, rows)]
  return "\n".join(lines) + "\n"


def train_and_evaluate(cfg: FocusConfig, workdir: str, *, page: str | None = None,
                       verbose: bool = True) -> dict:
  """Trains a reader per normalizer through the training loop, each in its own run under
  `workdir/runs/<normalizer>/` (rerunning the same command resumes an interrupted one and
  skips finished ones), evaluates it at every temperature and writes into workdir:
  reader_<normalizer>.npz, model.json, focus.json, focus.md (and focus.html when `page` is
  given). Returns the results (what focus.json holds). A workdir whose readers were trained
  with other settings (`trained_settings`) is refused (WorkdirError) before anything is
  written; the settings are recorded (trained_with.json) before any reader trains."""
  say = print if verbose else (lambda *a, **k: None)
  workdir_lib.prepare(workdir)
  workdir_lib.claim(workdir, "focus")  # another application's run is refused, not overwritten
  with workdir_lib.lock(workdir):
    trained_with.check(workdir, trained_settings(cfg), trained_with.recorded(
        workdir, os.path.join(workdir, RUNS_DIR), settings_of_run), "readers")
    trained_with.write(workdir, trained_settings(cfg))
    data = focus_task.load_stories(data_config(cfg))
    sc = cfg.stories
    results = {"config": _config_dict(cfg),
               "baselines": baselines(data.splits["test"], len(sc.places)), "normalizers": {}}
    readers = {}
    for name in cfg.normalizers:
      run = train_reader(cfg, name, workdir)
      one = focus_task.nearest_to_one(run["eval"])
      say(f"{name}: trained in {run['train_seconds']:.1f}s; at T={one['temperature']:g} "
          f"evidence hit rate {one['evidence_hit_rate']:.3f}, answer accuracy "
          f"{one['answer_accuracy']:.3f}", flush=True)
      results["normalizers"][name] = {k: run[k] for k in ("train_seconds", "final_loss", "eval")}
      _copy_params(run_dir(workdir, name), os.path.join(workdir, params_file(name)))
      readers[name] = cfg.reader_config(name, len(data.vocab)).to_dict()
    files.write_json(os.path.join(workdir, MODEL_FILE), {
        "stories": dataclasses.asdict(sc), "vocab": data.vocab.words, "readers": readers,
        "samples": [_sample_record(ex) for ex in data.test_examples[:cfg.num_samples]]})
    if page is not None:
      files.write_text(os.path.join(workdir, PAGE_FILE), page)
    files.write_text(os.path.join(workdir, TABLE_FILE),
                     "# Reading focus\n\n" + results_table(results))
    files.write_json(os.path.join(workdir, RESULTS_FILE), results)
  return results


def _config_dict(cfg: FocusConfig) -> dict:
  d = dataclasses.asdict(cfg)
  d["normalizers"], d["temperatures"] = list(cfg.normalizers), list(cfg.temperatures)
  return d
