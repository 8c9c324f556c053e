r"""Where launch.py's runs execute: here, as subprocesses, or on a Slurm cluster as one job array.

launch.py decides which runs of a sweep still have to run (from their run directories) and hands
them to the launcher named by --launcher; the launcher writes each run's record,
<run dir>/launch.json (its experiment, config, overrides and command: what a rerun must match),
before the run starts, and the run's exit status into it when the run ends.

  local   each run is a subprocess `python -m experiments.<exp> ...`, --parallel at a time (default
          1). With one at a time the run prints to the terminal; with more, each
          run's stdout and stderr are appended to <run dir>/launch.log (so runs do not interleave)
          and launch prints one line when a run starts and one when it ends, plus the log's last
          lines when it fails.
  slurm   writes <workdir>/slurm/sweep.sbatch, a job array with one task per run (--parallel
          becomes the array's `%N`, the most tasks running at once), submits it with `sbatch` and
          prints the job id; each task's output goes to <workdir>/slurm/<job>_<task>.out. A task
          runs `python -m attn.launching.launchers <run dir>` (`task` below), which runs the command
          recorded in that run directory and records its exit status, exactly as the local launcher
          does, so `launch.py ... --collect` can tell finished, failed and pending runs apart.
          When Slurm stops a task (scancel, its time limit: SIGTERM to every process of the job,
          SIGKILL KillWait seconds later) the task passes the SIGTERM on to the run as Ctrl-C,
          so the run saves its current step before it exits.

Why an sbatch job array and not submitit: submitit submits Python callables, pickled with
cloudpickle, and returns their pickled results. Our runs are command lines that already resume
from their own checkpoints and leave their results in results.json, so that layer buys nothing
here; it would add two dependencies (submitit, cloudpickle) and a pickle that must load under the
same code on the node. The array script needs nothing beyond Slurm's sbatch interface, whose
`#SBATCH` options, `--array=0-N%P`, `%A_%a` and `$SLURM_ARRAY_TASK_ID`
(https://slurm.schedmd.com/job_array.html) have been stable for many releases; it is plain text a
user can read before submitting it. tests/test_launch.py drives it with a fake `sbatch` on PATH,
tests/test_slurm.py on a real one-node Slurm.

Launchers register by name in LAUNCHERS (an attn.registry.Registry: a name registers once, an
unknown one is a ConfigError listing the known). Each declares the launch.py flags only it reads
(FLAGS), so a flag given to the other launcher is a one-line usage error rather than silently
ignored.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

from attn.common.files import write_json, write_text
from attn.errors import ConfigError
from attn.registry import Registry

RECORD = "launch.json"  # per run directory: what launch ran there and how it ended
LOG = "launch.log"  # per run directory: the run's output when runs share the terminal
SLURM_DIR = "slurm"  # under --workdir: the array script and the tasks' output
TAIL = 5  # lines of a failed run's log printed under its "failed" line
TASK_SAYS = "launch task: "  # starts the lines a Slurm task adds to the run's output (its own end)

LAUNCHERS = Registry("launcher", error=ConfigError)


def register(name):
  """Class decorator: the launcher `name` (what --launcher says); a name registers once."""
  def decorator(cls):
    cls.name = name
    return LAUNCHERS.add(name, cls)
  return decorator


def make(opts):
  """The launcher --launcher names, configured from launch.py's flags. ConfigError (one line) for
  an unknown name, or a flag that belongs to another launcher."""
  try:
    cls = LAUNCHERS.get(opts.launcher)
  except ConfigError as e:
    raise ConfigError(f"--launcher={opts.launcher}: {e}") from None
  for _, other in LAUNCHERS.items():
    for flag in other.FLAGS:
      if flag not in cls.FLAGS and opts[flag].present:
        raise ConfigError(f"--{flag} applies to --launcher={other.name}, not "
                          f"--launcher={cls.name}")
  return cls(opts)


# ---------------------------------------------------------------------------------------------
# run records


def now():
  return datetime.datetime.now().isoformat(timespec="seconds")


def read_record(path):
  """(the JSON object in path, "") or (None, why not: missing, truncated, not an object)."""
  try:
    with open(path, encoding="utf-8") as f:
      obj = json.load(f)
  except FileNotFoundError:
    return None, f"no {path}"
  except (OSError, ValueError) as e:  # ValueError: bad JSON or bytes that are not UTF-8
    return None, f"{path} is unreadable ({type(e).__name__}: {e})"
  if not isinstance(obj, dict):
    return None, f"{path} is not a JSON object"
  return obj, ""


def new_record(run, **extra) -> dict:
  """launch.json for `run` before it starts: its identity (what a rerun must match), its command
  (without the interpreter) and no exit status yet."""
  return {**run.identity(), "command": run.command[1:], "exit_code": None, **extra}


def _ignore_sigterm():  # preexec_fn: an ignored signal stays ignored across exec
  signal.signal(signal.SIGTERM, signal.SIG_IGN)


def call_stopping_as_ctrl_c(cmd) -> int:
  """subprocess.call(cmd), except that a SIGTERM to this process reaches the child as SIGINT,
  and the child ignores SIGTERM itself. Slurm stops a job (scancel, its time limit) with SIGTERM
  to every process of the job, then SIGKILL KillWait seconds later (30 by default); a run dies
  at once on SIGTERM but saves its current step on Ctrl-C (attn/training/loop.py), so this gives
  it that window to save and exit with the interrupted status."""
  child, stop = [], []

  def on_term(*_):
    stop.append(True)
    for p in child:
      p.send_signal(signal.SIGINT)

  previous = signal.signal(signal.SIGTERM, on_term)  # before the child starts: none is lost
  try:
    child.append(subprocess.Popen(  # pylint: disable=consider-using-with
        cmd, preexec_fn=_ignore_sigterm))
    if stop:  # it came while the child was starting
      child[0].send_signal(signal.SIGINT)
    return child[0].wait()
  finally:
    signal.signal(signal.SIGTERM, previous)


def run_recorded(rec_path, rec, log=None, *, stopped_by_sigterm=False):
  """Runs `python <rec["command"]>`, recording its start, exit status and wall time in rec_path;
  (exit status, seconds). Output to the terminal, or appended to `log`. stopped_by_sigterm: a
  SIGTERM is passed on as Ctrl-C (`call_stopping_as_ctrl_c`, for a Slurm task)."""
  rec = {**rec, "exit_code": None, "started": now()}
  write_json(rec_path, rec)
  cmd = [sys.executable, *rec["command"]]
  t0 = time.time()
  if log is None:
    rc = call_stopping_as_ctrl_c(cmd) if stopped_by_sigterm else subprocess.call(cmd)
  else:
    with open(log, "a", encoding="utf-8") as f:
      f.write(f"== {rec['started']} {' '.join(cmd[1:])}\n")
      f.flush()
      rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT)
  secs = time.time() - t0
  write_json(rec_path, {**rec, "exit_code": rc, "wall_s": round(secs, 1)})
  return rc, secs


def log_lines(path) -> list:
  """The run's own lines of a log (without the lines a Slurm task adds after them); [] if none."""
  try:
    with open(path, encoding="utf-8", errors="replace") as f:
      lines = f.read().rstrip().splitlines()
  except OSError:
    return []
  return [l for l in lines if not l.startswith(TASK_SAYS)]


