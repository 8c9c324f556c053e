"""The run viewer's page in headless Chromium (opened from file://, as a user opens it): what it
shows equals attention.npz, its JS normalizers equal attn's, the focus slider sharpens and flattens,
the compare view and the layer/head selectors. Synthetic runs from test_inspect.write_run."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attn import core
from attn.inspection import viewer as inspect_page
from browser import browser, console_errors  # noqa: F401  pylint: disable=unused-import
from test_inspect import WEB_DIR, write_run

KINDS = ("softmax", "sparsemax", "entmax15")
T_RUN = 0.7  # the synthetic runs' own temperature


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
  """name -> (page path, what write_run wrote) for the runs the tests open."""
  root = tmp_path_factory.mktemp("inspect")
  out = {}

  def make(name, compare=None, **kw):
    workdir = str(root / name)
    run = write_run(workdir, temperature=T_RUN, **kw)
    compare_dir = str(root / compare) if compare else None
    key = f"{name}_vs_{compare}" if compare else name
    out[key] = (inspect_page.write_page(workdir, WEB_DIR, compare=compare_dir,
                                        out=str(root / f"{key}.html")), run)

  for kind in KINDS:
    make(kind, normalizer=kind)
  make("none", no_attention=True, decoder="none", seed=0)
  make("softmax", compare="none")
  make("multi", layers_heads=(2, 3), seed=2)
  make("noscores", scores=False, seed=3)
  return out


def open_page(driver, path):
  driver.get("file://" + path)
  errors = console_errors(driver)
  assert not errors, errors


def select(driver, element_id, value):
  """Chooses an option as a user does (fires `change`)."""
  from selenium.webdriver.support.ui import Select  # pylint: disable=import-outside-toplevel
  Select(driver.find_element("id", element_id)).select_by_value(str(value))


def click_step(driver, t):
  driver.find_elements("css selector", "#output .tgt-tok")[t].click()


def set_temperature(driver, T):
  """Moves the focus slider (log10 scale) to T, firing `input` as a drag does."""
  driver.execute_script(
      "const s = document.getElementById('temperature');"
      "s.value = String(arguments[0]); s.dispatchEvent(new Event('input', {bubbles: true}));",
      math.log10(T))


def shown(driver):
  """(source shading [Ts], heatmap [Tt][Ts], current row) as the page's data attributes say."""
  return driver.execute_script("""
    const num = (n) => Number(n.dataset.weight);
    const src = Array.from(document.querySelectorAll('#source .src-tok')).map(num);
    const rows = Array.from(document.querySelectorAll('#heatmap tr[data-row]'));
    const cells = rows.map((tr) => Array.from(tr.querySelectorAll('td.cell')).map(num));
    const cur = rows.findIndex((tr) => tr.classList.contains('current'));
    return [src, cells, cur];""")


def entropy(p):
  p = np.asarray(p)
  p = p[p > 0]
  return float(-(p * np.log(p)).sum())


def test_every_page_loads_from_file_without_console_errors(browser, pages):
  for path, _ in pages.values():
    open_page(browser, path)
    assert browser.find_element("id", "title").text.startswith("attention: ")
    assert browser.find_elements("css selector", "#output .tgt-tok")


