"""Retrieval, then read, as a sweep: train a retriever + reader (attn.apps.retrieve.model) on
two-hop questions in pools of distractor stories (attn.apps.retrieve.data), one model per
retrieval mode and number of distractors; measure retrieval recall@k, answer accuracy and where
each hop looks (attn.apps.retrieve.evaluation); save the table, the plot and the models the page
serves.

    results = train_and_evaluate(RetrieveConfig(), "workdirs/retrieve")

Training signal (loss per question): -log p(a|q), the answer marginalized over the retrieved
passages (end to end: the retriever gets gradient through p(z|q) over the retrieved set only),
plus `retrieval_loss` times -log softmax(r_q . r_p)[gold] over the whole pool (supervision from
the gold passage). The supervision is on by default because the end-to-end signal is blind to a
gold passage outside the top k: early in training the reader is no better than chance on any
passage, so nothing pulls the gold one in. `--retrieval_loss=0` trains end to end only.

Each model trains through the one training loop (attn.training.loop; its task:
attn.apps.retrieve.task.RetrieveTask) in its own workdir, <workdir>/runs/<mode>_d<n>/,
so it gets the loop's divergence guard, Ctrl-C save, resuming and workdir lock: rerunning the
same command resumes a sweep that was stopped. The settings the models train with
(`trained_settings`) are recorded beside them (attn.apps.focus.trained_with): a rerun with others
(another --train_size, --seed, ...) is refused before anything is written.

Metrics on the held-out pools, per mode and number of distractors:
- recall@k: the gold story is among the k passages read (whole_pool reads every passage: 1);
- answer accuracy (chance: 1 / places);
- hop hits: the sentence hop h weighs most (over every sentence read, weighted by p(z|q)) is its
  gold fact: hop 1 the pick-up of the object, hop 2 the holder's last move.
"""

from __future__ import annotations

import dataclasses
import os
import shutil

from attn.common import files
from attn.common.tables import markdown_table
from attn.apps.focus import trained_with
from attn.config.configurable import option
from attn.errors import ConfigError
from attn.apps.retrieve import data as pools
from attn.apps.retrieve import evaluation
from attn.apps.retrieve import model as retriever
from attn.apps.retrieve import task as retrieve_task
from attn.data import stories
from attn.training import workdir as workdir_lib

MODEL_FILE = "model.json"  # story config, vocabulary, the served model's config, sample pools
RESULTS_FILE = "retrieve.json"
TABLE_FILE = "retrieve.md"
PLOT_FILE = "retrieve.png"
PAGE_FILE = "retrieve.html"
SERVED_PARAMS = "retriever.npz"  # the `retrieve` model trained with the most distractors
RUNS_DIR = "runs"  # one training-loop workdir per (mode, distractors): run_dir
# What retrieve.json keeps of each run's results, per mode and number of distractors.
ROW_FIELDS = ("distractors", "train_seconds", "final_loss", "passages", "recall_at_k",
              "answer_accuracy", "hop_hits")
# The RetrieveConfig fields (besides the stories') that change what a model trains on or how: a
# rerun with other values is refused (trained_with); the others only choose which models to train
# (modes, distractors: each its own run) or measure and show them.
TRAINED_WITH = ("train_size", "seed", "batch_size", "steps", "learning_rate", "retrieval_loss",
                "dim", "hops", "top_k")


@dataclasses.dataclass(frozen=True)
class RetrieveConfig:
  """The experiment's settings (`python -m experiments.retrieve` takes one flag per field, the
  stories' fields included); the defaults run the whole sweep in a few minutes on 2 CPU cores."""
  stories: stories.StoryConfig = option(pools.POOL_STORIES, "What the stories are drawn from.")
  distractors: tuple[int, ...] = option((0, 4, 16, 64), "Distractor stories per pool (the sweep).")
  modes: tuple[str, ...] = option(("retrieve", "random", "whole_pool"),
                                  "Retrieval modes to train (attn.apps.retrieve.model.RETRIEVAL).")
  top_k: int = option(2, "Passages (stories) read per question.")
  hops: int = option(2, "Reader hops (the questions need two supporting facts).")
  dim: int = option(32, "Embedding size d.")
  retrieval_loss: float = option(1.0, "Weight of the gold-passage loss (0: end to end only).")
  steps: int = option(1500, "Adam steps per model.")
  batch_size: int = option(32, "Questions per Adam step.")
  learning_rate: float = option(0.01, "Adam learning rate.")
  train_size: int = option(4000, "Training questions (each with its own pool).")
  test_size: int = option(500, "Test questions.")
  num_samples: int = option(8, "Test pools offered on the page.")
  page_distractors: int = option(4, "Distractors in the page's sample pools.")
  seed: int = option(0, "Random seed (stories, pools and initialization).")

  def __post_init__(self):
    if not self.distractors or min(self.distractors) < 0:
      raise ConfigError(f"distractors: name counts >= 0, got {list(self.distractors)}")
    if not self.modes or len(set(self.modes)) != len(self.modes):
      raise ConfigError(f"modes: name each mode once, got {list(self.modes)}")
    for m in self.modes:
      retriever.RETRIEVAL.get(m)
    for name in ("top_k", "hops", "dim", "steps", "batch_size", "train_size", "test_size"):
      if getattr(self, name) < 1:
        raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
    if self.retrieval_loss < 0 or not self.learning_rate > 0:
      raise ConfigError(f"retrieval_loss must be >= 0 and learning_rate > 0, got "
                        f"{self.retrieval_loss}, {self.learning_rate}")
    if self.num_samples < 0 or self.page_distractors < 0:
      raise ConfigError("num_samples and page_distractors must be >= 0")
    if self.stories.object_questions <= 0 or len(self.stories.objects) < 2:
      raise ConfigError("the pools need object questions (object_questions > 0) and at least "
                        "two objects")

  def model_config(self, mode: str, vocab_size: int) -> retriever.RetrieverConfig:
    return retriever.RetrieverConfig(
        vocab_size=vocab_size, num_answers=len(self.stories.places),
        max_sentences=self.stories.max_sentences, dim=self.dim, hops=self.hops,
        top_k=self.top_k, mode=mode)


