"""The run viewer's page: one self-contained HTML file of a finished run's outputs and attention.

    data = page_data("workdirs/m30k", compare="workdirs/m30k_none")   # JSON-ready dict
    html = render(data, assets_dir)                                  # str, no network needed
    write_page("workdirs/m30k", assets_dir)                          # -> workdirs/m30k/inspect.html

Reads a run's workdir (what attn.training.evaluation writes):
- results.json: the run-level scores and the model config;
- attention.npz: example_ids [N], sources [N], predictions [N], references [N] (optional), and per
  example `weights_{id}` [Tt, Ts] or [L, H, Tt, Ts], `scores_{id}` (same shape, the raw scores
  before temperature and normalizer, -inf where not attendable; optional), `src_tokens_{id}` [Ts]
  and `tgt_tokens_{id}` [Tt] (optional: old runs get whitespace tokens or positions); scalars
  normalizer, temperature, decoder, score, scope (optional: else results.json's); for a run on
  images (the captioning task), `image_{id}` [H, W] uint8 and `regions_{id}` [Ts, 4] (top, left,
  height, width in pixels of the region under each attention column): the page draws the image
  with the current step's weights over its regions.
predictions.txt is not needed: attention.npz holds the outputs of the examples it samples.

The page (assets in experiments/web/: template, normalizers.js, inspect.js, inspect.css) inlines its
scripts, style and data: opened from file:// it needs nothing else. Masked scores travel as JSON
null (JSON has no -Infinity). Every weight array is stored 4-D [L, H, Tt, Ts] in the data; `multi`
says whether the run's own arrays were 4-D (then the page offers layer and head selectors).
"""

from __future__ import annotations

import dataclasses
import http.server
import json
import math
import os
import re
import zipfile

import numpy as np

from attn.common import applications, files
from attn.config.configurable import option
from attn.errors import ConfigError, DataError
from attn.inspection import outputs

RESULTS, ATTENTION = "results.json", "attention.npz"
PAGE = "inspect.html"
TEMPLATE = "inspect.html.tmpl"
ASSETS = ("normalizers.js", "inspect.js", "inspect.css")
NORMALIZERS = ("softmax", "sparsemax", "entmax15")  # what experiments/web/normalizers.js implements
CONSISTENCY_TOL = 1e-4  # stored weights vs normalizer(scores / temperature), max abs difference
RUN_METRICS = ("bleu", "chrf", "exact_match")  # run-level figures the page shows when present


@dataclasses.dataclass(frozen=True)
class ViewerSettings:
  """The run viewer's page (`python -m experiments.inspect`)."""
  workdir: str | None = option(None, "A finished run's directory (results.json, attention.npz).")
  compare: str | None = option(None, "Another run on the same data, shown side by side.")
  out: str | None = option(None, "Where the page goes: a file, or a directory to hold "
                           "inspect.html (default WORKDIR/inspect.html).")
  port: int | None = option(None, "Serve the page's directory on 127.0.0.1:PORT until Ctrl-C "
                            "(0: a free port).")

  def __post_init__(self):
    if self.port is not None and not 0 <= self.port <= 65535:
      raise ConfigError(f"--port must be in 0..65535, got {self.port}")


def _missing(workdir, name):
  """The error for a run without `name`: rerun the experiment that trained it (its records say
  which) to finish it."""
  from attn.launching import entry_points  # pylint: disable=import-outside-toplevel
  other = applications.not_a_run_of(workdir, "the run viewer")
  if other:
    return DataError(other)
  experiment = entry_points.experiment_of(workdir)
  if experiment is None:
    rerun = "the experiment that trained it (" + " or ".join(
        f"`python -m {e.module}`" for _, e in entry_points.EXPERIMENTS.items()) + (
            f") with --workdir={workdir} and the run's config")
  else:
    rerun = (f"`python -m {entry_points.experiment(experiment).module} --workdir={workdir} "
             "--config=...` with the run's config")
  return DataError(f"{workdir}: no {name} (the run has not finished evaluating): run {rerun} "
                   "to finish it")


