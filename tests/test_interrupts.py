"""InterruptGuard: Ctrl-C during a (donating) train step lands after the step, never inside it."""

import os
import signal

import pytest

from attn.training.interrupts import InterruptGuard


def _ctrl_c():
  os.kill(os.getpid(), signal.SIGINT)  # delivered to the main thread before the next bytecode


def _presses_inside_a_step(presses):
  """Ctrl-C pressed `presses` times inside one guarded step: (what the step did after the
  presses, whether an interrupt was still pending once KeyboardInterrupt was raised)."""
  done = []
  with InterruptGuard() as guard:
    with pytest.raises(KeyboardInterrupt):
      with guard.step():
        for _ in range(presses):
          _ctrl_c()
        done.append("rest of the step")
    return done, guard.pending


def test_ctrl_c_inside_a_step_is_raised_after_the_step_finishes():
  assert _presses_inside_a_step(1) == (["rest of the step"], False)


def test_ctrl_c_outside_a_step_interrupts_at_once():
  done = []
  with InterruptGuard():
    with pytest.raises(KeyboardInterrupt):
      _ctrl_c()
      done.append("never")
  assert done == []


def test_a_second_ctrl_c_inside_a_step_interrupts_at_once():
  done, _ = _presses_inside_a_step(2)
  assert done == []


def test_the_previous_handler_is_restored():
  before = signal.getsignal(signal.SIGINT)
  with InterruptGuard():
    assert signal.getsignal(signal.SIGINT) is not before
  assert signal.getsignal(signal.SIGINT) is before
