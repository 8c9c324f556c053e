"""launch.py's Slurm launcher and `--distributed=auto` on a real one-node Slurm
(tests/slurm_cluster.py: slurm-wlm's munged, slurmctld and slurmd on this machine, 2 CPUs,
partition `cpu`).

Nothing is faked: launch.py writes the same sweep.sbatch a cluster gets and runs the `sbatch` on
PATH; the tests only set SLURM_CONF so that the client commands find this cluster, and wait for
jobs with squeue. Where the cluster cannot start (no slurm-wlm or munge: `make slurm` installs
them where the user is root with apt; not root; a daemon not up in time) every test here skips
with that one line.

The jobs are all submitted at once (the `jobs` fixture), so the two CPUs are kept busy, and each
test waits for those it reads: a 2-run smoke sweep and its --collect; a run cancelled with
scancel mid-run and resubmitted, against the same run uninterrupted; a run without its data
directory; a run that hits its 1-minute time limit, resubmitted. Then `srun -n 2` runs one
training as two processes joined by --distributed=auto. `make test-slurm` runs these (the
`slurm` marker: ~6 min on 2 cores shared with other work, so they are kept out of `make test`);
the launcher's own logic is pinned fast by tests/test_launch.py with a stand-in sbatch, and the
two fixes the real cluster exposed by the two fast tests at the end of this file.
"""

import concurrent.futures
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

import slurm_cluster
from attn.launching import launchers, rundirs, sweeps
from test_distributed import ARGS as DIST_ARGS
from test_distributed import _rows, _same_curve
from test_pinned_results import GOLDEN, _assert_matches

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = "--config=experiments/configs/translate.py:smoke"
MULTI30K = "--config=experiments/configs/translate.py:multi30k"  # a corpus read from data.dir
SLURM = ["--launcher=slurm", "--slurm_partition=cpu", "--slurm_cpus=1"]
# A smoke run long enough to be cancelled mid-run (~50 s of steps on a busy core): constant
# learning rate, one bucket, evaluated and saved only at its end, so a resumed run's only
# checkpoint is the one it saved when it was stopped.
LONG = ["--set=train.steps=5000", "--set=train.log_every=100", "--set=train.eval_every=5000",
        "--set=train.checkpoint_every=5000", "--set=train.schedule=constant",
        "--set=train.warmup_steps=1", "--set=data.num_buckets=1",
        "--set=model.rnn.decoder=bahdanau"]  # no sweep: the workdir is the run directory
# One that cannot finish within its 1-minute limit (10^6 steps): each attempt is stopped by it.
# (train.max_wall_s: should the test process be killed outright, taking slurmctld and its time
# limits along, the job still ends within minutes.)
ENDLESS = [a.replace("train.steps=5000", "train.steps=1000000") for a in LONG] + [
    "--set=train.max_wall_s=300"]
INTERRUPTED = 130  # attn/launching/cli.py: a run stopped by Ctrl-C (or Slurm, via the task)
JOB_S = 600  # the longest a test waits for its jobs

@pytest.fixture(scope="module")
def cluster():
  try:
    with slurm_cluster.running() as c:
      yield c
  except slurm_cluster.Unavailable as e:
    pytest.skip(f"no Slurm test cluster: {e}")


def launch(cluster, workdir, *args, config=SMOKE):
  """launch.py as a user runs it, with the cluster's SLURM_CONF; (exit status, stdout, stderr)."""
  p = subprocess.run([sys.executable, "launch.py", "--experiment=translate", config,
                      f"--workdir={workdir}", *args], cwd=REPO, env=cluster.env,
                     capture_output=True, text=True, timeout=300, check=False)
  return p.returncode, p.stdout, p.stderr


def submit(cluster, workdir, *args, config=SMOKE) -> str:
  """Submits a sweep; its job id."""
  rc, out, err = launch(cluster, workdir, *args, config=config)
  found = re.search(r"as Slurm job (\d+)", out)
  assert rc == 0 and found, out + err
  return found.group(1)


def wait(cluster, job, timeout=JOB_S):
  """Waits until job (every task of its array) has left the queue."""
  deadline = time.time() + timeout
  while cluster.run("squeue", "-h", "-j", job, check=False).strip():
    assert time.time() < deadline, cluster.run("squeue")
    time.sleep(1)


def record(run_dir):
  with open(os.path.join(run_dir, "launch.json"), encoding="utf-8") as f:
    return json.load(f)


