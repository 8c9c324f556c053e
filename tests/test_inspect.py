"""The run viewer's data and page (attn/inspection/viewer.py, experiments/inspect.py) without a
browser: reading a workdir, the errors for missing and mismatched files, and a self-contained
page; experiments.screenshot's errors. tests/test_inspect_page.py drives the page itself in
Chromium on the same synthetic runs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import urllib.request

import numpy as np
import pytest

from attn import core
from attn.inspection import viewer as inspect_page
from attn.errors import ConfigError, DataError
from attn.inspection import screenshot

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WEB_DIR = os.path.join(REPO, "experiments", "web")
WORDS = ("the", "cat", "sat", "on", "a", "mat", "dog", "ran", "far", "away", "red", "blue")


def write_run(workdir, *, ids=(3, 5, 8, 13), normalizer="softmax", temperature=0.7,
              layers_heads=None, scores=True, references=True, tokens=True, scalars=True,
              no_attention=False, seed=0, sources=None, predictions=None, decoder="bahdanau"):
  """A synthetic finished run in `workdir` (results.json, predictions.txt, attention.npz) with
  random scores (some masked, one fully masked row) and weights = attn.core.normalize(scores / T).

  layers_heads: (L, H) for [L, H, Tt, Ts] arrays, else [Tt, Ts]. Returns what was written:
  {"ids", "sources", "predictions", "references", "weights": {id: array}, "scores": {id: array}}.
  """
  rng = np.random.default_rng(seed)
  os.makedirs(workdir, exist_ok=True)
  lead = tuple(layers_heads) if layers_heads else ()
  out = {"ids": list(ids), "sources": [], "predictions": [], "references": [], "weights": {},
         "scores": {}}
  for n in range(len(ids)):  # sizes differ between examples and from each other
    src = sources[n] if sources else " ".join(rng.choice(WORDS, 3 + (2 * n) % 5))
    pred = predictions[n] if predictions else " ".join(rng.choice(WORDS, 2 + n % 4))
    out["sources"].append(src)
    out["predictions"].append(pred)
    out["references"].append(pred if n % 2 == 0 else " ".join(rng.choice(WORDS, 2 + n % 4)))
  sizes = [(len(p.split()) + 1, len(s.split()) + 1)
           for p, s in zip(out["predictions"], out["sources"])]  # (Tt, Ts) with EOS
  # All examples padded to one shape [N, *lead, Tt, Ts]: one normalize call (one compilation).
  Tt_max, Ts_max = max(t for t, _ in sizes), max(s for _, s in sizes)
  e = rng.normal(scale=2.0, size=(len(ids),) + lead + (Tt_max, Ts_max)).astype(np.float32)
  e[..., 0, 1] = e[..., 0, 0]  # a tie
  mask = rng.random(e.shape) > 0.2
  mask[..., 0] = True  # every row keeps a valid column...
  for n, (Tt, Ts) in enumerate(sizes):
    mask[n, ..., Ts:] = False
    if n == 1:
      mask[n, ..., Tt - 1, :] = False  # ...but example 1's last row is fully masked
  e = np.where(mask, e, -np.inf).astype(np.float32)
  w = np.asarray(core.normalize(np.where(mask, e, 0.0), mask, kind=normalizer,
                                temperature=temperature))
  arrays = {}
  for n, (i, (Tt, Ts)) in enumerate(zip(ids, sizes)):
    weights = w[n, ..., :Tt, :Ts]
    arrays[f"weights_{i}"] = np.zeros_like(weights) if no_attention else weights
    if scores and not no_attention:
      arrays[f"scores_{i}"] = e[n, ..., :Tt, :Ts]
    if tokens:
      arrays[f"src_tokens_{i}"] = np.array(out["sources"][n].split() + ["</s>"])
      arrays[f"tgt_tokens_{i}"] = np.array(out["predictions"][n].split() + ["</s>"])
    out["weights"][i] = arrays[f"weights_{i}"]
    out["scores"][i] = e[n, ..., :Tt, :Ts]
  arrays.update(example_ids=np.array(ids), sources=np.array(out["sources"]),
                predictions=np.array(out["predictions"]))
  if references:
    arrays["references"] = np.array(out["references"])
  if scalars:
    arrays.update(normalizer=np.array(normalizer), temperature=np.array(temperature, np.float32),
                  decoder=np.array(decoder), score=np.array("additive"), scope=np.array("global"))
  np.savez_compressed(os.path.join(workdir, "attention.npz"), **arrays)
  with open(os.path.join(workdir, "predictions.txt"), "w") as f:
    f.write("".join(p + "\n" for p in out["predictions"]))
  results = {"split": "test", "decoder": decoder, "score": "additive", "normalizer": normalizer,
             "bleu": 12.5 + seed, "chrf": 30.0, "exact_match": 0.25,
             "model_config": {"decoder": decoder, "score": "additive", "normalizer": normalizer,
                              "temperature": temperature, "scope": "global"}}
  with open(os.path.join(workdir, "results.json"), "w") as f:
    json.dump(results, f)
  return out


def embedded_data(html: str) -> dict:
  """The page's JSON, parsed strictly (no NaN / Infinity allowed)."""
  m = re.search(r'<script id="inspect-data" type="application/json">(.*?)</script>', html, re.S)
  assert m, "no data block"

  def refuse(name):
    raise AssertionError(f"bare {name} in the page's JSON")

  return json.loads(m.group(1), parse_constant=refuse)