def _scalar(npz, key, default):
  """A 0-d entry of the npz's arrays as a Python value, else `default`."""
  if key not in npz:
    return default
  value = npz[key]
  return value.item() if value.ndim == 0 else default


def _labels(npz, key, fallback_text, n, where):
  """One label per row/column: the stored tokens, else the text's words (+ EOS) when they fit,
  else positions."""
  if key in npz:
    labels = [str(t) for t in npz[key].tolist()]
    if len(labels) != n:
      raise DataError(f"{where}: {key} has {len(labels)} labels for {n} attention positions")
    return labels
  words = str(fallback_text).split()
  if len(words) + 1 == n:
    return words + ["</s>"]
  return [str(i) for i in range(n)]


def _compact(x: np.ndarray):
  """Nested lists of float32 values with 8 significant digits (exact to ~1e-8 relative; the
  float64 reprs would triple the page), non-finite entries as None (JSON null)."""
  flat = [float(f"{v:.8g}") if math.isfinite(v) else None for v in x.astype(np.float64).ravel()]
  arr = np.empty(len(flat), dtype=object)
  arr[:] = flat
  return arr.reshape(x.shape).tolist()


def _as_4d(x):
  return x if x.ndim == 4 else x[None, None]


def renormalize(scores, normalizer, temperature):
  """normalizer(scores / temperature) over the finite entries (masked -> 0), via attn's own
  normalizers: the relation the stored weights must satisfy for the page's slider to be honest.
  scores: [..., Tt, Ts]; returns float32 of the same shape."""
  from attn import core  # pylint: disable=import-outside-toplevel  (jax: only when scores exist)
  finite = np.isfinite(scores)
  return np.asarray(core.normalize(np.where(finite, scores, 0.0).astype(np.float32), finite,
                                   kind=normalizer, temperature=float(temperature)))


def _worst_mismatch(examples, normalizer, temperature) -> float:
  """max |normalizer(scores / temperature) - weights| over the examples, in one call on the
  examples padded to a common shape (masked padding changes no row; one shape compiles once)."""
  shape = tuple(max(e["scores"].shape[a] for e in examples) for a in range(4))
  scores = np.full((len(examples),) + shape, -np.inf, np.float32)
  for n, e in enumerate(examples):
    scores[(n,) + tuple(slice(0, d) for d in e["scores"].shape)] = e["scores"]
  again = renormalize(scores, normalizer, temperature)
  return max(float(np.max(np.abs(again[(n,) + tuple(slice(0, d) for d in e["weights"].shape)]
                                 - e["weights"]), initial=0.0)) for n, e in enumerate(examples))


@dataclasses.dataclass
class ViewedRun:
  """A finished run as the page shows it: run-level facts and one record per sampled example."""
  workdir: str
  results: dict
  normalizer: str
  temperature: float
  decoder: str
  score: str
  scope: str
  examples: dict  # example_id -> dict (see load_run)
  multi: bool  # weights were [L, H, Tt, Ts]
  has_attention: bool  # some weight is nonzero
  has_scores: bool  # every example has scores_{id}
  scores_note: str  # why the slider is off ("" when it is on)

  @property
  def name(self) -> str:
    return os.path.basename(os.path.normpath(self.workdir))


def check_files(workdir):
  """DataError unless `workdir` holds the files the page reads (cheap: run before any loading)."""
  if not os.path.isdir(workdir):
    raise DataError(f"{workdir}: no such run directory")
  for name in (RESULTS, ATTENTION):
    if not os.path.exists(os.path.join(workdir, name)):
      raise _missing(workdir, name)