# ----------------------------------------------------------------------------- measures

def evaluate(model, data: pools.PoolSet, cfg: RetrieveConfig) -> dict:
  """`evaluation.measure` with the seed and story length of `cfg`."""
  return evaluation.measure(model, data, cfg.seed, cfg.stories.max_sentences)


def baselines(cfg: RetrieveConfig, passages: int) -> dict:
  """Chance: answer 1 / places; recall@k of k passages at random."""
  return {"answer_uniform": 1.0 / len(cfg.stories.places),
          "recall_random": min(1.0, cfg.top_k / passages)}


# ----------------------------------------------------------------------------- files

def _sample_record(built: pools.Pools, i: int) -> dict:
  """A test pool for the page: its text (passages separated by blank lines), question, answer
  and where the gold story and facts are."""
  passages = built.passages(i)
  return {"text": "\n\n".join("\n".join(p) for p in passages),
          "sentences": [s for p in passages for s in p], "question": built.examples[i].question,
          "answer": built.examples[i].answer, "passages": len(passages),
          "gold": {"passages": int(built.arrays.gold[i])},
          "supports": built.arrays.supports[i].tolist()}


def _recall(mode: str, row: dict) -> str:
  return "all" if retriever.RETRIEVAL.get(mode).flat else f"{row['recall_at_k']:.3f}"


def results_table(results: dict) -> str:
  """Markdown: one row per number of distractors, recall@k and accuracy per mode."""
  modes = list(results["modes"])
  k = results["config"]["top_k"]
  header = ["distractors", "passages"] + [f"{m}: recall@{k} / accuracy" for m in modes] + [
      f"{m}: hop hits" for m in modes]
  rows = []
  for j, d in enumerate(results["config"]["distractors"]):
    evals = [results["modes"][m][j] for m in modes]
    rows.append([str(d), str(evals[0]["passages"])]
                + [f"{_recall(m, e)} / {e['answer_accuracy']:.3f}" for m, e in zip(modes, evals)]
                + [" / ".join(f"{h:.2f}" for h in e["hop_hits"]) for e in evals])
  train = [[m] + [f"{e['train_seconds']:.1f}" for e in results["modes"][m]] for m in modes]
  return "\n".join([
      f"test set of {results['config']['test_size']} two-hop questions per row; top_k = {k}; "
      f"chance: answer {results['baselines']['answer_uniform']:.3f}; hop hits: hop 1 on the "
      "pick-up, hop 2 on the holder's last move; `all`: reads every story", "",
      markdown_table(header, rows), "", "training time (s) per number of distractors", "",
      markdown_table(["mode"] + [str(d) for d in results["config"]["distractors"]], train)]) + "\n"


def plot(results: dict, path: str):
  """Answer accuracy and recall@k against the number of distractors, one line per mode."""
  from attn.common.plots import pyplot  # pylint: disable=import-outside-toplevel
  plt = pyplot()
  d = results["config"]["distractors"]
  x = [max(v, 0.5) for v in d]  # 0 distractors on a log axis
  fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
  for name, rows in results["modes"].items():
    axes[0].plot(x, [r["answer_accuracy"] for r in rows], marker="o", label=name)
    if not retriever.RETRIEVAL.get(name).flat:  # a whole-pool reader retrieves nothing
      axes[1].plot(x, [r["recall_at_k"] for r in rows], marker="o", label=name)
  axes[0].axhline(results["baselines"]["answer_uniform"], color="grey", ls=":", label="chance")
  for ax, title in zip(axes, ("answer accuracy", f"recall@{results['config']['top_k']}")):
    ax.set_xscale("log")
    ax.set_xticks(x, [str(v) for v in d])
    ax.set_xlabel("distractor stories in the pool")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title)
  axes[0].legend(fontsize=8)
  fig.tight_layout()
  with files.atomic_path(path) as tmp:
    fig.savefig(tmp, format="png", dpi=110)
  plt.close(fig)


