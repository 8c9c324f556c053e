"""The reading-focus demo's library: train one-hop readers (attn.models.reader) on bAbI-style
stories (attn.inspection.stories), one per normalizer; measure where they look and what they answer at
several inference temperatures; save them; answer the page's queries over HTTP.

    results = focus.train_and_evaluate(FocusConfig(), "workdirs/focus")   # focus.json, focus.md
    service = focus.FocusService.from_workdir("workdirs/focus")
    focus.make_server(service, focus.inline_page(web_dir), port=8000).serve_forever()

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
import json
import logging
import math
import os
import re
import tempfile
import threading
import time
import traceback
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from attn.inspection import stories
from attn.errors import ConfigError, DataError
from attn.models import reader

log = logging.getLogger(__name__)

MODEL_FILE = "model.json"  # story config, vocabulary, reader configs, sample stories
RESULTS_FILE = "focus.json"
TABLE_FILE = "focus.md"
PAGE_FILE = "focus.html"
TEMPERATURE_RANGE = (0.01, 100.0)  # what the page's slider and the API accept


def params_file(normalizer: str) -> str:
  return f"reader_{normalizer}.npz"


@dataclasses.dataclass(frozen=True)
class FocusConfig:
  """The demo's settings; defaults train each normalizer in well under a minute on 2 CPU cores."""
  stories: stories.StoryConfig = stories.StoryConfig()
  score: str = "dot"  # any registered score
  normalizers: tuple[str, ...] = ("softmax", "sparsemax", "entmax15")
  temperatures: tuple[float, ...] = (0.1, 0.3, 1.0, 3.0, 10.0)  # evaluated after training
  dim: int = 32  # embedding size d
  d_attn: int = 32  # additive score hidden size
  steps: int = 3000  # Adam steps per normalizer
  batch_size: int = 64
  learning_rate: float = 0.01
  train_size: int = 10000  # training stories (bAbI's larger set has 10k)
  test_size: int = 1000
  num_samples: int = 20  # test stories offered on the page
  seed: int = 0

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

def _write_atomic(path: str, text: str):
  d = os.path.dirname(os.path.abspath(path))
  fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-")
  with os.fdopen(fd, "w") as f:
    f.write(text)
  os.replace(tmp, path)


def _save_params_atomic(path: str, model):
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".tmp-")
  os.close(fd)
  reader.save_params(tmp, model)
  os.replace(tmp, path)


def _sample_record(ex: stories.Example) -> dict:
  return {"sentences": ex.sentences, "question": ex.question, "answer": ex.answer,
          "support": ex.support, "supports": list(ex.supports), "kind": ex.kind}


def results_table(results: dict) -> str:
  """Markdown: a summary at T = 1 and one table per normalizer over the temperatures."""
  base = results["baselines"]
  kinds = sorted({k for r in results["normalizers"].values() for row in r["eval"]
                  for k in row["by_kind"]})
  lines = [f"score `{results['config']['score']}`; test set of {results['config']['test_size']} "
           f"stories; chance: evidence {base['evidence_uniform']:.3f} (uniform), "
           f"{base['evidence_last_sentence']:.3f} (last sentence); answer "
           f"{base['answer_uniform']:.3f}", "",
           "| normalizer | evidence hit rate (T=1) | answer accuracy (T=1) | train time (s) | "
           "final loss |", "|---|---|---|---|---|"]
  for name, r in results["normalizers"].items():
    row = min(r["eval"], key=lambda x: abs(math.log(x["temperature"])))
    lines.append(f"| {name} | {row['evidence_hit_rate']:.3f} | {row['answer_accuracy']:.3f} | "
                 f"{r['train_seconds']:.1f} | {r['final_loss']:.3f} |")
  for name, r in results["normalizers"].items():
    head = "| T | evidence hit rate | answer accuracy | mean max weight | mean non-zero weights |"
    extra = "".join(f" {k}: hit / acc |" for k in kinds) if len(kinds) > 1 else ""
    lines += ["", f"**{name}** by inference temperature", "", head + extra,
              "|---" * (5 + (len(kinds) if extra else 0)) + "|"]
    for row in r["eval"]:
      cells = "".join(f" {row['by_kind'][k]['evidence_hit_rate']:.3f} / "
                      f"{row['by_kind'][k]['answer_accuracy']:.3f} |" if k in row["by_kind"]
                      else " - |" for k in kinds) if extra else ""
      lines.append(f"| {row['temperature']:g} | {row['evidence_hit_rate']:.3f} | "
                   f"{row['answer_accuracy']:.3f} | {row['mean_max_weight']:.3f} | "
                   f"{row['mean_nonzero_weights']:.2f} |" + cells)
  return "\n".join(lines) + "\n"


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
    one = min(rows, key=lambda x: abs(math.log(x["temperature"])))
    say(f"{name}: trained in {seconds:.1f}s; at T={one['temperature']:g} evidence hit rate "
        f"{one['evidence_hit_rate']:.3f}, answer accuracy {one['answer_accuracy']:.3f}", flush=True)
    results["normalizers"][name] = {"train_seconds": seconds, "final_loss": float(
        losses[-50:].mean()), "eval": rows}
    _save_params_atomic(os.path.join(workdir, params_file(name)), model)
    readers[name] = model.cfg.to_dict()
  _write_atomic(os.path.join(workdir, MODEL_FILE), json.dumps({
      "stories": dataclasses.asdict(sc), "vocab": vocab.words, "readers": readers,
      "samples": [_sample_record(ex) for ex in test_set[:cfg.num_samples]]}, indent=1))
  if page is not None:
    _write_atomic(os.path.join(workdir, PAGE_FILE), page)
  _write_atomic(os.path.join(workdir, TABLE_FILE), "# Reading focus\n\n" + results_table(results))
  _write_atomic(os.path.join(workdir, RESULTS_FILE), json.dumps(results, indent=1))
  return results