def _read_files(workdir):
  check_files(workdir)
  path = os.path.join(workdir, RESULTS)
  try:
    with open(path) as f:
      results = json.load(f)
  except (OSError, ValueError) as e:
    raise DataError(f"{path}: cannot be read ({e})") from e
  if not isinstance(results, dict):
    raise DataError(f"{path}: expected a JSON object, got {type(results).__name__}")
  path = os.path.join(workdir, ATTENTION)
  try:
    with np.load(path, allow_pickle=False) as npz:
      arrays = {k: npz[k] for k in npz}
  except (OSError, ValueError, zipfile.BadZipFile) as e:
    raise DataError(f"{path}: cannot be read ({e})") from e
  return results, arrays


def load_run(workdir) -> ViewedRun:
  """Reads results.json and attention.npz (see the module docstring); raises DataError naming the
  file for anything missing or inconsistent."""
  results, npz = _read_files(workdir)
  where = os.path.join(workdir, ATTENTION)
  for key in ("example_ids", "sources", "predictions"):
    if key not in npz:
      raise DataError(f"{where}: no {key} array (written by an older evaluation?)")
  ids = [int(i) for i in npz["example_ids"].tolist()]
  sources = [str(s) for s in npz["sources"].tolist()]
  preds = [str(s) for s in npz["predictions"].tolist()]
  refs = [str(s) for s in npz["references"].tolist()] if "references" in npz else None
  if not ids:
    raise DataError(f"{where}: no examples (attention_samples was 0?)")
  if any(len(x) != len(ids) for x in (sources, preds) + ((refs,) if refs is not None else ())):
    raise DataError(f"{where}: example_ids, sources, predictions and references differ in length")
  mc = results.get("model_config") or {}
  normalizer = str(_scalar(npz, "normalizer", results.get("normalizer", mc.get("normalizer", ""))))
  # float32 in the npz: its shortest repr (0.7, not 0.699999988) is the config's value
  temperature = float(str(np.float32(_scalar(npz, "temperature", mc.get("temperature", 1.0)))))
  if not temperature > 0:
    raise DataError(f"{where}: temperature {temperature} is not positive")
  examples, multi, nonzero, with_scores = {}, None, False, 0
  for n, i in enumerate(ids):
    key = f"weights_{i}"
    if key not in npz:
      raise DataError(f"{where}: no {key} for example {i}")
    w = np.asarray(npz[key], np.float32)
    if w.ndim not in (2, 4) or (multi is not None and multi != (w.ndim == 4)):
      raise DataError(f"{where}: {key} has shape {w.shape}; expected every example "
                      "[Tt, Ts] or every example [L, H, Tt, Ts]")
    if not np.isfinite(w).all():
      raise DataError(f"{where}: {key} has non-finite weights")
    multi = w.ndim == 4
    nonzero = nonzero or bool(np.any(w != 0))
    s = npz[f"scores_{i}"].astype(np.float32) if f"scores_{i}" in npz else None
    if s is not None and s.shape != w.shape:
      raise DataError(f"{where}: scores_{i} {s.shape} and {key} {w.shape} differ in shape")
    with_scores += s is not None
    Tt, Ts = w.shape[-2:]
    examples[i] = {
        "id": i, "source": sources[n], "prediction": preds[n],
        "reference": refs[n] if refs is not None else None,
        "src_tokens": _labels(npz, f"src_tokens_{i}", sources[n], Ts, where),
        "tgt_tokens": _labels(npz, f"tgt_tokens_{i}", preds[n], Tt, where),
        "weights": _as_4d(w), "scores": None if s is None else _as_4d(s),
        "image": _image(npz, i, Ts, where)}
  has_scores = with_scores == len(ids)
  note = ""
  if not nonzero:
    note = "this model has no attention"
  elif not has_scores:
    note = ("this run stored no raw attention scores (a fused kernel or linear attention never "
            "forms them; a scope that reweights after normalizing, such as local-p, has weights "
            "that are not normalizer(scores / T)): the slider is off and the page shows the "
            "stored weights")
  elif normalizer not in NORMALIZERS:
    note = f"the page cannot renormalize with normalizer {normalizer!r}: the slider is off"
  else:
    worst = _worst_mismatch(list(examples.values()), normalizer, temperature)
    if worst > CONSISTENCY_TOL:
      # e.g. a scope that reweights after normalizing (local-p's Gaussian): the scores alone do
      # not determine the weights, so another temperature would show something the model never does.
      note = (f"the stored weights are not {normalizer}(scores / temperature) (off by up to "
              f"{worst:.2g}; a scope that reweights after normalizing?): the slider is off")
  rnn = mc.get("rnn", mc)  # the recurrent model's section (flat in records of older runs)
  return ViewedRun(
      workdir=workdir, results=results, normalizer=normalizer, temperature=temperature,
      decoder=str(_scalar(npz, "decoder", results.get("decoder", rnn.get("decoder", "")))),
      score=str(_scalar(npz, "score", results.get("score", rnn.get("score", "")))),
      scope=str(_scalar(npz, "scope", rnn.get("scope", ""))),
      examples=examples, multi=bool(multi), has_attention=nonzero,
      has_scores=has_scores and not note, scores_note=note)