def results(run_dir):
  with open(os.path.join(run_dir, "results.json"), encoding="utf-8") as f:
    return json.load(f)


def saved_steps(run_dir):
  """The checkpoint steps in a run directory (orbax's step directories, committed ones only)."""
  found = []
  for path, dirs, _ in os.walk(run_dir):
    found += [int(d) for d in dirs if d.isdigit() and "data_cache" not in path]
  return sorted(set(found))


def train_steps(run_dir):
  return [r["step"] for r in _rows(run_dir)]


def log_of(run_dir):
  with open(record(run_dir)["slurm_log"], encoding="utf-8", errors="replace") as f:
    return f.read()


# results.json fields and results.md columns that time the run: they differ from run to run.
_TIMED = ("wall_s", "tokens_per_s", "decode_s", "eval_s", "train_s", "steps_per_s")  # prefixes


def _untimed_fields(res):
  return {k: v for k, v in res.items()
          if not any(t in k for t in _TIMED) and k not in ("workdir", "command")}


def _untimed(md):
  """results.md's table rows with the columns whose header names a time blanked."""
  rows = [line.split("|") for line in md.splitlines() if line.startswith("|")]
  if not rows:
    return md
  header = [c.strip() for c in rows[0]]
  timed = {i for i, c in enumerate(header) if any(t in c for t in _TIMED) or c.endswith("_s")}
  return ["|".join("" if i in timed else c for i, c in enumerate(r)) for r in rows]


@pytest.fixture(scope="module")
def jobs(cluster, tmp_path_factory):
  """Every Slurm job of the module, submitted at once (the two that must be running early first,
  then the others side by side): {name: (workdir, job)}. The cancel run is cancelled by its
  test; the others run to their end."""
  root = tmp_path_factory.mktemp("slurm_runs")
  wd = {k: str(root / k) for k in ("limit", "cancel", "reference", "sweep", "failing")}
  first = {"limit": (ENDLESS + ["--slurm_time=1"], SMOKE), "cancel": (LONG, SMOKE)}
  rest = {"reference": (LONG, SMOKE), "sweep": (["--sweep=model.rnn.decoder=none,bahdanau"], SMOKE),
          "failing": ([f"--set=data.dir={root}/no_such_corpus"], MULTI30K)}
  out = {k: (wd[k], submit(cluster, wd[k], *args, *SLURM, config=config))
         for k, (args, config) in first.items()}
  with concurrent.futures.ThreadPoolExecutor(len(rest)) as pool:  # launch.py starts in ~10 s
    futures = {k: pool.submit(submit, cluster, wd[k], *args, *SLURM, config=config)
               for k, (args, config) in rest.items()}
  return {**out, **{k: (wd[k], f.result()) for k, f in futures.items()}}


@pytest.mark.slurm
def test_a_cancelled_task_is_resubmitted_alone_and_resumes_to_the_uninterrupted_figures(
    cluster, jobs):
  # First in the file: it must catch its run mid-way, while the others wait in the queue.
  wd, job = jobs["cancel"]
  run = wd
  deadline = time.time() + JOB_S
  while not any(s >= 100 for s in (train_steps(run) if os.path.exists(
      os.path.join(run, "metrics.jsonl")) else [])):
    assert time.time() < deadline and cluster.run("squeue", "-h", "-j", job).strip(), \
        "the run ended before it could be cancelled"
    time.sleep(0.2)
  cluster.run("scancel", job)
  wait(cluster, job)
  rec = record(run)
  stopped_at = saved_steps(run)
  assert rec["exit_code"] == INTERRUPTED, (rec, log_of(run)[-3000:])
  assert stopped_at and 100 <= stopped_at[-1] < 5000, stopped_at  # saved where it was stopped
  rc, out, _ = launch(cluster, wd, *LONG, *SLURM, "--collect")
  assert rc == 1 and f"failed: the last attempt exited {INTERRUPTED}" in out, out

  again = re.search(r"as Slurm job (\d+)", launch(cluster, wd, *LONG, *SLURM)[1]).group(1)
  assert again != job
  wait(cluster, again)
  assert f"resumed from step {stopped_at[-1]}" in log_of(run)
  steps = train_steps(run)
  assert len(steps) == len(set(steps)) and steps[-1] == 5000, steps

  ref_wd, ref_job = jobs["reference"]
  wait(cluster, ref_job)
  ref = ref_wd
  _same_curve(run, ref, range(100, 5001, 100))
  got, want = results(run), results(ref)
  for key in ("bleu", "chrf", "exact_match", "aer", "step", "best_step"):
    assert got[key] == pytest.approx(want[key], rel=1e-6), key
  rc, out, err = launch(cluster, wd, *LONG, *SLURM, "--collect")
  assert rc == 0 and "finished" in out, out + err


