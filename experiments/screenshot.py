r"""A PNG of a web page in headless Chromium (the README's pictures of the run viewer).

    python -m experiments.screenshot --page=workdirs/demo/decoder=bahdanau/inspect.html \
        --out=docs/img/inspect.png --click='#output .tgt-tok:nth-child(3)'

--page is a file path or a URL; each --click (a CSS selector) is clicked in order before the
picture is taken (the flags are the fields of attn.inspection.screenshot.ScreenshotSettings).
Needs selenium and Debian's chromium + chromium-driver (ATTN_CHROMIUM and ATTN_CHROMEDRIVER
override their paths; see attn/launching/browser.py).
"""

from absl import flags

from attn.config import configurable
from attn.inspection.screenshot import ScreenshotSettings
from attn.launching import cli

FLAGS = flags.FLAGS


def define_flags():
  """One flag per field of ScreenshotSettings; --click by hand (repeatable: a CSS selector may
  hold commas, so it cannot be a comma-separated list)."""
  cli.define_settings_flags(ScreenshotSettings, skip=("click",))
  flags.DEFINE_multi_string("click", list(ScreenshotSettings.click),
                            configurable.help_of(ScreenshotSettings)["click"])
  flags.mark_flags_as_required(["page", "out"])


def main(argv):
  del argv
  from attn.inspection import screenshot  # pylint: disable=import-outside-toplevel
  settings = cli.settings_from_flags(ScreenshotSettings, click=tuple(FLAGS.click))
  print(f"wrote {screenshot.take(settings)}")


if __name__ == "__main__":
  define_flags()
  cli.run(main)
