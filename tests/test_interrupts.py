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


def test_sigterm_inside_a_step_is_held_as_ctrl_c_and_the_handler_restored():
  """A scheduler's SIGTERM (preemption, a time limit, kill) is Ctrl-C to the guard: held to the
  end of the step, then raised, so the loop saves the step; the handler before comes back."""
  before = signal.getsignal(signal.SIGTERM)
  done = []
  with InterruptGuard() as guard:
    assert signal.getsignal(signal.SIGTERM) is not before
    with pytest.raises(KeyboardInterrupt):
      with guard.step():
        os.kill(os.getpid(), signal.SIGTERM)
        done.append("rest of the step")
  assert done == ["rest of the step"]
  assert signal.getsignal(signal.SIGTERM) is before


def test_an_ignored_sigterm_stays_ignored():
  """A Slurm task's run ignores SIGTERM (the task passes it on as SIGINT): the guard leaves that
  alone, so one stop does not arrive as two interrupts (the second would not wait for the
  step)."""
  previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
  try:
    with InterruptGuard() as guard:
      assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
      with guard.step():
        os.kill(os.getpid(), signal.SIGTERM)
      assert not guard.pending
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
  finally:
    signal.signal(signal.SIGTERM, previous)


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


# ------------------------------------------------------------------ Ctrl-C while the loop trains
# The cheapest application with an evaluation (recommend's tiny preset, 20 steps), five steps a
# call: the calls end at 5, 10 (evaluated), 15 and 20.

def _recommend(**train):
  from experiments.configs import recommend as presets
  config = presets.get_config("tiny")
  config.train.update(dict(steps=20, log_every=100, eval_every=10, checkpoint_every=100,
                           steps_per_call=5))
  config.train.update(train)
  return config


def _train(workdir, config, *, ctrl_c_at=None, call_s=0.0):
  """Trains `config` in `workdir` (from its latest checkpoint, if any) through the loop, with
  Ctrl-C pressed inside the call that ends at step `ctrl_c_at` and each call taking at least
  `call_s` seconds. Returns the run (KeyboardInterrupt propagates)."""
  import time
  import jax
  from attn import training
  run = training.setup(config, str(workdir), task="recommend")

  def wrap(make, steps_of):
    def made():
      fn = make()

      def call(state, batches, *args):
        t0 = time.time()
        out = jax.block_until_ready(fn(state, batches, *args))
        time.sleep(max(0.0, call_s - (time.time() - t0)))
        if run.progress.step + steps_of(batches) == ctrl_c_at:
          _ctrl_c()  # held by the loop until the call has returned
        return out
      return call
    return made
  run.step_fn = wrap(run.step_fn, lambda batch: 1)
  run.steps_fn = wrap(run.steps_fn, lambda batches: jax.tree.leaves(batches)[0].shape[0])
  ckpt = training.Checkpoints(str(workdir))
  try:
    ckpt.restore(ckpt.latest, run)
    training.train(run, ckpt, training.MetricsWriter(str(workdir), resumed_step=run.progress.step))
  finally:
    ckpt.close()
  return run


def _saved(workdir):
  """The latest checkpoint's progress and state, as a resumed run restores them, and the tokens
  of the steps before it (what its train_tokens must be)."""
  from attn import training
  run = training.setup(_recommend(), str(workdir), task="recommend")
  ckpt = training.Checkpoints(str(workdir))
  try:
    assert ckpt.restore(ckpt.latest, run)
  finally:
    ckpt.close()
  tokens = sum(run.task.train_tokens(run.bundle, run.tc, s) for s in range(run.progress.step))
  return run.progress, run.state, tokens


def _eval_steps(workdir):
  import json
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [r["step"] for r in map(json.loads, f) if r["split"] == "eval"]


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
  """A run Ctrl-C'd inside the call that ends at its evaluation step (10), each call at least
  0.4 s: (workdir, the saved progress, the seconds train() ran, the tokens of steps 0-9)."""
  import time
  workdir = tmp_path_factory.mktemp("interrupted")
  t0 = time.time()
  with pytest.raises(KeyboardInterrupt):
    _train(workdir, _recommend(), ctrl_c_at=10, call_s=0.4)
  seconds = time.time() - t0
  progress, _, tokens = _saved(workdir)
  return workdir, progress, seconds, tokens