@pytest.mark.slurm
def test_a_sweep_through_the_slurm_array_gives_the_local_launchers_table(cluster, jobs, tmp_path):
  wd, job = jobs["sweep"]
  wait(cluster, job)
  args = ["--sweep=model.rnn.decoder=none,bahdanau", *SLURM]
  rc, out, err = launch(cluster, wd, *args, "--collect")
  assert rc == 0, out + err
  assert "[1/2] decoder=none: finished" in out and "[2/2] decoder=bahdanau: finished" in out
  for i, name in enumerate(("decoder=none", "decoder=bahdanau")):
    rec = record(os.path.join(wd, name))
    assert rec["exit_code"] == 0 and rec["slurm_job"] == f"{job}_{i}", rec
    assert "exit status 0" in log_of(os.path.join(wd, name))
  # The run on the cluster gives what the smoke preset gives in-process, to the last digit.
  with open(os.path.join(GOLDEN, "smoke_bahdanau.json"), encoding="utf-8") as f:
    golden = json.load(f)
  _assert_matches(results(os.path.join(wd, "decoder=bahdanau")), golden)
  md = open(os.path.join(wd, "results.md"), encoding="utf-8").read()
  bleu = {n: results(os.path.join(wd, n))["bleu"] for n in ("decoder=none", "decoder=bahdanau")}
  for name, value in bleu.items():
    assert f"| {name} | {value:.3f} |" in md, md
  # The same sweep through the local launcher: the same table, timing columns aside.
  local = str(tmp_path / "local")
  rc, out, err = launch(cluster, local, "--sweep=model.rnn.decoder=none,bahdanau")
  assert rc == 0, out + err
  with open(os.path.join(local, "results.md"), encoding="utf-8") as f:
    assert _untimed(f.read()) == _untimed(md)
  for name in bleu:
    _assert_matches(results(os.path.join(wd, name)),
                    _untimed_fields(results(os.path.join(local, name))))
  assert os.path.getsize(os.path.join(wd, "results.png")) > 1000
  # Rerunning the command submits nothing: both finished.
  rc, out, err = launch(cluster, wd, *args)
  assert rc == 0 and "submitted" not in out and out.count("finished before") == 2, out + err


@pytest.mark.slurm
def test_a_run_without_its_data_shows_as_failed_with_its_last_log_line(cluster, jobs):
  wd, job = jobs["failing"]
  wait(cluster, job)
  run = wd
  rec = record(run)
  assert rec["exit_code"] == 2, rec
  own = [l for l in log_of(run).splitlines() if l.strip() and not l.startswith("launch task: ")]
  assert own[-1].startswith("error: data directory") and "no_such_corpus" in own[-1], own[-3:]
  rc, out, _ = launch(cluster, wd, f"--set=data.dir={os.path.dirname(wd)}/no_such_corpus",
                      *SLURM, "--collect", config=MULTI30K)
  assert rc == 1
  (line,) = [l for l in out.splitlines() if l.startswith("[1/1] run: failed")]
  assert "the last attempt exited 2" in line and line.endswith(f"its last line: {own[-1]}"), line
  md = open(os.path.join(wd, "results.md"), encoding="utf-8").read()
  assert "| run | failed |" in md, md


@pytest.mark.slurm
def test_a_run_stopped_at_its_time_limit_saves_its_step_and_the_rerun_resumes(cluster, jobs):
  wd, job = jobs["limit"]
  run = wd
  wait(cluster, job)
  rec = record(run)
  first = saved_steps(run)
  assert rec["exit_code"] == INTERRUPTED, (rec, log_of(run)[-2000:])
  assert "DUE TO TIME LIMIT" in log_of(run)
  assert first and first[-1] > 0, first  # train.checkpoint_every is 5000: saved when stopped
  assert train_steps(run)[-1] <= first[-1]

  again = submit(cluster, wd, *ENDLESS, *SLURM, "--slurm_time=1")
  wait(cluster, again)
  assert f"resumed from step {first[-1]}" in log_of(run)
  second = saved_steps(run)
  assert record(run)["exit_code"] == INTERRUPTED and second[-1] > first[-1], second
  steps = train_steps(run)
  assert len(steps) == len(set(steps)) and steps == sorted(steps), steps