def as_array(nested):
  return np.array([[np.nan if v is None else v for v in row] for row in nested], np.float64)


def test_page_data_holds_the_runs_arrays(tmp_path):
  run = write_run(tmp_path / "run")
  data = inspect_page.page_data(str(tmp_path / "run"))
  assert data["run"]["normalizer"] == "softmax" and data["run"]["has_scores"]
  assert not data["run"]["multi"] and data["run"]["note"] == ""
  assert data["run"]["metrics"] == {"bleu": 12.5, "chrf": 30.0, "exact_match": 0.25}
  assert [e["id"] for e in data["examples"]] == run["ids"]
  for n, ex in enumerate(data["examples"]):
    i = ex["id"]
    w, e = run["weights"][i], run["scores"][i]
    assert ex["src_tokens"] == run["sources"][n].split() + ["</s>"]
    assert len(ex["tgt_tokens"]) == w.shape[0]
    np.testing.assert_allclose(as_array(ex["weights"][0][0]), w, atol=1e-7)
    shown = as_array(ex["scores"][0][0])
    np.testing.assert_array_equal(np.isnan(shown), np.isinf(e))  # masked scores are null
    np.testing.assert_allclose(shown[np.isfinite(e)], e[np.isfinite(e)], rtol=1e-7)
    assert ex["exact_match"] == (run["predictions"][n] == run["references"][n])
    assert 0.0 <= ex["sentence_bleu"] <= 100.0 + 1e-9
  assert data["examples"][0]["sentence_bleu"] == pytest.approx(100.0)


@pytest.mark.parametrize("normalizer", ["softmax", "sparsemax", "entmax15"])
def test_the_scores_renormalized_at_the_runs_temperature_are_the_weights(tmp_path, normalizer):
  run = write_run(tmp_path / "run", normalizer=normalizer, temperature=1.3)
  loaded = inspect_page.load_run(str(tmp_path / "run"))
  assert loaded.has_scores and loaded.scores_note == ""
  for i in run["ids"]:
    again = inspect_page.renormalize(run["scores"][i], normalizer, 1.3)
    np.testing.assert_allclose(again, run["weights"][i], atol=1e-5)


def test_weights_that_are_not_the_normalized_scores_turn_the_slider_off(tmp_path):
  write_run(tmp_path / "run")
  path = tmp_path / "run" / "attention.npz"
  with np.load(path) as f:
    arrays = dict(f)
  arrays["temperature"] = np.array(5.0, np.float32)  # not the temperature the weights came from
  np.savez(path, **arrays)
  run = inspect_page.load_run(str(tmp_path / "run"))
  assert not run.has_scores and "not softmax(scores / temperature)" in run.scores_note


def test_four_dimensional_weights(tmp_path):
  run = write_run(tmp_path / "run", layers_heads=(2, 3))
  data = inspect_page.page_data(str(tmp_path / "run"))
  assert data["run"]["multi"]
  ex = data["examples"][1]
  w = run["weights"][ex["id"]]
  assert np.array(ex["weights"]).shape == w.shape == (2, 3) + w.shape[2:]
  np.testing.assert_allclose(np.array(ex["weights"]), w, atol=1e-7)


