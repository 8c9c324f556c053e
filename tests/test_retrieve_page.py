"""The retrieval experiment on the reading-focus page: the workdir a tiny run leaves, the API's two
stages, and the page in a real (headless) browser showing both stages' weights."""

import os
import threading

import numpy as np
import pytest

from attn.errors import ConfigError
from attn.apps.focus import server as focus_server
from attn.apps.retrieve import data as pools
from attn.apps.retrieve import sweep as retrieve
from attn.apps.retrieve import server as retrieve_server
from browser import browser, console_errors  # noqa: F401  pylint: disable=unused-import
from test_focus_page import _settled

WEB_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments",
                       "web")
TINY = retrieve.RetrieveConfig(stories=pools.PoolStoryConfig(max_sentences=6), distractors=(3,),
                               modes=("retrieve",), dim=16, steps=150, train_size=300,
                               test_size=50, num_samples=2, page_distractors=3)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
  """(base URL, service, workdir) of a server on a free port with a tiny trained model."""
  workdir = str(tmp_path_factory.mktemp("retrieve_page"))
  retrieve.train_and_evaluate(TINY, workdir, page=focus_server.inline_page(WEB_DIR),
                              verbose=False)
  service = retrieve_server.RetrieveService.from_workdir(workdir)
  server = focus_server.make_server(service, focus_server.inline_page(WEB_DIR), port=0)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  yield f"http://127.0.0.1:{server.server_port}/", service, workdir
  server.shutdown()
  server.server_close()


def test_the_workdir_holds_the_table_the_plot_the_page_and_a_servable_model(site):
  _, service, workdir = site
  for name in (retrieve.RESULTS_FILE, retrieve.TABLE_FILE, retrieve.PLOT_FILE,
               retrieve.PAGE_FILE, retrieve.MODEL_FILE, retrieve.SERVED_PARAMS):
    assert os.path.getsize(os.path.join(workdir, name)) > 0, name
  with open(os.path.join(workdir, retrieve.PLOT_FILE), "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  assert len(service.samples) == 2 and service.samples[0]["passages"] == 4


def test_the_api_returns_retrieval_weights_over_the_pool_and_reader_weights_over_what_it_read(
    site):
  _, service, _ = site
  sample = service.samples[0]
  out = service.read(sample["text"], sample["question"], 1.0)
  passages = out["stages"][0]
  assert passages["name"] == "passages" and len(passages["items"]) == 4
  w = np.array([x["weight"] for x in passages["items"]])
  assert (w > 0).sum() == TINY.top_k and w.sum() == pytest.approx(1.0, abs=1e-5)
  read = [i for i in np.flatnonzero(w > 0)]
  assert all(any(s.startswith(f"[story {p + 1}] ") for s in out["sentences"]) for p in read)
  assert sum(out["weights"]) == pytest.approx(1.0, abs=1e-5)  # p(z|q) x weight inside z
  assert [s["name"] for s in out["stages"]] == ["passages", "hop1"]
  with pytest.raises(focus_server.BadRequest, match="pool is empty"):
    service.read("\n\n", "Where is the apple?")
  with pytest.raises(focus_server.BadRequest, match="at most 6"):
    service.read("\n".join(["Mary went to the kitchen."] * 7), "Where is Mary?")


def test_the_page_shows_both_stages_weights_as_the_api_sends_them(site, browser):
  url, service, _ = site
  browser.get(url)
  _settled(browser, 0)
  assert console_errors(browser) == []
  shown = browser.execute_script("""
    const weights = (sel) => [...document.querySelectorAll(sel)].map(
        (li) => parseFloat(li.dataset.weight));
    return {
      title: document.querySelector('h1').textContent,
      passages: weights('#stages ol[data-stage=passages] .sentence'),
      gold: [...document.querySelectorAll('#stages ol[data-stage=passages] .sentence')]
          .findIndex((li) => li.classList.contains('gold')),
      hop1: weights('#stages ol[data-stage=hop1] .sentence'),
      sentences: [...document.querySelectorAll('#sentences .sentence .text')].map(
          (t) => t.textContent),
      weights: weights('#sentences .sentence'),
      sentencesTitle: document.getElementById('sentences-title').textContent,
    };""")
  sample = service.samples[0]
  want = service.read(sample["text"], sample["question"], 1.0)
  assert shown["title"] == retrieve_server.TITLE
  assert shown["passages"] == pytest.approx([x["weight"] for x in want["stages"][0]["items"]],
                                            abs=1e-5)
  assert shown["gold"] == sample["gold"]["passages"]
  assert shown["hop1"] == pytest.approx([x["weight"] for x in want["stages"][1]["items"]],
                                        abs=1e-5)
  assert shown["sentences"] == want["sentences"]
  assert shown["weights"] == pytest.approx(want["weights"], abs=1e-5)
  assert shown["sentencesTitle"] == want["sentences_title"]


def test_serving_a_workdir_without_a_trained_model_is_one_config_error(tmp_path):
  with pytest.raises(ConfigError, match=r"no trained retriever in .* run without --serve_only"):
    retrieve_server.RetrieveService.from_workdir(str(tmp_path))