@pytest.mark.slurm
def test_srun_runs_one_training_as_two_processes(cluster, tmp_path, jobs):
  del jobs  # after the other jobs: srun waits for both CPUs
  one, two = str(tmp_path / "one"), str(tmp_path / "two")
  args = [sys.executable, "-m", "experiments.translate", *DIST_ARGS, "--config.train.steps=6"]
  env = {**cluster.env, "JAX_PLATFORMS": "cpu"}
  ref = subprocess.run([*args, f"--workdir={one}"], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=JOB_S, check=False)
  assert ref.returncode == 0, ref.stderr[-3000:]
  p = subprocess.run(["srun", "-n", "2", "--cpus-per-task=1", "--partition=cpu", *args,
                      f"--workdir={two}", "--distributed=auto"], cwd=REPO, env=env,
                     capture_output=True, text=True, timeout=JOB_S, check=False)
  assert p.returncode == 0, p.stderr[-3000:]
  assert "process 0 of 2: 1 local of 2 devices" in p.stderr, p.stderr[-3000:]
  _same_curve(two, one, range(1, 7))  # also refuses a step written twice
  assert p.stdout.count("| decoder |") == 1  # the results table: process 0 only
  assert results(two)["bleu"] == pytest.approx(results(one)["bleu"], abs=1e-6)
  with open(os.path.join(two, "predictions.txt"), encoding="utf-8") as f:
    assert len(f.read().splitlines()) == 16


def test_the_cluster_is_this_machines_alone(tmp_path):
  """Fast (no daemon starts): the config binds the cluster to 127.0.0.1, its own munge socket and
  files under its root, and says nothing of accounting a slurmdbd would hold."""
  conf = slurm_cluster.config(str(tmp_path), "node", 6817, 6818)
  assert f"AuthInfo=socket={tmp_path}/munge/munge.socket" in conf
  assert "SlurmctldHost=node(127.0.0.1)" in conf and "NodeAddr=127.0.0.1" in conf
  assert "AccountingStorageType=accounting_storage/none" in conf
  paths = re.findall(r"=(/\S+)", conf)
  assert paths and all(p.startswith(str(tmp_path)) for p in paths), paths


_SLEEPER = """import sys, time
try:
  print("ready", flush=True)
  time.sleep(60)
except KeyboardInterrupt:
  print("saved", flush=True)
  sys.exit(130)
"""


def test_a_slurm_stop_reaches_the_run_as_ctrl_c():
  """Fast twin of the cancel and time-limit tests: Slurm's SIGTERM to every process of the task
  (here: to the process group) lets the run save and exit as on Ctrl-C, and the task lives to
  record that status."""
  wrapper = ("import sys; from attn.launching.launchers import call_stopping_as_ctrl_c; "
             f"sys.exit(call_stopping_as_ctrl_c([sys.executable, '-c', {_SLEEPER!r}]))")
  p = subprocess.Popen([sys.executable, "-c", wrapper], cwd=REPO, stdout=subprocess.PIPE,
                       text=True, start_new_session=True)
  assert p.stdout.readline().strip() == "ready"
  os.killpg(p.pid, signal.SIGTERM)
  out, _ = p.communicate(timeout=30)
  assert (p.returncode, out.strip()) == (INTERRUPTED, "saved")


def test_collect_names_a_failed_runs_last_line_of_output(tmp_path):
  (run,) = sweeps.plan("translate", SMOKE.split("=", 1)[1], str(tmp_path), [], [], [], [])
  log = tmp_path / "slurm" / "7_0.out"
  log.parent.mkdir()
  log.write_text("loading\nerror: data directory '/x' does not exist\n"
                 f"{launchers.TASK_SAYS}{run.workdir}: exit status 2 after 3 s\n")
  (tmp_path / "launch.json").write_text(json.dumps(
      launchers.new_record(run, exit_code=2, slurm_log=str(log))))
  state, why = rundirs.status(run)
  assert state == "failed" and why == (
      f"the last attempt exited 2 (output: {log}); its last line: "
      "error: data directory '/x' does not exist")