def tail(path, n=TAIL) -> str:
  """The last n lines of a log, indented, after a newline; "" if there is none."""
  return "".join(f"\n    {l}" for l in log_lines(path)[-n:])


# ---------------------------------------------------------------------------------------------
# the launchers


@register("local")
class Local:
  """Runs each run as a subprocess of launch.py, `parallel` at a time (threads, each waiting on
  one subprocess); the runs' outcomes are in their run directories when `start` returns."""
  FLAGS = ()

  def __init__(self, opts):
    self.parallel = opts.parallel or 1

  def start(self, jobs, workdir):  # pylint: disable=unused-argument
    """jobs: [(tag, run)] in grid order; runs them all and returns when every one has ended."""
    if self.parallel > 1:
      print(f"running {len(jobs)} runs, {min(self.parallel, len(jobs))} at a time; each run's "
            f"output goes to <run dir>/{LOG}", flush=True)
    with concurrent.futures.ThreadPoolExecutor(self.parallel) as pool:
      futures = [pool.submit(self.one, tag, run) for tag, run in jobs]
      try:
        for f in concurrent.futures.as_completed(futures):
          f.result()
      except BaseException:  # Ctrl-C (the running children get it too) or a bug: start no more
        for f in futures:
          f.cancel()
        raise

  def one(self, tag, run):
    os.makedirs(run.workdir, exist_ok=True)
    log = os.path.join(run.workdir, LOG) if self.parallel > 1 else None
    print(f"{tag}: started", flush=True)
    rc, secs = run_recorded(os.path.join(run.workdir, RECORD), new_record(run), log)
    if rc != 0:
      seen = f"; the end of {log}:{tail(log)}" if log else ""
      print(f"{tag}: failed (exit status {rc}) after {secs:.0f} s{seen}", flush=True)
      return
    _, why = read_record(os.path.join(run.workdir, "results.json"))
    if why:
      print(f"{tag}: failed: {why} after a clean exit", flush=True)
    else:
      print(f"{tag}: finished in {secs:.0f} s", flush=True)


