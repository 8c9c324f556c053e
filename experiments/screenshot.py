r"""A PNG of a web page in headless Chromium (the README's pictures of the run viewer).

    python -m experiments.screenshot --page=workdirs/demo/decoder=bahdanau/inspect.html \
        --out=docs/img/inspect.png --click='#output .tgt-tok:nth-child(3)'

--page is a file path or a URL; each --click (a CSS selector) is clicked in order before the
picture is taken. Needs selenium and Debian's chromium + chromium-driver (ATTN_CHROMIUM and
ATTN_CHROMEDRIVER override their paths; see attn/launching/browser.py).
"""

import os

from absl import flags

from attn.launching import browser
from attn.launching import cli

FLAGS = flags.FLAGS


def define_flags():
  flags.DEFINE_string("page", None, "An HTML file or an http(s)/file URL.")
  flags.DEFINE_string("out", None, "Where the PNG goes.")
  flags.DEFINE_integer("width", 1400, "Picture width in pixels.")
  flags.DEFINE_integer("height", 900, "Picture height in pixels.")
  flags.DEFINE_multi_string("click", [], "CSS selector to click before the picture (repeatable).")
  flags.mark_flags_as_required(["page", "out"])


def main(argv):
  del argv
  why = browser.missing()
  if why:
    cli.fail(why)
  from selenium.common.exceptions import NoSuchElementException  # pylint: disable=import-outside-toplevel
  page = FLAGS.page
  if "://" not in page:
    if not os.path.exists(page):
      cli.fail(f"--page={page}: no such file (write it with `python -m experiments.inspect`)")
    page = "file://" + os.path.abspath(page)
  with browser.chromium(FLAGS.width, FLAGS.height) as driver:
    driver.get(page)
    for selector in FLAGS.click:
      try:
        driver.find_element("css selector", selector).click()
      except NoSuchElementException:
        cli.fail(f"--click={selector}: no such element on {page}")
    os.makedirs(os.path.dirname(os.path.abspath(FLAGS.out)), exist_ok=True)
    driver.save_screenshot(FLAGS.out)
  print(f"wrote {FLAGS.out}")


if __name__ == "__main__":
  define_flags()
  cli.run(main)
