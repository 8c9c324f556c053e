"""A PNG of a web page in headless Chromium (the README's pictures of the run viewer and the
reading-focus demo), through attn.launching.browser.

    take(ScreenshotSettings(page="workdirs/demo/decoder=bahdanau/inspect.html",
                            out="docs/img/inspect.png", click=("#output .tgt-tok:nth-child(3)",)))
"""

from __future__ import annotations

import dataclasses
import os

from attn.config.configurable import option
from attn.errors import AttnError, ConfigError
from attn.launching import browser


@dataclasses.dataclass(frozen=True)
class ScreenshotSettings:
  """One picture (`python -m experiments.screenshot`)."""
  page: str | None = option(None, "An HTML file or an http(s)/file URL.")
  out: str | None = option(None, "Where the PNG goes.")
  width: int = option(1400, "Picture width in pixels.")
  height: int = option(900, "Picture height in pixels.")
  click: tuple[str, ...] = option((), "CSS selector to click before the picture (repeatable).")

  def __post_init__(self):
    if self.width < 1 or self.height < 1:
      raise ConfigError(f"--width and --height must be >= 1, got {self.width}x{self.height}")


def page_url(page: str) -> str:
  """`page` as a URL: a URL unchanged, a file path as file://; ConfigError for a missing file."""
  if "://" in page:
    return page
  if not os.path.exists(page):
    raise ConfigError(f"--page={page}: no such file (write it with "
                      "`python -m experiments.inspect`)")
  return "file://" + os.path.abspath(page)


def take(settings: ScreenshotSettings) -> str:
  """Opens the page, clicks each selector in order, writes the PNG; returns its path. A missing
  browser, page or element is an AttnError (one line at the command line)."""
  why = browser.missing()
  if why:
    raise AttnError(why)
  # pylint: disable-next=import-outside-toplevel  (selenium: only where a browser is)
  from selenium.common.exceptions import NoSuchElementException
  url = page_url(settings.page)
  with browser.chromium(settings.width, settings.height) as driver:
    driver.get(url)
    for selector in settings.click:
      try:
        driver.find_element("css selector", selector).click()
      except NoSuchElementException:
        raise ConfigError(f"--click={selector}: no such element on {url}") from None
    os.makedirs(os.path.dirname(os.path.abspath(settings.out)), exist_ok=True)
    driver.save_screenshot(settings.out)
  return settings.out
