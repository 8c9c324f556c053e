"""The retrieval experiment on the reading-focus page: a trained retriever + reader
(attn.apps.retrieve.sweep) answers the page's queries with both stages' weights.

    from attn.apps.focus import server as focus_server
    service = RetrieveService.from_workdir("workdirs/retrieve")
    focus_server.make_server(service, focus_server.inline_page(web_dir), port=8000)

The page's story box holds a pool: passages (stories) separated by blank lines. `read` returns what
the focus page shows for any reader (sentences = the retrieved sentences, weights = the reader's
last hop, p(z|q) times its weight inside passage z, so they sum to 1 over everything read) plus
`stages`, the weights before it: the retrieval weights over every passage of the pool (0 outside
the top k) and the reader's earlier hops.
"""

from __future__ import annotations

import dataclasses
import os
import re
import threading

import jax
import numpy as np
from flax import nnx

from attn.config.configurable import option
from attn.errors import ConfigError
from attn.data import stories
from attn.apps.focus.sweep import TEMPERATURE_RANGE
from attn.apps.focus.server import (NPZ_ERRORS, BadRequest, bucket, check_application,
                                    check_query, damaged_file, read_saved_json)
from attn.apps.retrieve.sweep import MODEL_FILE, SERVED_PARAMS
from attn.models import reader
from attn.apps.retrieve import model as retriever

TITLE = "Retrieval, then read"
DESCRIPTION = (
    "The story box holds a pool of stories separated by blank lines. A retriever scores every "
    "story against the question (dot product) and keeps the top k; a two-hop reader then attends "
    "over the retrieved sentences. Both stages' weights are shown; the slider sets the "
    "temperature of both.")


@dataclasses.dataclass(frozen=True)
class RetrieveServing:
  """Where the experiment's files go and whether its page is served."""
  workdir: str = option("workdirs/retrieve", "Where results, parameters and the page go.")
  port: int = option(0, "Serve the page on 127.0.0.1:PORT after training (0: don't).")
  serve_only: bool = option(False, "Use the model saved in --workdir without training (serve "
                            "it with --port, diagnose it with --diagnose).")
  diagnose: bool = option(False, "Counterfactual diagnosis of the served model's retrieval and "
                          "hop weights (--interventions): writes diagnose.json and diagnose.md.")

  def __post_init__(self):
    if not 0 <= self.port <= 65535:
      raise ConfigError(f"--port must be in 0..65535, got {self.port}")
    if self.serve_only and self.port == 0 and not self.diagnose:
      raise ConfigError("--serve_only needs --port (a port to serve on) or --diagnose")


def split_passages(text: str) -> list[list[str]]:
  """A pool's text -> sentences per passage; passages are separated by blank lines."""
  return [s for s in (stories.split_sentences(p) for p in re.split(r"\n\s*\n", text or "")) if s]


