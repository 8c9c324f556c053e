"""The reading-focus demo's library: train one-hop readers (attn.models.reader) on bAbI-style
stories (attn.data.stories), one per normalizer; measure where they look and what they
answer at several inference temperatures; save them.

    results = focus.train_and_evaluate(FocusConfig(), "workdirs/focus")   # focus.json, focus.md

The page and its API are attn.apps.focus.focus_server.

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
import functools
import math
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from attn.common import files
from attn.common.tables import markdown_table
from attn.config.configurable import option
from attn.errors import ConfigError
from attn.data import stories
from attn.models import reader

MODEL_FILE = "model.json"  # story config, vocabulary, reader configs, sample stories
RESULTS_FILE = "focus.json"
TABLE_FILE = "focus.md"
PAGE_FILE = "focus.html"
TEMPERATURE_RANGE = (0.01, 100.0)  # what the page's slider and the API accept


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

def _loss(model, batch):
  """Mean answer NLL over the batch."""
  out = model(batch.story, batch.story_mask, batch.question)
  return -jnp.mean(jnp.take_along_axis(out.log_probs, batch.answer[:, None], axis=-1))


@functools.partial(jax.jit, static_argnums=(0, 5, 6), donate_argnums=1)
def _train_chunk(graphdef, state, data, key, n, chunk, batch_size):
  """n <= chunk Adam steps in one loop (n is traced, so every chunk, the last shorter one too,
  runs one compiled program); batches drawn with replacement from `data` (passed as an argument:
  closed-over arrays would become constants). Returns (state, losses [chunk], the first n set)."""

  def step(i, carry):
    state, losses = carry
    model, optimizer = nnx.merge(graphdef, state)
    idx = jax.random.randint(jax.random.fold_in(key, i), (batch_size,), 0, data.answer.shape[0])
    batch = jax.tree.map(lambda x: x[idx], data)
    loss, grads = nnx.value_and_grad(_loss)(model, batch)
    optimizer.update(model, grads)
    return nnx.state((model, optimizer)), losses.at[i].set(loss)

  return jax.lax.fori_loop(0, n, step, (state, jnp.zeros((chunk,), jnp.float32)))


def train(cfg: FocusConfig, normalizer: str, data: stories.Arrays, vocab_size: int,
          chunk: int = 250, on_chunk=None):
  """Trains one reader. Returns (model, losses [steps] as numpy)."""
  model = reader.build(cfg.reader_config(normalizer, vocab_size), seed=cfg.seed)
  optimizer = nnx.Optimizer(model, optax.adam(cfg.learning_rate), wrt=nnx.Param)
  graphdef, state = nnx.split((model, optimizer))
  data = jax.tree.map(jnp.asarray, data)
  key = jax.random.fold_in(jax.random.PRNGKey(cfg.seed), 1)
  chunk = min(chunk, cfg.steps)
  losses, done = [], 0
  while done < cfg.steps:
    n = min(chunk, cfg.steps - done)
    state, loss = _train_chunk(graphdef, state, data, jax.random.fold_in(key, done), n, chunk,
                               cfg.batch_size)
    losses.append(np.asarray(loss)[:n])
    done += n
    if on_chunk is not None:
      on_chunk(done, float(losses[-1][-1]))
  model, _ = nnx.merge(graphdef, state)
  return model, np.concatenate(losses)


# ----------------------------------------------------------------------------- evaluation

def _rates(hit, correct, w):
  return {"evidence_hit_rate": float(hit.mean()), "answer_accuracy": float(correct.mean()),
          "mean_max_weight": float(w.max(-1).mean()),
          "mean_nonzero_weights": float((w > 0).sum(-1).mean()), "examples": int(hit.size)}


def evaluate(model: reader.Reader, data: stories.Arrays, temperatures) -> list[dict]:
  """Per temperature: evidence hit rate, answer accuracy, mean max weight and mean number of
  non-zero weights, overall and per question kind present."""
  graphdef, state = nnx.split(model)
  rows = []
  for t in temperatures:
    out = reader.read(graphdef, state, data.story, data.story_mask, data.question, float(t))
    w = np.asarray(out.weights)  # [N, S]
    hit = w.argmax(-1) == data.support
    correct = np.asarray(out.log_probs).argmax(-1) == data.answer
    row = {"temperature": float(t), **_rates(hit, correct, w), "by_kind": {}}
    for k, kind in enumerate(stories.KINDS):
      sel = data.kind == k
      if sel.any():
        row["by_kind"][kind] = _rates(hit[sel], correct[sel], w[sel])
    rows.append(row)
  return rows


def baselines(data: stories.Arrays, num_answers: int) -> dict:
  """Evidence hit rates of a uniform guess and of "the last sentence"; answer chance 1/A."""
  n = data.story_mask.sum(-1)
  return {"evidence_uniform": float(np.mean(1.0 / n)),
          "evidence_last_sentence": float(np.mean(data.support == n - 1)),
          "answer_uniform": 1.0 / num_answers}


# ----------------------------------------------------------------------------- files

def _save_params(path: str, model):
  with files.atomic_path(path) as tmp:
    reader.save_params(tmp, model)


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
    row = _nearest_to_one(r["eval"])
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


def _nearest_to_one(rows: list[dict]) -> dict:
  """The evaluation row whose temperature is nearest to 1 (on a log scale)."""
  return min(rows, key=lambda x: abs(math.log(x["temperature"])))


def train_and_evaluate(cfg: FocusConfig, workdir: str, *, page: str | None = None,
                       verbose: bool = True) -> dict:
  """Trains a reader per normalizer, evaluates it at every temperature and writes into workdir:
  reader_<normalizer>.npz, model.json, focus.json, focus.md (and focus.html when `page` is
  given). Returns the results (what focus.json holds)."""
  say = print if verbose else (lambda *a, **k: None)
  os.makedirs(workdir, exist_ok=True)
  sc = cfg.stories
  vocab = stories.Vocab.for_config(sc)
  train_set = stories.generate(cfg.train_size, cfg.seed, sc)
  test_set = stories.generate(cfg.test_size, cfg.seed + 1_000_003, sc)  # a disjoint stream
  train_data = stories.encode(train_set, vocab, sc)
  test_data = stories.encode(test_set, vocab, sc)
  results = {"config": _config_dict(cfg), "baselines": baselines(test_data, len(sc.places)),
             "normalizers": {}}
  readers = {}
  for name in cfg.normalizers:
    t0 = time.time()
    model, losses = train(cfg, name, train_data, len(vocab), on_chunk=lambda done, loss: say(
        f"  {name:<10} step {done:>5}/{cfg.steps}  loss {loss:.3f}  ({time.time() - t0:.1f}s)",
        flush=True))
    seconds = time.time() - t0
    rows = evaluate(model, test_data, cfg.temperatures)
    one = _nearest_to_one(rows)
    say(f"{name}: trained in {seconds:.1f}s; at T={one['temperature']:g} evidence hit rate "
        f"{one['evidence_hit_rate']:.3f}, answer accuracy {one['answer_accuracy']:.3f}", flush=True)
    results["normalizers"][name] = {"train_seconds": seconds, "final_loss": float(
        losses[-50:].mean()), "eval": rows}
    _save_params(os.path.join(workdir, params_file(name)), model)
    readers[name] = model.cfg.to_dict()
  files.write_json(os.path.join(workdir, MODEL_FILE), {
      "stories": dataclasses.asdict(sc), "vocab": vocab.words, "readers": readers,
      "samples": [_sample_record(ex) for ex in test_set[:cfg.num_samples]]})
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