def _config_dict(cfg: FocusConfig) -> dict:
  d = dataclasses.asdict(cfg)
  d["normalizers"], d["temperatures"] = list(cfg.normalizers), list(cfg.temperatures)
  return d


# ----------------------------------------------------------------------------- serving

class BadRequest(DataError):
  """A query the page should show as a message (HTTP 400)."""


def _bucket(n: int, step: int = 8) -> int:
  """Pads word axes to a multiple of `step`, so typed stories reuse a few compiled shapes."""
  return max(step, -(-n // step) * step)


class FocusService:
  """Answers the page: trained readers by normalizer, the vocabulary and sample stories."""

  def __init__(self, story_config: stories.StoryConfig, vocab: stories.Vocab,
               models: dict[str, reader.Reader], samples: list[dict] = ()):
    if not models:
      raise ConfigError("a FocusService needs at least one trained reader")
    self.story_config, self.vocab, self.samples = story_config, vocab, list(samples)
    self.models = {name: nnx.split(m) for name, m in models.items()}
    self.configs = {name: m.cfg for name, m in models.items()}
    self.max_sentences = next(iter(models.values())).cfg.max_sentences
    self._lock = threading.Lock()  # one request at a time through jax (tiny model, many threads)

  @classmethod
  def from_workdir(cls, workdir: str) -> "FocusService":
    path = os.path.join(workdir, MODEL_FILE)
    if not os.path.exists(path):
      raise ConfigError(f"no trained reader in {workdir} ({MODEL_FILE} is missing): run "
                        f"without --serve_only first")
    with open(path) as f:
      saved = json.load(f)
    sc = stories.StoryConfig(**{k: tuple(v) if isinstance(v, list) else v
                                for k, v in saved["stories"].items()})
    vocab = stories.Vocab(saved["vocab"])
    if vocab.words != saved["vocab"]:
      raise ConfigError(f"{path}: the vocabulary does not round-trip")
    models = {}
    for name, rc in saved["readers"].items():
      p = os.path.join(workdir, params_file(name))
      if not os.path.exists(p):
        raise ConfigError(f"{p} is missing: retrain (run without --serve_only)")
      models[name] = reader.load_params(p, reader.ReaderConfig(**rc))
    return cls(sc, vocab, models, saved.get("samples", []))

  def info(self) -> dict:
    return {"normalizers": list(self.models), "score": next(iter(self.configs.values())).score,
            "max_sentences": self.max_sentences, "answers": list(self.story_config.places),
            "temperature_range": list(TEMPERATURE_RANGE), "samples": self.samples}

  def read(self, story: str, question: str, temperature=1.0, normalizer: str | None = None) -> dict:
    """One story (text: sentences per line or ended by . ! ?) and question -> sentences, their
    weights and raw scores, the answer, its probability, the top answers and unknown words.
    Raises BadRequest for what the user can fix."""
    normalizer = normalizer or next(iter(self.models))
    if normalizer not in self.models:
      raise BadRequest(f"normalizer {normalizer!r} was not trained here; trained: "
                       f"{', '.join(self.models)}")
    try:
      temperature = float(temperature)
    except (TypeError, ValueError):
      raise BadRequest(f"temperature must be a number, got {temperature!r}") from None
    lo, hi = TEMPERATURE_RANGE
    if not (math.isfinite(temperature) and lo <= temperature <= hi):
      raise BadRequest(f"temperature must lie in [{lo:g}, {hi:g}], got {temperature:g}")
    if not stories.tokenize(question or ""):
      raise BadRequest("the question is empty: type one, e.g. \"Where is Mary?\"")
    sentences = stories.split_sentences(story or "")
    if not sentences:
      raise BadRequest("the story is empty: pick a sample story or type sentences, one per line")
    if len(sentences) > self.max_sentences:
      raise BadRequest(f"the story has {len(sentences)} sentences; this reader was trained on "
                       f"stories of at most {self.max_sentences}")
    ids = [self.vocab.encode(s) for s in sentences]
    q_ids = self.vocab.encode(question)
    x, mask = stories.pad_stories([ids], self.max_sentences, _bucket(max(map(len, ids))))
    q = stories.pad_questions([q_ids], _bucket(len(q_ids)))
    with self._lock:
      out = reader.read(*self.models[normalizer], x, mask, q, temperature)
      log_probs, w, e = (np.asarray(a[0], np.float64) for a in out)
    n = len(sentences)
    probs = np.exp(log_probs)
    order = np.argsort(-probs)
    answers = self.story_config.places
    return {
        "sentences": sentences, "weights": w[:n].tolist(), "scores": e[:n].tolist(),
        "answer": answers[order[0]], "answer_prob": float(probs[order[0]]),
        "top_answers": [{"answer": answers[i], "prob": float(probs[i])} for i in order[:3]],
        "unknown_words": self.vocab.unknown(" ".join(sentences) + " " + question),
        "temperature": temperature, "normalizer": normalizer,
    }


def inline_page(web_dir: str, name: str = "focus") -> str:
  """<name>.html with its <name>.css and <name>.js inlined: one self-contained file."""
  def text(ext):
    with open(os.path.join(web_dir, f"{name}.{ext}")) as f:
      return f.read()
  page = text("html")
  css, js = text("css"), text("js")
  if "</script" in js.lower():
    raise ValueError(f"{name}.js must not contain '</script' (it is inlined)")
  page = re.sub(rf'<link rel="stylesheet" href="{name}\.css">', lambda _: f"<style>\n{css}</style>",
                page)
  page = re.sub(rf'<script src="{name}\.js"></script>', lambda _: f"<script>\n{js}</script>", page)
  return page


def make_server(service: FocusService, page: str, port: int = 0,
                host: str = "127.0.0.1") -> ThreadingHTTPServer:
  """An HTTP server (not yet serving): GET / -> the page, /api/info -> normalizers and sample
  stories, /api/read?story=&question=&temperature=&normalizer= -> FocusService.read as JSON;
  a BadRequest becomes HTTP 400 {"error": ...}. port 0 picks a free port (server.server_port)."""

  class Handler(BaseHTTPRequestHandler):

    def _send(self, status, body: bytes, content_type: str):
      self.send_response(status)
      self.send_header("Content-Type", content_type)
      self.send_header("Content-Length", str(len(body)))
      self.send_header("Cache-Control", "no-store")
      self.end_headers()
      self.wfile.write(body)

    def _json(self, status, obj):
      self._send(status, json.dumps(obj).encode(), "application/json")

    def do_GET(self):  # pylint: disable=invalid-name
      url = urlsplit(self.path)
      query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
      try:
        if url.path in ("/", "/index.html", "/" + PAGE_FILE):
          self._send(HTTPStatus.OK, page.encode(), "text/html; charset=utf-8")
        elif url.path == "/api/info":
          self._json(HTTPStatus.OK, service.info())
        elif url.path == "/api/read":
          self._json(HTTPStatus.OK, service.read(
              query.get("story", ""), query.get("question", ""),
              query.get("temperature", "1"), query.get("normalizer") or None))
        else:
          self._json(HTTPStatus.NOT_FOUND, {"error": f"no such page: {url.path}"})
      except BadRequest as e:
        self._json(HTTPStatus.BAD_REQUEST, {"error": str(e)})
      except Exception as e:  # pylint: disable=broad-except  (a bug: keep serving, log it)
        log.error("focus server: %s", traceback.format_exc())
        self._json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"server error: {e}"})

    def log_message(self, format, *args):  # pylint: disable=redefined-builtin
      del format, args  # quiet: the page polls on every slider move

  server = ThreadingHTTPServer((host, port), Handler)
  server.daemon_threads = True
  return server