@pytest.mark.parametrize("kind", KINDS)
def test_the_shown_weights_are_the_stored_ones(browser, pages, kind):
  path, run = pages[kind]
  open_page(browser, path)
  select(browser, "example", 2)
  i = run["ids"][2]
  w = run["weights"][i]
  for t in (2, 1):
    click_step(browser, t)
    src, cells, cur = shown(browser)
    assert cur == t
    np.testing.assert_allclose(cells, w, atol=1e-5)
    np.testing.assert_allclose(src, w[t], atol=1e-5)
  # prev / next buttons and the arrow keys step too
  browser.find_element("id", "next").click()
  assert shown(browser)[2] == 2
  browser.find_element("tag name", "body").send_keys("\ue012")  # ArrowLeft
  src, _, cur = shown(browser)
  assert cur == 1
  np.testing.assert_allclose(src, w[1], atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_renormalizing_in_the_page_reproduces_the_stored_weights(browser, pages, kind):
  # Just off the run's own temperature the page recomputes from the scores.
  path, run = pages[kind]
  open_page(browser, path)
  select(browser, "example", 1)  # the one with a fully masked row
  set_temperature(browser, T_RUN * (1 + 1e-7))
  assert "own 0.7" in browser.find_element("id", "temperature-value").text
  np.testing.assert_allclose(shown(browser)[1], run["weights"][run["ids"][1]], atol=1e-5)
  browser.find_element("id", "temperature-reset").click()
  assert "the run's own" in browser.find_element("id", "temperature-value").text


@pytest.mark.parametrize("kind", KINDS)
def test_the_js_normalizers_equal_attns(browser, pages, kind):
  open_page(browser, pages["softmax"][0])
  rng = np.random.default_rng(7)
  Tk = 9
  e = rng.normal(scale=2.0, size=(24, Tk)).astype(np.float32)
  e[0] = 1.5  # all tied
  e[1, :4] = e[1, 4]  # ties at the top
  e[2, ::2] = -0.25  # ties in the middle
  e[3, 5] = 40.0  # one dominant entry
  mask = rng.random(e.shape) > 0.3
  mask[4] = False  # fully masked
  mask[5] = False
  mask[5, 3] = True  # a single valid entry
  mask[6] = True
  for T in (0.05, 0.7, 1.0, 7.5):
    z = [[float(x) / T if m else None for x, m in zip(row, mrow)] for row, mrow in zip(e, mask)]
    # masked entries arrive as null; half the rows are turned into -Infinity in the page
    js = browser.execute_script(
        "return arguments[0].map((row, r) => window.attnNormalizers[arguments[1]]("
        "  r % 2 ? row.map((x) => (x === null ? -Infinity : x)) : row));", z, kind)
    ref = np.asarray(core.normalize(e, mask, kind=kind, temperature=T))
    np.testing.assert_allclose(np.array(js, np.float64), ref, atol=1e-5, err_msg=f"T={T}")
  assert not console_errors(browser)


@pytest.mark.parametrize("kind", ["softmax", "entmax15"])
def test_low_temperature_approaches_the_argmax_and_high_flattens(browser, pages, kind):
  path, run = pages[kind]
  open_page(browser, path)
  select(browser, "example", 3)
  e = run["scores"][run["ids"][3]]
  # a step whose best score leads clearly (0.02 * ln(100) < 0.1 is what softmax needs)
  top2 = np.sort(np.where(np.isfinite(e), e, -np.inf), axis=-1)[:, -2:]
  t = int(np.argmax(top2[:, 1] - top2[:, 0]))
  assert top2[t, 1] - top2[t, 0] > 0.2
  click_step(browser, t)
  own = shown(browser)[0]
  set_temperature(browser, 0.02)
  sharp = shown(browser)[0]
  assert max(sharp) > 0.99 and int(np.argmax(sharp)) == int(np.argmax(e[t]))
  set_temperature(browser, 20.0)
  flat = shown(browser)[0]
  assert entropy(flat) > entropy(own) + 0.1
  assert not console_errors(browser)


def test_the_compare_view_shows_both_outputs(browser, pages):
  path, run = pages["softmax_vs_none"]
  other = pages["none"][1]
  open_page(browser, path)
  select(browser, "example", 1)
  assert browser.find_element("id", "compare").is_displayed()
  assert browser.find_element("id", "output-a").text == run["predictions"][1]
  assert browser.find_element("id", "output-b").text == other["predictions"][1]
  table = browser.find_element("id", "compare-table").text
  assert "sentence BLEU" in table and "run BLEU" in table and "12.50" in table
  assert browser.find_element("id", "reference-text").text == run["references"][1]


def test_a_run_without_attention_says_so(browser, pages):
  open_page(browser, pages["none"][0])
  assert browser.find_element("id", "note").text == "this model has no attention"
  assert not browser.find_element("id", "heatmap-section").is_displayed()
  assert not browser.find_element("id", "focus").is_displayed()
  assert browser.find_element("id", "output").text.split() == \
      pages["none"][1]["predictions"][0].split() + ["</s>"]


def test_without_scores_the_slider_is_off_with_a_note(browser, pages):
  path, run = pages["noscores"]
  open_page(browser, path)
  assert not browser.find_element("id", "temperature").is_enabled()
  assert "no raw attention scores" in browser.find_element("id", "note").text
  np.testing.assert_allclose(shown(browser)[1], run["weights"][run["ids"][0]], atol=1e-5)


def test_layer_and_head_selectors_switch_the_shown_weights(browser, pages):
  path, run = pages["multi"]
  open_page(browser, path)
  assert browser.find_element("id", "layer").is_displayed()
  assert browser.find_element("id", "head").is_displayed()
  select(browser, "example", 2)
  w = run["weights"][run["ids"][2]]  # [L, H, Tt, Ts]
  # It opens on the last layer's head average (what attention.png and AER read).
  np.testing.assert_allclose(shown(browser)[1], w[-1].mean(0), atol=1e-5)
  select(browser, "layer", 0)
  select(browser, "head", 0)
  np.testing.assert_allclose(shown(browser)[1], w[0, 0], atol=1e-5)
  select(browser, "layer", 1)
  select(browser, "head", 2)
  np.testing.assert_allclose(shown(browser)[1], w[1, 2], atol=1e-5)
  assert not np.allclose(w[1, 2], w[1, 0], atol=1e-3)  # the switch is visible
  select(browser, "head", "avg")
  np.testing.assert_allclose(shown(browser)[1], w[1].mean(0), atol=1e-5)
  set_temperature(browser, T_RUN * (1 + 1e-7))  # the average of the renormalized heads
  np.testing.assert_allclose(shown(browser)[1], w[1].mean(0), atol=1e-5)
  assert not console_errors(browser)