def run_dir(workdir: str, mode: str, distractors: int) -> str:
  """The workdir of the sweep's model of `mode` with `distractors` (the training loop's)."""
  return os.path.join(workdir, RUNS_DIR, f"{mode}_d{distractors}")


def trained_settings(cfg: RetrieveConfig) -> dict:
  """The settings every model of `cfg` trains with, named as their flags (the stories' fields
  and TRAINED_WITH): what trained_with.json records."""
  return {**dataclasses.asdict(cfg.stories), **{k: getattr(cfg, k) for k in TRAINED_WITH}}


def settings_of_run(config: dict) -> dict:
  """`trained_settings` of the RetrieveConfig that made run config `config` (a run's
  config.json, as retrieve_task.run_config lays it out): what a workdir from before
  trained_with.json trained with."""
  data, model, train = config["data"], config["model"]["retriever"], config["train"]
  return {**data["stories"], "train_size": data["train_size"], "seed": data["seed"],
          "batch_size": data["batch_size"], "steps": train["steps"],
          "learning_rate": train["learning_rate"], "retrieval_loss": train["retrieval_loss"],
          "dim": model["dim"], "hops": model["hops"], "top_k": model["top_k"]}


def _copy(src: str, dst: str):
  with files.atomic_path(dst) as tmp:
    shutil.copyfile(src, tmp)


def train_and_evaluate(cfg: RetrieveConfig, workdir: str, *, page: str | None = None,
                       verbose: bool = True) -> dict:
  """Per number of distractors and mode: trains one model through the training loop
  (attn.training.loop, task attn.apps.retrieve.task.RetrieveTask) in its own workdir,
  `run_dir(workdir, mode, distractors)`, and measures its final parameters on the held-out
  pools. Rerunning the same command resumes a sweep stopped by Ctrl-C: each run resumes from
  its checkpoint, and a finished one is measured again without training. Writes into workdir
  retrieve.json, retrieve.md, retrieve.png, model.json and retriever.npz (the first mode
  trained with the most distractors, what the page serves), and retrieve.html when `page` is
  given. Returns the results (what retrieve.json holds). A workdir whose models were trained
  with other settings (`trained_settings`) is refused (WorkdirError) before anything is
  written; the settings are recorded (trained_with.json) before any model trains."""
  from attn.training import building, loop  # pylint: disable=import-outside-toplevel
  say = print if verbose else (lambda *a, **k: None)
  sc = cfg.stories
  vocab = stories.Vocab.for_config(sc)
  task = retrieve_task.RetrieveTask()
  # Every run's config and pools are checked (the pools built) before anything is written.
  configs = {(d, mode): retrieve_task.run_config(cfg, mode, d)
             for d in cfg.distractors for mode in cfg.modes}
  for config in configs.values():
    building.validate_config(config, task)
    retrieve_task.load_pools(task.data_config(config.data))
  shown = pools.build(max(cfg.num_samples, 1), cfg.page_distractors, cfg.seed + 2_000_003, sc,
                      vocab)
  workdir_lib.prepare(workdir)
  workdir_lib.claim(workdir, "retrieve")  # another application's run is refused, not overwritten
  trained_with.check(workdir, trained_settings(cfg), trained_with.recorded(
      workdir, os.path.join(workdir, RUNS_DIR), settings_of_run), "models")
  trained_with.write(workdir, trained_settings(cfg))
  results = {"config": _config_dict(cfg), "modes": {m: [] for m in cfg.modes}}
  served = None
  for (d, mode), config in configs.items():
    run = loop.train_and_evaluate(config, run_dir(workdir, mode, d), task)
    row = {k: run[k] for k in ROW_FIELDS}
    results["modes"][mode].append(row)
    say(f"{d:>3} distractors  {mode:<10} recall@{cfg.top_k} {row['recall_at_k']:.3f}  "
        f"accuracy {row['answer_accuracy']:.3f}  ({row['train_seconds']:.1f}s)", flush=True)
    if mode == cfg.modes[0] and d == max(cfg.distractors):
      served = run
  results["baselines"] = baselines(cfg, 1 + max(cfg.distractors))
  _copy(os.path.join(run_dir(workdir, cfg.modes[0], max(cfg.distractors)),
                     retrieve_task.PARAMS_FILE), os.path.join(workdir, SERVED_PARAMS))
  files.write_json(os.path.join(workdir, MODEL_FILE), {
      "stories": dataclasses.asdict(sc), "vocab": vocab.words, "model": served["model"],
      "trained_distractors": max(cfg.distractors),
      "samples": [_sample_record(shown, i) for i in range(cfg.num_samples)]})
  if page is not None:
    files.write_text(os.path.join(workdir, PAGE_FILE), page)
  plot(results, os.path.join(workdir, PLOT_FILE))
  files.write_text(os.path.join(workdir, TABLE_FILE),
                   "# Retrieval, then read\n\n" + results_table(results))
  files.write_json(os.path.join(workdir, RESULTS_FILE), results)
  return results


def _config_dict(cfg: RetrieveConfig) -> dict:
  d = dataclasses.asdict(cfg)
  d["distractors"], d["modes"] = list(cfg.distractors), list(cfg.modes)
  return d
