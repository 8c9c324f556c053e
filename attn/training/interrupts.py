"""Ctrl-C that never lands inside a donated train step.

The train step donates its input state: once dispatched, the old arrays are gone and the new ones
exist only when the call returns. A KeyboardInterrupt raised between the two would leave nothing
to save. `InterruptGuard.step()` holds a SIGINT that arrives during the step and raises it as soon
as the step has returned (its outputs assigned), so the loop's handler always has a state to save.
Outside a step, Ctrl-C interrupts at once, as usual; a second Ctrl-C during a held one also does.
"""

from __future__ import annotations

import contextlib
import signal
import threading


class InterruptGuard:
  """Installs the deferring SIGINT handler for the duration of a `with` block (main thread only:
  elsewhere Python delivers no signals and the guard does nothing)."""

  def __init__(self):
    self.pending = False
    self._in_step = False
    self._previous = None

  def _handler(self, signum, frame):
    if self._in_step and not self.pending:
      self.pending = True
      return
    raise KeyboardInterrupt

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGINT, self._handler)
    return self

  def __exit__(self, *exc):
    if self._previous is not None:
      signal.signal(signal.SIGINT, self._previous)
      self._previous = None
    return False

  @contextlib.contextmanager
  def step(self):
    """The body runs with Ctrl-C held; a held one is raised when the body has finished."""
    self._in_step = True
    try:
      yield
    finally:
      self._in_step = False
    if self.pending:
      self.pending = False
      raise KeyboardInterrupt
