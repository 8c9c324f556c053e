"""The run viewer on a run over images: attention.npz's `image_{id}` and `regions_{id}` reach the
page, which draws the image with the current step's weights over its regions (headless
Chromium), and a page without images is unchanged; inconsistent regions are refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

from attn.errors import DataError
from attn.inspection import viewer as inspect_page
from browser import browser, console_errors  # noqa: F401  pylint: disable=unused-import
from test_inspect import WEB_DIR, write_run

P = 4  # region side in pixels


def add_images(workdir, boxes=None):
  """Adds to a synthetic run's attention.npz an image per example (one P x P region per
  attention column, side by side) and its region boxes; returns {id: (image, boxes)}."""
  path = f"{workdir}/attention.npz"
  with np.load(path) as npz:
    arrays = {k: npz[k] for k in npz}
  out = {}
  for i in arrays["example_ids"].tolist():
    Ts = arrays[f"weights_{i}"].shape[-1]
    img = (np.arange(P * P * Ts).reshape(P, Ts * P) * 7 % 256).astype(np.uint8)
    b = (np.array([[0, r * P, P, P] for r in range(Ts)], np.int32) if boxes is None
         else boxes(Ts))
    arrays[f"image_{i}"], arrays[f"regions_{i}"] = img, b
    out[i] = (img, b)
  np.savez_compressed(path, **arrays)
  return out


@pytest.fixture(scope="module")
def image_run(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("caption_page") / "run")
  run = write_run(workdir, temperature=1.0, seed=4)
  images = add_images(workdir)
  page = inspect_page.write_page(workdir, WEB_DIR)
  return page, run, images


def test_page_data_carries_each_examples_image_and_regions(image_run, tmp_path):
  page, run, images = image_run
  data = inspect_page.page_data(page.rsplit("/", 1)[0])
  for ex in data["examples"]:
    img, boxes = images[ex["id"]]
    assert ex["image"]["pixels"] == img.tolist() and ex["image"]["regions"] == boxes.tolist()
  plain = str(tmp_path / "plain")
  write_run(plain, temperature=1.0, seed=4)
  assert all(ex["image"] is None for ex in inspect_page.page_data(plain)["examples"])


@pytest.mark.parametrize("boxes,message", [
    (lambda Ts: np.zeros((Ts + 1, 4), np.int32), r"regions_\d+ of shape \(\d+, 4\), one box per "
                                                 "attention column"),
    (lambda Ts: np.array([[0, r * P + 1, P, P] for r in range(Ts)], np.int32),
     r"regions_\d+ has a box outside the 4x\d+ image_\d+"),
])
def test_regions_that_do_not_fit_are_refused(tmp_path, boxes, message):
  workdir = str(tmp_path / "run")
  write_run(workdir, temperature=1.0, seed=4)
  add_images(workdir, boxes)
  with pytest.raises(DataError, match=message):
    inspect_page.page_data(workdir)


def test_the_image_shows_the_current_steps_weights_over_its_regions(browser, image_run):
  page, run, _ = image_run
  browser.get("file://" + page)
  assert not console_errors(browser)
  assert not browser.find_element("id", "image-section").get_attribute("hidden")
  i = run["ids"][0]
  w = np.asarray(run["weights"][i])
  for t in (0, w.shape[0] - 1):
    browser.find_elements("css selector", "#output .tgt-tok")[t].click()
    shown = json.loads(browser.find_element("id", "image").get_attribute("data-weights"))
    np.testing.assert_allclose(shown, w[t], atol=1e-6)
  size = browser.execute_script(
      "const c = document.getElementById('image'); return [c.width, c.height];")
  assert size == [w.shape[1] * P * 6, P * 6]  # every region drawn, 6 screen pixels a pixel
  # The region under the step's largest weight is tinted: its centre is not the image's grey.
  t = w.shape[0] - 1
  r = int(np.argmax(w[t]))
  rgb = browser.execute_script(
      "const c = document.getElementById('image').getContext('2d');"
      "return Array.from(c.getImageData(arguments[0], arguments[1], 1, 1).data).slice(0, 3);",
      (r * P + 1) * 6 + 3, 6 + 3)
  assert w[t, r] > 0.2 and rgb[0] > rgb[2], rgb  # orange over grey: more red than blue