def _image(npz, i, Ts, where):
  """{"pixels": [H][W] ints 0-255, "regions": [Ts][4]} of example i, or None when the run stored
  no image; DataError when its regions do not match the attention's columns or leave the image."""
  if f"image_{i}" not in npz:
    return None
  img = np.asarray(npz[f"image_{i}"])
  boxes = np.asarray(npz[f"regions_{i}"]) if f"regions_{i}" in npz else None
  if img.ndim != 2 or boxes is None or boxes.shape != (Ts, 4):
    raise DataError(f"{where}: image_{i} needs a 2-D image and regions_{i} of shape ({Ts}, 4), "
                    f"one box per attention column; got {img.shape} and "
                    f"{None if boxes is None else boxes.shape}")
  H, W = img.shape
  top, left, h, w = boxes.T
  if (top < 0).any() or (left < 0).any() or (top + h > H).any() or (left + w > W).any():
    raise DataError(f"{where}: regions_{i} has a box outside the {H}x{W} image_{i}")
  return {"pixels": np.clip(img, 0, 255).astype(int).tolist(), "regions": boxes.astype(int).tolist()}


def example_scores(prediction, reference) -> dict:
  """Sentence BLEU (sacreBLEU, [0, 100]) and exact match of one output; empty without reference."""
  if reference is None:
    return {}
  import sacrebleu  # pylint: disable=import-outside-toplevel  (slow import, only with references)
  return {"sentence_bleu": float(sacrebleu.sentence_bleu(prediction, [reference]).score),
          "exact_match": prediction == reference}


def _run_summary(run: ViewedRun) -> dict:
  res = run.results
  return {"name": run.name, "workdir": os.path.abspath(run.workdir), "split": res.get("split"),
          "decoder": run.decoder, "score": run.score, "normalizer": run.normalizer,
          "scope": run.scope, "temperature": run.temperature,
          "metrics": {k: res[k] for k in RUN_METRICS
                      if isinstance(res.get(k), (int, float)) and math.isfinite(res[k])},
          "has_attention": run.has_attention, "has_scores": run.has_scores,
          "note": run.scores_note, "multi": run.multi}


def join_runs(run: ViewedRun, other: ViewedRun) -> list[int]:
  """The example ids both runs sampled; DataError when a shared id has different sources."""
  shared = sorted(set(run.examples) & set(other.examples))
  for i in shared:
    if run.examples[i]["source"] != other.examples[i]["source"]:
      raise DataError(
          f"{run.workdir} and {other.workdir} are not on the same data: example {i} has source "
          f"{run.examples[i]['source']!r} in one and {other.examples[i]['source']!r} in the other")
  if not shared:
    raise DataError(f"{run.workdir} and {other.workdir} are not on the same data: their "
                    f"{ATTENTION} files share no example id")
  return shared


