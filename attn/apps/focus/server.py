"""The reading-focus demo's page and API: trained readers (attn.apps.focus.sweep) answer the
page's queries over HTTP.

    service = FocusService.from_workdir("workdirs/focus")
    make_server(service, inline_page(web_dir), port=8000).serve_forever()

GET / is the page, /api/info the normalizers and sample stories, /api/read one story and question
read at a temperature (`FocusService.read`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import re
import threading
import traceback
import zipfile
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import numpy as np
from flax import nnx

from attn.common import applications
from attn.config.configurable import option
from attn.errors import ConfigError, DataError
from attn.data import stories
from attn.apps.focus.sweep import MODEL_FILE, PAGE_FILE, TEMPERATURE_RANGE, params_file
from attn.models import reader
from attn.training import workdir as workdir_lib

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class FocusServing:
  """Where the demo's files go and whether its page is served (`python -m experiments.focus`)."""
  workdir: str = option("workdirs/focus", "Where results, parameters and the page go.")
  port: int = option(0, "Serve the page on 127.0.0.1:PORT after training (0: don't).")
  serve_only: bool = option(False, "Serve the reader saved in --workdir without training.")

  def __post_init__(self):
    if not 0 <= self.port <= 65535:
      raise ConfigError(f"--port must be in 0..65535, got {self.port}")
    if self.serve_only and self.port == 0:
      raise ConfigError("--serve_only needs --port (a port to serve on)")


class BadRequest(DataError):
  """A query the page should show as a message (HTTP 400)."""


RETRAIN = "rerun without --serve_only to retrain, or use another --workdir"


def check_application(workdir: str, application: str) -> None:
  """ConfigError when `workdir` holds a run of another application than `application` (its
  application.json, or for older runs what its results name): its files are not this page's."""
  held = workdir_lib.recorded_application(workdir) if os.path.isdir(workdir) else None
  if held is not None and held != application:
    module = applications.app(held).module if held in applications.registry() else None
    raise ConfigError(f"workdir {workdir} holds a {held} run, not a {application} one: "
                      + (f"serve or inspect it with python -m {module}, or give " if module
                         else "give ") + f"--serve_only a {application} workdir")


# What reading a damaged or foreign saved file raises: a model.json that is not JSON or lacks
# (or mistypes) a field; a truncated or overwritten .npz (np.load).
JSON_ERRORS = (OSError, ValueError, KeyError, TypeError, AttributeError)
NPZ_ERRORS = (OSError, EOFError, ValueError, zipfile.BadZipFile)


@contextlib.contextmanager
def damaged_file(path: str, errors=JSON_ERRORS):
  """Turns `errors` raised while the saved file `path` is read into one ConfigError naming it
  and what to do (the parsing code's own bugs, other exceptions, keep their traceback)."""
  try:
    yield
  except errors as e:
    detail = (f"no field {e}" if isinstance(e, KeyError)
              else f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'no detail'}")
    raise ConfigError(f"{path} is damaged or not this application's ({detail}): "
                      f"{RETRAIN}") from None


def read_saved_json(path: str) -> dict:
  """The JSON object in `path`; a ConfigError naming the file when it is not one."""
  with damaged_file(path):
    with open(path, encoding="utf-8") as f:
      saved = json.load(f)
    if not isinstance(saved, dict):
      raise TypeError(f"a JSON {type(saved).__name__}, not an object")
  return saved


def bucket(n: int, step: int = 8) -> int:
  """Pads word axes to a multiple of `step`, so typed stories reuse a few compiled shapes."""
  return max(step, -(-n // step) * step)


def check_query(temperature, question: str | None, example: str) -> float:
  """The temperature as a float in TEMPERATURE_RANGE, and a question with at least one word;
  BadRequest naming what is wrong (`example`: a question to suggest) otherwise."""
  try:
    temperature = float(temperature)
  except (TypeError, ValueError):
    raise BadRequest(f"temperature must be a number, got {temperature!r}") from None
  lo, hi = TEMPERATURE_RANGE
  if not (math.isfinite(temperature) and lo <= temperature <= hi):
    raise BadRequest(f"temperature must lie in [{lo:g}, {hi:g}], got {temperature:g}")
  if not stories.tokenize(question or ""):
    raise BadRequest(f"the question is empty: type one, e.g. \"{example}\"")
  return temperature


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
    """The readers saved in `workdir` (attn.apps.focus.sweep). One ConfigError line when the
    workdir holds another application's run, no trained reader, or a damaged model.json or
    reader_<normalizer>.npz."""
    check_application(workdir, "focus")
    path = os.path.join(workdir, MODEL_FILE)
    if not os.path.exists(path):
      raise ConfigError(f"no trained reader in {workdir} ({MODEL_FILE} is missing): run "
                        f"without --serve_only first")
    saved = read_saved_json(path)
    with damaged_file(path):
      sc = stories.StoryConfig(**{k: tuple(v) if isinstance(v, list) else v
                                  for k, v in saved["stories"].items()})
      vocab = stories.Vocab(saved["vocab"])
      configs = {name: reader.ReaderConfig(**rc) for name, rc in saved["readers"].items()}
      samples = list(saved.get("samples", []))
    if vocab.words != saved["vocab"]:
      raise ConfigError(f"{path}: the vocabulary does not round-trip: {RETRAIN}")
    models = {}
    for name, rc in configs.items():
      p = os.path.join(workdir, params_file(name))
      if not os.path.exists(p):
        raise ConfigError(f"{p} is missing: {RETRAIN}")
      with damaged_file(p, NPZ_ERRORS):
        models[name] = reader.load_params(p, rc)
    if not models:
      raise ConfigError(f"{path} lists no trained reader: {RETRAIN}")
    return cls(sc, vocab, models, samples)

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
    temperature = check_query(temperature, question, example="Where is Mary?")
    sentences = stories.split_sentences(story or "")
    if not sentences:
      raise BadRequest("the story is empty: pick a sample story or type sentences, one per line")
    if len(sentences) > self.max_sentences:
      raise BadRequest(f"the story has {len(sentences)} sentences; this reader was trained on "
                       f"stories of at most {self.max_sentences}")
    ids = [self.vocab.encode(s) for s in sentences]
    q_ids = self.vocab.encode(question)
    x, mask = stories.pad_stories([ids], self.max_sentences, bucket(max(map(len, ids))))
    q = stories.pad_questions([q_ids], bucket(len(q_ids)))
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
