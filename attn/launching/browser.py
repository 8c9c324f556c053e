"""Headless Chromium driven by selenium, for the page tests and the README screenshots.

Uses Debian's chromium and chromium-driver (`/usr/bin/chromium`, `/usr/bin/chromedriver`;
ATTN_CHROMIUM and ATTN_CHROMEDRIVER override the paths). `make test` installs them where it can.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

CHROMIUM = os.environ.get("ATTN_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("ATTN_CHROMEDRIVER", "/usr/bin/chromedriver")

# Without the background-networking flags Chromium keeps trying (and failing) to reach Google's
# hosts on a closed network; a fresh profile per browser keeps runs independent.
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--hide-scrollbars",
         "--force-device-scale-factor=1")


def missing() -> str | None:
  """Why a browser cannot be started here (None when it can)."""
  try:
    import selenium  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  except ImportError:
    return "selenium is not installed (pip install -e '.[test]')"
  for path, pkg in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
    if not (os.path.exists(path) or shutil.which(path)):
      return f"{path} not found (apt-get install {pkg}; `make test` does this when run as root)"
  return None


@contextlib.contextmanager
def chromium(width: int = 1400, height: int = 1000):
  """A selenium WebDriver on headless Chromium whose viewport is exactly width x height, with
  the browser console log kept (read it with `console_errors`)."""
  # pylint: disable=import-outside-toplevel  (selenium: only the page tests and screenshots)
  from selenium import webdriver
  from selenium.webdriver.chrome.service import Service
  opts = webdriver.ChromeOptions()
  opts.binary_location = CHROMIUM
  profile = tempfile.mkdtemp(prefix="attn-chromium-")
  for flag in FLAGS + (f"--window-size={width},{height}", f"--user-data-dir={profile}"):
    opts.add_argument(flag)
  opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
  driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
  try:
    # --window-size includes the browser's frame; this makes the page area the asked size.
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
        "width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
    yield driver
  finally:
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def console_errors(driver) -> list[str]:
  """Console messages of level SEVERE (uncaught exceptions, failed loads) since the last call."""
  return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