class RetrieveService:
  """Answers the focus page's /api/info and /api/read for one trained retriever + reader."""

  def __init__(self, story_config: stories.StoryConfig, vocab: stories.Vocab,
               model: retriever.RetrieveReader, samples=()):
    self.story_config, self.vocab, self.samples = story_config, vocab, list(samples)
    self.model, self.cfg = nnx.split(model), model.cfg
    self._lock = threading.Lock()

  @classmethod
  def from_workdir(cls, workdir: str) -> "RetrieveService":
    """The model saved in `workdir` (attn.apps.retrieve.sweep). One ConfigError line when the
    workdir holds another application's run, no trained model, or a damaged model.json or
    retriever.npz."""
    check_application(workdir, "retrieve")
    path = os.path.join(workdir, MODEL_FILE)
    params = os.path.join(workdir, SERVED_PARAMS)
    if not (os.path.exists(path) and os.path.exists(params)):
      raise ConfigError(f"no trained retriever in {workdir} ({MODEL_FILE} or {SERVED_PARAMS} is "
                        f"missing): run without --serve_only first")
    saved = read_saved_json(path)
    with damaged_file(path):
      sc = stories.StoryConfig(**{k: tuple(v) if isinstance(v, list) else v
                                  for k, v in saved["stories"].items()})
      vocab = stories.Vocab(saved["vocab"])
      mc = retriever.RetrieverConfig(**saved["model"])
      samples = list(saved.get("samples", []))
    with damaged_file(params, NPZ_ERRORS):
      model = reader.restore_params(params, retriever.build(mc))
    return cls(sc, vocab, model, samples)

  def info(self) -> dict:
    return {"normalizers": ["softmax"], "score": "dot", "title": TITLE,
            "description": DESCRIPTION, "max_sentences": self.cfg.max_sentences,
            "answers": list(self.story_config.places),
            "temperature_range": list(TEMPERATURE_RANGE), "samples": self.samples}

  def _check(self, story, question, temperature) -> tuple[list[list[str]], float]:
    temperature = check_query(temperature, question, example="Where is the apple?")
    passages = split_passages(story)
    if not passages:
      raise BadRequest("the pool is empty: pick a sample pool or type stories separated by "
                       "blank lines")
    longest = max(map(len, passages))
    if longest > self.cfg.max_sentences:
      raise BadRequest(f"a story has {longest} sentences; this reader was trained on stories of "
                       f"at most {self.cfg.max_sentences}")
    return passages, temperature

  def read(self, story: str, question: str, temperature=1.0, normalizer: str | None = None) -> dict:
    """A pool (stories separated by blank lines) and a question -> the focus page's reply with
    `stages`. Raises BadRequest for what the user can fix."""
    del normalizer  # one model: the page's normalizer choice has a single entry
    passages, temperature = self._check(story, question, temperature)
    ids = [[self.vocab.encode(s) for s in p] for p in passages]
    q_ids = self.vocab.encode(question)
    S = self.cfg.max_sentences
    x, mask = stories.pad_stories(ids, S, bucket(max(len(s) for p in ids for s in p)))
    q = stories.pad_questions([q_ids], bucket(len(q_ids)))
    with self._lock:
      out = retriever.apply(*self.model, x[None], mask[None], q,
                             jax.random.PRNGKey(0), temperature)
    out = retriever.RetrieveOut(*(np.asarray(a[0], np.float64) for a in out))
    retrieved = out.retrieved.astype(int)  # [Z]
    pz = out.passage_weights[retrieved]  # [Z]
    read_sentences, hops = [], [[] for _ in range(self.cfg.hops)]
    for z, p in enumerate(retrieved):
      read_sentences += [f"[story {p + 1}] {s}" for s in passages[p]]
      for h in range(self.cfg.hops):
        hops[h] += (pz[z] * out.sentence_weights[z, h, :len(passages[p])]).tolist()
    probs = np.exp(out.log_probs)
    order = np.argsort(-probs)
    answers = self.story_config.places
    stages = [{"name": "passages", "title": f"Retrieval: weight of each story (top {len(pz)} "
               f"kept, the rest 0); raw dot-product score on hover",
               "items": [{"text": " ".join(p), "weight": float(w), "score": float(e)}
                         for p, w, e in zip(passages, out.passage_weights, out.passage_scores)]}]
    stages += [{"name": f"hop{h + 1}", "title": f"Reader hop {h + 1} over the retrieved sentences",
                "items": [{"text": s, "weight": w} for s, w in zip(read_sentences, hops[h])]}
               for h in range(self.cfg.hops - 1)]
    return {
        "sentences": read_sentences, "weights": hops[-1],
        "sentences_title": f"Reader hop {self.cfg.hops} (the answer's) over the retrieved "
                           f"sentences",
        "stages": stages, "answer": answers[order[0]], "answer_prob": float(probs[order[0]]),
        "top_answers": [{"answer": answers[i], "prob": float(probs[i])} for i in order[:3]],
        "unknown_words": self.vocab.unknown(story + " " + question),
        "temperature": temperature, "normalizer": "softmax",
    }
