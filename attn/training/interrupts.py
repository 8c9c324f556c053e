"""Ctrl-C that never lands inside a donated train step.

The train step donates its input state: once dispatched, the old arrays are gone and the new ones
exist only when the call returns. A KeyboardInterrupt raised between the two would leave nothing
to save. `InterruptGuard.step()` holds a SIGINT that arrives during the step and raises it as soon
as the step has returned (its outputs assigned), so the loop's handler always has a state to save.
Outside a step, Ctrl-C interrupts at once, as usual; a second Ctrl-C during a held one also does.

SIGTERM is handled as Ctrl-C inside the guard: a scheduler stopping or preempting the run (Slurm's
scancel or time limit, a cluster manager's eviction, `kill`) gets the same save and the same
interrupted exit. A process that ignores SIGTERM (a Slurm task's run, to which the task passes
SIGTERM on as SIGINT: attn/launching/launchers.py) keeps ignoring it, so one stop never arrives
as two interrupts.
"""

from __future__ import annotations

import contextlib
import signal
import threading


class InterruptGuard:
  """Installs the deferring handler of SIGINT, and of SIGTERM unless it is ignored, for the
  duration of a `with` block (main thread only: elsewhere Python delivers no signals and the
  guard does nothing)."""

  def __init__(self):
    self.pending = False
    self._in_step = False
    self._previous = {}  # signal -> the handler the guard replaced

  def _handler(self, signum, frame):
    if self._in_step and not self.pending:
      self.pending = True
      return
    raise KeyboardInterrupt

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      for signum in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(signum) is not signal.SIG_IGN:
          self._previous[signum] = signal.signal(signum, self._handler)
    return self

  def __exit__(self, *exc):
    for signum, previous in self._previous.items():
      signal.signal(signum, previous)
    self._previous = {}
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