_SLURM_TIME = re.compile(r"^(\d+-)?\d+(:\d+){0,2}$")  # sbatch --time: M, M:S, H:M:S, D-H[:M[:S]]
_SLURM_MEM = re.compile(r"^\d+[KMGT]?$", re.I)  # sbatch --mem: megabytes, or a K/M/G/T suffix


@register("slurm")
class Slurm:
  """Submits the runs as one Slurm job array (see the module docstring)."""
  FLAGS = ("slurm_partition", "slurm_time", "slurm_cpus", "slurm_gpus", "slurm_mem",
           "slurm_account", "slurm_extra")
  JOB_ID = re.compile(r"\b(\d+)\b")  # "Submitted batch job 12345" (or --parsable's "12345")

  def __init__(self, opts):
    self.parallel = opts.parallel  # None: no limit on array tasks running at once
    self.experiment = opts.experiment
    for value in [opts[f].value for f in self.FLAGS if f != "slurm_extra"] + opts.slurm_extra:
      if value is not None and "\n" in str(value):
        raise ConfigError(f"a --slurm_* value holds a line break: {value!r}")
    if opts.slurm_time is not None and not _SLURM_TIME.match(opts.slurm_time):
      raise ConfigError(f"--slurm_time={opts.slurm_time}: expects minutes, HH:MM:SS or "
                        "D-HH:MM:SS (sbatch --time)")
    if opts.slurm_mem is not None and not _SLURM_MEM.match(opts.slurm_mem):
      raise ConfigError(f"--slurm_mem={opts.slurm_mem}: expects a size such as 16G (sbatch --mem)")
    self.extra = []
    for line in opts.slurm_extra:
      option = line.removeprefix("#SBATCH").strip()
      if not option.startswith("-"):
        raise ConfigError(f"--slurm_extra={line}: expects an sbatch option such as --qos=high")
      self.extra.append(option)
    self.resources = [(option, value) for option, value in (
        ("--partition", opts.slurm_partition), ("--time", opts.slurm_time),
        ("--cpus-per-task", opts.slurm_cpus), ("--gpus", opts.slurm_gpus),
        ("--mem", opts.slurm_mem), ("--account", opts.slurm_account)) if value is not None]

  def directives(self, n, workdir) -> list:
    """The script's #SBATCH options for an array of n tasks."""
    array = f"0-{n - 1}" + (f"%{self.parallel}" if self.parallel else "")
    out = os.path.join(os.path.abspath(workdir), SLURM_DIR, "%A_%a.out")
    return ([f"--job-name={self.experiment}-{os.path.basename(os.path.abspath(workdir))}",
             f"--array={array}", f"--output={out}"]
            + [f"{option}={value}" for option, value in self.resources] + self.extra)

  def script(self, jobs, workdir) -> str:
    """The array script: #SBATCH lines, then RUNS, the table of run directories that
    $SLURM_ARRAY_TASK_ID indexes (each with its command as a comment)."""
    runs = [run for _, run in jobs]
    lines = ["#!/bin/bash",
             f"# Written by launch.py ({now()}): one array task per run in RUNS. Task i runs",
             "# `python -m attn.launching.launchers RUNS[i]`, which runs the command recorded in",
             f"# RUNS[i]/{RECORD} (shown after it) and records its exit status there.",
             *[f"#SBATCH {d}" for d in self.directives(len(runs), workdir)],
             "set -eu",
             f"cd {shlex.quote(os.getcwd())}",  # config paths and run dirs are relative to it
             "RUNS=(",
             *[f"  {shlex.quote(run.workdir)}  # {shlex.join(run.command[1:])}" for run in runs],
             ")",
             f'exec {shlex.quote(sys.executable)} -m attn.launching.launchers '
             '"${RUNS[$SLURM_ARRAY_TASK_ID]}"']
    return "\n".join(lines) + "\n"

  def start(self, jobs, workdir):
    """Records every run (launch.json, before submission), writes <workdir>/slurm/sweep.sbatch and
    submits it; prints the job id. ConfigError (one line) if there is no sbatch on PATH (nothing
    written then) or sbatch refuses the script."""
    sbatch = shutil.which("sbatch")
    if sbatch is None:
      raise ConfigError("--launcher=slurm: no sbatch on PATH (run launch.py where Slurm's commands "
                        "are, e.g. a login node)")
    if any(c.isspace() for c in os.path.abspath(workdir)):
      raise ConfigError(f"--workdir={workdir}: --launcher=slurm needs a path without spaces (it "
                        "goes into #SBATCH --output)")
    slurm_dir = os.path.join(workdir, SLURM_DIR)
    os.makedirs(slurm_dir, exist_ok=True)
    for _, run in jobs:
      os.makedirs(run.workdir, exist_ok=True)
      write_json(os.path.join(run.workdir, RECORD), new_record(run, submitted=now()))
    path = os.path.join(slurm_dir, "sweep.sbatch")
    write_text(path, self.script(jobs, workdir))
    p = subprocess.run([sbatch, path], capture_output=True, text=True, check=False)
    found = self.JOB_ID.search(p.stdout)
    if p.returncode != 0 or not found:
      said = " ".join((p.stderr.strip() or p.stdout.strip() or "no output").splitlines()[-1:])
      raise ConfigError(f"sbatch {path} failed (exit status {p.returncode}): {said}")
    job = found.group(1)
    for i, (_, run) in enumerate(jobs):  # a task may have started already: add, don't overwrite
      rec_path = os.path.join(run.workdir, RECORD)
      rec, _ = read_record(rec_path)
      write_json(rec_path, {**(rec or new_record(run)), "slurm_job": f"{job}_{i}",
                            "slurm_log": os.path.join(slurm_dir, f"{job}_{i}.out")})
    print(f"submitted {len(jobs)} run{'s' if len(jobs) > 1 else ''} as Slurm job {job} (array "
          f"0-{len(jobs) - 1}, {path}); output: {slurm_dir}/{job}_<task>.out", flush=True)


