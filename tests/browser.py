"""The browser fixture of the page tests: one headless Chromium per session (attn.launching.browser).

`make test` installs Debian's chromium and chromium-driver where it can (root, apt reachable);
where it cannot, every browser test skips with one line saying why.
"""

import pytest

from attn.launching.browser import chromium, console_errors, missing  # noqa: F401  (re-exported)


@pytest.fixture(scope="session")
def browser():
  """One headless Chromium for the whole session (starting it costs ~1 s)."""
  why = missing()
  if why:
    pytest.skip(f"browser tests skipped: {why}")
  with chromium() as driver:
    yield driver
