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


def test_ctrl_c_during_a_periodic_save_lands_after_it(tmp_path, monkeypatch):
  """Ctrl-C pressed while the loop saves a checkpoint is held until the save has finished (one
  raised inside orbax's save was reported as a failed save, exit 2, its -tmp directory left):
  the run then stops with KeyboardInterrupt (exit 130) and the step is saved, whole."""
  from attn import training
  from attn.training import loop, resume
  from experiments.configs import translate as translate_config
  config = translate_config.get_config("smoke")
  config.data.num_buckets = 1
  config.train.update(dict(steps=6, checkpoint_every=2, eval_every=100, log_every=2))
  real, finished = resume.save, []

  def save_with_a_ctrl_c(ckpt, manager, run):
    if manager is ckpt.latest and not finished:
      _ctrl_c()
    real(ckpt, manager, run)
    finished.append(run.progress.step)
  monkeypatch.setattr(loop.resume, "save", save_with_a_ctrl_c)
  with pytest.raises(KeyboardInterrupt):
    training.train_and_evaluate(config, str(tmp_path))
  assert finished == [2]  # the save the Ctrl-C arrived in finished; nothing ran after it
  saved = sorted(os.listdir(tmp_path / "checkpoints"))
  assert saved == ["2"], saved  # committed, no orbax-checkpoint-tmp left behind
  assert not (tmp_path / "results.json").exists()