def page_data(workdir, compare=None) -> dict:
  """The JSON-ready dict the page renders: {"run", "compare" (or None), "examples": [...]}, each
  example with id, source, reference, prediction, tokens, weights [L][H][Tt][Ts], scores (same,
  null where masked; None without scores), its own scores and, with `compare`, the other run's
  output and scores."""
  for w in (workdir, compare) if compare is not None else (workdir,):
    check_files(w)
  run = load_run(workdir)
  other = load_run(compare) if compare is not None else None
  shared = set(join_runs(run, other)) if other is not None else set()
  examples = []
  for i in sorted(run.examples):
    e = run.examples[i]
    item = {k: e[k] for k in ("id", "source", "reference", "prediction", "src_tokens",
                              "tgt_tokens", "image")}
    item["weights"] = _compact(e["weights"])
    item["scores"] = _compact(e["scores"]) if run.has_scores else None
    item.update(example_scores(e["prediction"], e["reference"]))
    if other is not None:
      item["compare"] = None
      if i in shared:
        o = other.examples[i]
        reference = e["reference"] if e["reference"] is not None else o["reference"]
        item["compare"] = {"prediction": o["prediction"],
                           **example_scores(o["prediction"], reference)}
        if item.get("reference") is None and reference is not None:
          item["reference"] = reference
          item.update(example_scores(e["prediction"], reference))
    examples.append(item)
  return {"run": _run_summary(run), "compare": _run_summary(other) if other else None,
          "examples": examples}


def _script_safe(text: str) -> str:
  """JSON that cannot end its <script> element early (`</script>`, `<!--`)."""
  return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render(data: dict, assets_dir) -> str:
  """The page's HTML: the template with the CSS, the scripts and the data inlined."""
  def read(name):
    with open(os.path.join(assets_dir, name), encoding="utf-8") as f:
      return f.read()

  parts = {"CSS": read("inspect.css"), "NORMALIZERS_JS": read("normalizers.js"),
           "INSPECT_JS": read("inspect.js"),
           "DATA": _script_safe(json.dumps(data, allow_nan=False, separators=(",", ":"))),
           "TITLE": _html_escape(f"attention: {data['run']['name']}")}
  for name in ("NORMALIZERS_JS", "INSPECT_JS"):
    if "</script" in parts[name].lower():
      raise ValueError(f"{name} contains '</script', which would end its inline <script> early")
  # One pass, so nothing inlined is itself searched for placeholders.
  return re.sub(r"\{\{(\w+)\}\}", lambda m: parts[m.group(1)], read(TEMPLATE))


def _html_escape(text: str) -> str:
  return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
          .replace('"', "&quot;"))


def page_path(workdir, out=None) -> str:
  """Where the page goes: `out` (a file, or a directory to hold inspect.html), else
  `workdir/inspect.html`; ConfigError (one line, `outputs.output_dir`) when that directory cannot
  be written to."""
  if out is None:
    return os.path.join(outputs.output_dir(None, workdir, PAGE), PAGE)
  given = out
  if os.path.isdir(out):
    out = os.path.join(out, PAGE)
  outputs.output_dir(os.path.dirname(os.path.abspath(out)), workdir, PAGE, flag=given)
  return out


def write_page(workdir, assets_dir, *, compare=None, out=None) -> str:
  """Writes the page (see `page_path`) atomically, having checked that it can before reading
  the runs; returns its path."""
  out = page_path(workdir, out)
  html = render(page_data(workdir, compare), assets_dir)
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  files.write_text(out, html)
  return out


def make_server(directory, port) -> http.server.ThreadingHTTPServer:
  """An HTTP server for `directory` on 127.0.0.1:`port` (0 picks a free port; see
  `server.server_address`); the caller runs `serve_forever()`."""
  class Handler(http.server.SimpleHTTPRequestHandler):
    def __init__(self, *args, **kw):
      super().__init__(*args, directory=directory, **kw)

    def log_message(self, format, *args):  # pylint: disable=redefined-builtin
      pass  # one line per request would bury the URL

  return http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