def test_ctrl_c_in_the_call_that_reaches_an_evaluation_leaves_it_due(interrupted, tmp_path):
  """The steps to 10 finished but its evaluation had not started: the checkpoint says it is due,
  and the resumed run evaluates step 10 first, choosing the best as the uninterrupted twin does
  (before, the resumed run evaluated only step 20)."""
  workdir, progress, _, _ = interrupted
  assert (progress.step, progress.eval_pending) == (10, True)
  resumed = _train(workdir, _recommend())
  twin = _train(tmp_path / "twin", _recommend())
  assert _eval_steps(workdir) == _eval_steps(tmp_path / "twin") == [10, 20]
  assert resumed.progress.best_step == twin.progress.best_step
  assert resumed.progress.best_score == twin.progress.best_score
  assert resumed.progress.train_tokens == twin.progress.train_tokens


def test_ctrl_c_saves_the_training_time_since_the_last_progress_line(interrupted):
  """No progress line, evaluation or save came before the Ctrl-C (log_every=100): the two calls
  of at least 0.4 s each are still counted in the saved wall_s (before, 0.0), and no more than
  the time train() ran; the tokens of the interrupted call are counted with its steps."""
  _, progress, seconds, tokens = interrupted
  assert 0.8 <= progress.wall_s <= seconds
  assert progress.train_tokens == tokens


def _train_rows(workdir):
  import json
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return {r["step"]: r for r in map(json.loads, f) if r["split"] == "train"}


def test_ctrl_c_before_a_progress_line_writes_it_so_the_resumed_run_leaves_no_hole(tmp_path):
  """Ctrl-C in the call that ends at step 10, a progress line's step (log_every=10): the line
  came after the call, so its train row was lost, and the resumed run, starting after step 10,
  logged only step 20. Now the interrupt writes it first: the same rows as the uninterrupted
  twin, step 10's the loss of the same step."""
  with pytest.raises(KeyboardInterrupt):
    _train(tmp_path / "run", _recommend(log_every=10), ctrl_c_at=10)
  assert sorted(_train_rows(tmp_path / "run")) == [10]
  _train(tmp_path / "run", _recommend(log_every=10))
  _train(tmp_path / "twin", _recommend(log_every=10))
  rows, twin = _train_rows(tmp_path / "run"), _train_rows(tmp_path / "twin")
  assert sorted(rows) == sorted(twin) == [10, 20]
  assert set(rows[10]) == set(twin[10]) and rows[10]["tokens_per_sec"] > 0
  for step in (10, 20):
    assert rows[step]["loss"] == pytest.approx(twin[step]["loss"], rel=1e-5), step

def test_ctrl_c_that_spends_the_time_budget_leaves_its_steps_evaluation_due(tmp_path):
  """The first call (at least 0.4 s) passes train.max_wall_s=0.3 and is Ctrl-C'd: its time is
  saved, so the resumed run trains no further, and it evaluates step 5 first, as the twin that
  the budget stopped at step 5 does."""
  with pytest.raises(KeyboardInterrupt):
    _train(tmp_path / "run", _recommend(max_wall_s=0.3), ctrl_c_at=5, call_s=0.4)
  progress, _, _ = _saved(tmp_path / "run")
  assert (progress.step, progress.eval_pending) == (5, True) and progress.wall_s >= 0.4
  resumed = _train(tmp_path / "run", _recommend(max_wall_s=0.3))
  twin = _train(tmp_path / "twin", _recommend(max_wall_s=0.3), call_s=0.4)
  assert resumed.progress.step == twin.progress.step == 5
  assert _eval_steps(tmp_path / "run") == _eval_steps(tmp_path / "twin") == [5]


def test_ctrl_c_after_the_run_diverged_keeps_the_last_good_checkpoint(tmp_path, caplog):
  """Trained well to a checkpoint at step 10, then resumed at learning rate 1e38: the Ctrl-C
  in the call to step 15 comes before any check of the loop, and the interrupt's own check
  refuses to save the diverged state (before, step 15 was saved with non-finite parameters
  and the good checkpoint dropped)."""
  import jax
  import numpy as np
  _train(tmp_path, _recommend(checkpoint_every=10, steps=10))
  with pytest.raises(KeyboardInterrupt):
    _train(tmp_path, _recommend(learning_rate=1e38, warmup_steps=1), ctrl_c_at=15)
  warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
  assert any(w.startswith("interrupted: training diverged at step 15")
             and "the last checkpoint is step 10" in w for w in warnings), warnings
  assert sorted(n for n in os.listdir(tmp_path / "checkpoints") if n.isdigit()) == ["10"]
  progress, state, _ = _saved(tmp_path)
  assert progress.step == 10
  assert all(np.isfinite(np.asarray(x, np.float64)).all() for x in jax.tree.leaves(state)
             if jax.numpy.issubdtype(x.dtype, jax.numpy.floating))
