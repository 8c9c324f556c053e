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


def test_ctrl_c_exits_130_at_once_whatever_threads_still_run(tmp_path):
  """The entry points' Ctrl-C path ends the process itself (cli.exit_now): a thread still at work
  (as XLA's, tensorstore's or grain's may be during set-up) neither delays the exit nor runs
  under an interpreter being torn down."""
  import subprocess
  import sys
  import time
  script = tmp_path / "main.py"
  script.write_text(
      "import threading, time\n"
      "from attn.launching import cli\n"
      "def main(argv):\n"
      "  threading.Thread(target=time.sleep, args=(600,)).start()\n"
      "  print('set up', flush=True)\n"
      "  raise KeyboardInterrupt\n"
      "cli.run(main)\n")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  t0 = time.time()
  p = subprocess.run([sys.executable, str(script)], cwd=root, capture_output=True, text=True,
                     timeout=60, env={**os.environ, "PYTHONPATH": root})
  assert (p.returncode, p.stdout, p.stderr) == (130, "set up\n", "interrupted\n")
  assert time.time() - t0 < 30