def test_an_old_run_without_scores_tokens_references_or_scalars(tmp_path):
  run = write_run(tmp_path / "run", scores=False, tokens=False, references=False, scalars=False,
                  temperature=2.0)
  data = inspect_page.page_data(str(tmp_path / "run"))
  assert not data["run"]["has_scores"] and "no raw attention scores" in data["run"]["note"]
  assert data["run"]["temperature"] == 2.0 and data["run"]["scope"] == "global"  # results.json's
  ex = data["examples"][0]
  assert ex["scores"] is None and ex["reference"] is None and "sentence_bleu" not in ex
  assert ex["src_tokens"] == run["sources"][0].split() + ["</s>"]  # words + EOS fill in


def test_a_run_without_attention(tmp_path):
  write_run(tmp_path / "run", no_attention=True, decoder="none")
  data = inspect_page.page_data(str(tmp_path / "run"))
  assert not data["run"]["has_attention"] and not data["run"]["has_scores"]
  assert data["run"]["note"] == "this model has no attention"


@pytest.mark.parametrize("name", ["results.json", "attention.npz"])
def test_a_missing_file_is_named_with_what_to_run(tmp_path, name):
  write_run(tmp_path / "run")
  os.remove(tmp_path / "run" / name)
  with pytest.raises(DataError, match=rf"no {re.escape(name)} .*python -m experiments\.translate"):
    inspect_page.load_run(str(tmp_path / "run"))


def test_not_a_run_directory(tmp_path):
  with pytest.raises(DataError, match="no such run directory"):
    inspect_page.load_run(str(tmp_path / "nothing"))


def test_compare_joins_on_example_ids(tmp_path):
  a = write_run(tmp_path / "a", ids=(3, 5, 8, 13))
  b = write_run(tmp_path / "b", ids=(13, 5, 21), sources=[a["sources"][3], a["sources"][1], "x y"],
                no_attention=True, decoder="none", seed=1)
  data = inspect_page.page_data(str(tmp_path / "a"), compare=str(tmp_path / "b"))
  assert data["compare"]["name"] == "b" and data["compare"]["metrics"]["bleu"] == 13.5
  by_id = {e["id"]: e for e in data["examples"]}
  assert by_id[3]["compare"] is None and by_id[8]["compare"] is None
  assert by_id[13]["compare"]["prediction"] == b["predictions"][0]
  assert by_id[5]["compare"]["prediction"] == b["predictions"][1]
  # scored against run a's reference
  assert by_id[5]["compare"]["exact_match"] == (b["predictions"][1] == a["references"][1])


def test_compare_on_other_data_is_refused(tmp_path):
  write_run(tmp_path / "a")
  write_run(tmp_path / "b", seed=1)  # same ids, other sources
  with pytest.raises(DataError, match="are not on the same data: example 3"):
    inspect_page.page_data(str(tmp_path / "a"), compare=str(tmp_path / "b"))


def test_the_page_is_self_contained(tmp_path):
  sources = ["a </script><script>alert(1)</script> b", "c d", "e", "f g h"]
  write_run(tmp_path / "run", sources=sources)
  html = inspect_page.render(inspect_page.page_data(str(tmp_path / "run")), WEB_DIR)
  assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", html, re.I)
  assert not re.search(r"<link\b|<script[^>]*\bsrc\s*=|@import|url\(", html, re.I)
  assert "{{" not in html.split('id="inspect-data"')[0]  # every placeholder filled
  assert html.count("</script>") == html.count("<script")  # the sources cannot close a script
  data = embedded_data(html)
  assert data["examples"][0]["source"] == sources[0]
  assert "window.attnNormalizers" in html


def test_the_cli_writes_the_page_and_errors_in_one_line(tmp_path):
  write_run(tmp_path / "a")
  write_run(tmp_path / "b", decoder="none", no_attention=True)
  out = tmp_path / "page.html"
  cmd = [sys.executable, "-m", "experiments.inspect", f"--workdir={tmp_path / 'a'}",
         f"--compare={tmp_path / 'b'}", f"--out={out}"]
  done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
  assert done.returncode == 0, done.stderr
  assert out.exists() and f"wrote {out}" in done.stdout
  os.remove(tmp_path / "b" / "attention.npz")
  done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
  assert done.returncode == 2
  assert done.stderr.strip().splitlines() == [done.stderr.strip()]
  assert done.stderr.startswith(f"error: {tmp_path / 'b'}: no attention.npz")