# ---------------------------------------------------------------------------------------------
# one array task


def task(run_dir) -> int:
  """What one Slurm array task runs: the command recorded in <run_dir>/launch.json, recording its
  exit status there (and the task's job id). A run that finished already (a resubmitted copy)
  exits 0 at once. When Slurm stops the task (scancel, its time limit) the run saves its current
  step, as on Ctrl-C, and its interrupted exit status is recorded; rerunning launch.py resubmits
  it and it resumes there. Returns the exit status."""
  rec_path = os.path.join(run_dir, RECORD)
  rec, why = read_record(rec_path)
  if rec is None or not isinstance(rec.get("command"), list):
    print(f"error: {why or f'{rec_path} records no command'}: launch.py writes it before it "
          "submits the run", file=sys.stderr)
    return 2
  done, _ = read_record(os.path.join(run_dir, "results.json"))
  if rec.get("exit_code") == 0 and done is not None:
    print(f"{TASK_SAYS}{run_dir} finished already; nothing to do", flush=True)
    return 0
  job, index = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
  if job and index:
    rec["slurm_job"] = f"{job}_{index}"
  rc, secs = run_recorded(rec_path, rec, stopped_by_sigterm=True)
  print(f"{TASK_SAYS}{run_dir}: exit status {rc} after {secs:.0f} s", flush=True)
  return rc


if __name__ == "__main__":
  if len(sys.argv) != 2:
    print("usage: python -m attn.launching.launchers <run dir>  (what a Slurm array task of "
          "launch.py runs)", file=sys.stderr)
    sys.exit(2)
  sys.exit(task(sys.argv[1]))
