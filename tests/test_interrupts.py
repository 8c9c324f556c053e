"""InterruptGuard: Ctrl-C during a (donating) train step lands after the step, never inside it."""

import os
import signal

import pytest

from attn.training.interrupts import InterruptGuard


def _ctrl_c():
  os.kill(os.getpid(), signal.SIGINT)  # delivered to the main thread before the next bytecode


def test_ctrl_c_inside_a_step_is_raised_after_the_step_finishes():
  done = []
  with InterruptGuard() as guard:
    with pytest.raises(KeyboardInterrupt):
      with guard.step():
        _ctrl_c()
        done.append("rest of the step")
    assert done == ["rest of the step"]
    assert not guard.pending


def test_ctrl_c_outside_a_step_interrupts_at_once():
  done = []
  with InterruptGuard():
    with pytest.raises(KeyboardInterrupt):
      _ctrl_c()
      done.append("never")
  assert done == []


def test_a_second_ctrl_c_inside_a_step_interrupts_at_once():
  done = []
  with InterruptGuard() as guard:
    with pytest.raises(KeyboardInterrupt):
      with guard.step():
        _ctrl_c()
        _ctrl_c()
        done.append("never")
  assert done == []


def test_the_previous_handler_is_restored():
  before = signal.getsignal(signal.SIGINT)
  with InterruptGuard():
    assert signal.getsignal(signal.SIGINT) is not before
  assert signal.getsignal(signal.SIGINT) is before