def test_a_port_out_of_range_is_one_error_line(tmp_path):
  write_run(tmp_path / "a")
  done = subprocess.run([sys.executable, "-m", "experiments.inspect", f"--workdir={tmp_path / 'a'}",
                         "--port=70000"], cwd=REPO, capture_output=True, text=True, check=False)
  assert done.returncode == 2
  assert done.stderr.strip() == "error: --port must be in 0..65535, got 70000"
  assert not (tmp_path / "a" / "inspect.html").exists()  # refused before any work


def test_screenshot_pages_are_urls_and_a_missing_one_is_a_config_error(tmp_path):
  assert screenshot.page_url("http://127.0.0.1:8000/") == "http://127.0.0.1:8000/"
  (tmp_path / "p.html").write_text("<html></html>")
  assert screenshot.page_url(str(tmp_path / "p.html")) == f"file://{tmp_path / 'p.html'}"
  with pytest.raises(ConfigError, match="no such file"):
    screenshot.page_url(str(tmp_path / "missing.html"))
  done = subprocess.run([sys.executable, "-m", "experiments.screenshot",
                         f"--page={tmp_path / 'missing.html'}", f"--out={tmp_path / 'p.png'}",
                         "--click=#a", "--click=#b, #c"],
                        cwd=REPO, capture_output=True, text=True, check=False)
  assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
  # without a browser here the first missing thing is the browser, else the page
  assert re.match(r"error: .*(not found|not installed|no such file)", done.stderr), done.stderr


def test_the_server_serves_the_directory_on_localhost(tmp_path):
  write_run(tmp_path / "run")
  path = inspect_page.write_page(str(tmp_path / "run"), WEB_DIR)
  assert path == str(tmp_path / "run" / "inspect.html")
  server = inspect_page.make_server(str(tmp_path / "run"), 0)
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  try:
    host, port = server.server_address[:2]
    assert host == "127.0.0.1"
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/inspect.html", timeout=10) as r:
      assert r.read().decode() == open(path).read()
  finally:
    server.shutdown()
    server.server_close()


def test_a_transformer_run_shows_every_layer_and_head(smoke_transformer_workdir):
  """A real Transformer run: attention.npz holds [L, H, Tt, Ts] cross-attention and the scores
  behind it; the last layer's head average is what its own search reported; the page offers
  the layer/head choice with those arrays."""
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from attn import training  # pylint: disable=import-outside-toplevel
  wd = smoke_transformer_workdir
  z = np.load(os.path.join(wd, "attention.npz"))
  run = training.load_run(wd)
  batch = next(run.bundle.batches("test"))
  out = run.task.decode(run.model, batch, max_len=run.tc.max_output_len(batch["src"].shape[1]),
                        search=run.tc.search())
  row = {int(e): r for r, e in enumerate(batch["example_id"])}
  data = inspect_page.page_data(wd)
  assert data["run"]["multi"] and data["run"]["has_scores"]
  for n, i in enumerate(z["example_ids"]):
    w, e = z[f"weights_{i}"], z[f"scores_{i}"]
    Tt, Ts = len(z[f"tgt_tokens_{i}"]), len(z[f"src_tokens_{i}"])
    assert w.shape == e.shape == (2, 2, Tt, Ts)  # dec_layers x num_heads
    again = core.normalize(jnp.where(np.isfinite(e), e, 0), np.isfinite(e),
                           kind=str(z["normalizer"]), temperature=float(z["temperature"]))
    np.testing.assert_allclose(again, w, atol=1e-5)
    searched = np.asarray(out.weights[row[int(i)]])[:Tt, :Ts]  # the search's own per-step record
    np.testing.assert_allclose(w[-1].mean(0), searched, atol=1e-5)
    assert not np.allclose(w[0], w[1], atol=1e-3)  # layers differ: the choice is worth offering
    np.testing.assert_allclose(np.array(data["examples"][n]["weights"]), w, atol=1e-6)
