r"""A one-node Slurm cluster on this machine, for tests/test_slurm.py and by hand.

    python tests/slurm_cluster.py                  # start it, show `sinfo`, stop it
    python tests/slurm_cluster.py -- bash          # a shell (or any command) with it up

`start(root)` writes a munge key and a one-node slurm.conf under `root` and starts munged,
slurmctld and slurmd from the Debian packages (`make slurm` installs slurm-wlm and munge where
the user is root with apt). Everything is this cluster's own: the daemons talk over 127.0.0.1 on
two free ports, munged listens on its own socket (slurm.conf's AuthInfo points the daemons and
the client commands at it), and state, spool, logs and pid files live under `root`, so a system
Slurm or munge, if any, is neither used nor disturbed. The client commands (sbatch, squeue,
scancel, srun) find the cluster through SLURM_CONF, which `Cluster.env` sets: nothing else about
a submission differs from a real cluster's.

The node has 2 CPUs (Slurm is told so whatever the hardware: SlurmdParameters=config_overrides),
one partition `cpu`, no accounting (no slurmdbd: jobs are watched with squeue, and launch.py
--collect reads the run directories, not sacct), no cgroups (proctrack/linuxproc, task/none: the
cgroup plugins need a cgroup.conf and a writable cgroup tree, and Slurm 22.05 cannot switch them
off). KillWait is Slurm's default: a cancelled or timed-out job gets SIGTERM, SIGKILL 30 s later.

The daemons run in the foreground as children of the process that started them, each with
PR_SET_PDEATHSIG, so they die with it even if it is killed outright; `stop()` first cancels every
job, then ends each daemon by the pid it started (and, as a second check, by its pid file), then
any process left that carries this cluster's SLURM_CONF (a job step, a job's own processes).
`running()` wraps start and stop for a `with` block and turns SIGTERM into KeyboardInterrupt
there, so that the stop runs when `timeout` ends the tests; what no process can catch (SIGKILL)
still takes the daemons along (PR_SET_PDEATHSIG), though not a job already running, which then
ends on its own. Where the cluster cannot come up (no binaries, not root, a daemon not ready in
time), `start` raises Unavailable with one line saying why.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scancel", "srun", "sinfo")
PARTITION = "cpu"
CPUS = 2
READY_S = 60  # how long the node may take to show as idle


class Unavailable(Exception):
  """The cluster cannot run here; the message is one line saying why."""


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _die_with_parent():
  """preexec_fn: SIGTERM this child when the process that started it exits (Linux prctl)."""
  libc = ctypes.CDLL(None, use_errno=True)
  libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _alive(pid: int) -> bool:
  try:
    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
      return f.read().split(") ")[-1][:1] not in ("Z", "X")  # a zombie has ended
  except OSError:
    return False


def _parent(pid: int) -> int:
  try:
    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
      return int(f.read().split(") ")[-1].split()[1])
  except (OSError, ValueError, IndexError):
    return 0


def _cmdline(pid: int) -> str:
  try:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
      return f.read().replace(b"\0", b" ").decode(errors="replace")
  except OSError:
    return ""


def config(root: str, host: str, ctld_port: int, slurmd_port: int) -> str:
  """slurm.conf for one node `host` at 127.0.0.1, everything under `root`."""
  return f"""\
# A one-node test cluster (tests/slurm_cluster.py); everything under {root}
ClusterName=attntest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/munge.socket
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
KillWait=30
MinJobAge=300
NodeName={host} NodeAddr=127.0.0.1 CPUs={CPUS} State=UNKNOWN
PartitionName={PARTITION} Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


class Cluster:
  """The running cluster under `root`: `env` for client commands, `stop()` to end it."""

  def __init__(self, root: str):
    self.root = root
    self.conf = os.path.join(root, "slurm.conf")
    self.env = dict(os.environ, SLURM_CONF=self.conf)
    self.procs: dict[str, subprocess.Popen] = {}
    self.version = ""

  def run(self, *cmd, check=True, timeout=60) -> str:
    """A client command against this cluster; its stdout."""
    p = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=timeout,
                       check=False)
    if check and p.returncode != 0:
      raise RuntimeError(f"{' '.join(cmd)}: exit status {p.returncode}: {p.stderr.strip()}")
    return p.stdout

  def _daemon(self, name, cmd):
    log = open(  # pylint: disable=consider-using-with
        os.path.join(self.root, "log", f"{name}.out"), "w", encoding="utf-8")
    self.procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, env=self.env,
                                        preexec_fn=_die_with_parent)
    log.close()

  def _wait(self, what, ready, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
      for name, p in self.procs.items():
        if p.poll() is not None:
          raise Unavailable(f"{name} exited ({p.returncode}) while waiting for {what}: "
                            f"{self.log_tail(name)}")
      if ready():
        return
      time.sleep(0.5)
    raise Unavailable(f"{what} not within {timeout} s: {self.log_tail('slurmctld')}")

  def log_tail(self, name) -> str:
    """The last line of a daemon's log (its own file, else its stdout)."""
    for path in (os.path.join(self.root, "log", f"{name}.log"),
                 os.path.join(self.root, "log", f"{name}.out")):
      try:
        with open(path, encoding="utf-8", errors="replace") as f:
          lines = f.read().strip().splitlines()
      except OSError:
        continue
      if lines:
        return lines[-1]
    return "(no log)"

  def start(self):
    root = self.root
    for d in ("munge", "state", "spool", "log"):
      os.makedirs(os.path.join(root, d), mode=0o700, exist_ok=True)
    key = os.path.join(root, "munge", "munge.key")
    with open(os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o400), "wb") as f:
      f.write(os.urandom(1024))
    host = socket.gethostname().split(".")[0]
    with open(self.conf, "w", encoding="utf-8") as f:
      f.write(config(root, host, _free_port(), _free_port()))
    self.version = subprocess.run(["slurmctld", "-V"], capture_output=True, text=True,
                                  check=False).stdout.strip()
    m = os.path.join(root, "munge")
    self._daemon("munged", ["munged", "--foreground", "--force", f"--socket={m}/munge.socket",
                            f"--key-file={key}", f"--pid-file={m}/munged.pid",
                            f"--seed-file={m}/munged.seed", f"--log-file={root}/log/munged.log"])
    self._wait("munged's socket", lambda: os.path.exists(f"{m}/munge.socket"), 20)
    self._daemon("slurmctld", ["slurmctld", "-D", "-i", "-f", self.conf])
    self._wait("slurmctld", lambda: subprocess.run(
        ["scontrol", "ping"], env=self.env, capture_output=True, text=True,
        check=False).stdout.count("UP") == 1, READY_S)
    self._daemon("slurmd", ["slurmd", "-D", "-N", host, "-f", self.conf])
    self._wait("the node to be idle", lambda: self.run(
        "sinfo", "-h", "-N", "-o", "%t", check=False).strip() == "idle", READY_S)
    return self

  def stop(self):
    """Cancels every job, then ends the daemons (by the pids started here, then by pid file);
    no daemon or job step of this cluster is left."""
    if self.procs.get("slurmctld") and self.procs["slurmctld"].poll() is None:
      with contextlib.suppress(Exception):
        jobs = self.run("squeue", "-h", "-o", "%A", check=False).split()
        if jobs:
          self.run("scancel", *jobs, check=False)
          deadline = time.time() + 40  # KillWait, and then some
          while time.time() < deadline and self.run("squeue", "-h", check=False).strip():
            time.sleep(0.5)
    for name in reversed(DAEMONS):  # slurmd, slurmctld, then munged, which they both need
      p = self.procs.get(name)
      if p is None:
        continue
      if p.poll() is None:
        p.terminate()
        try:
          p.wait(15)
        except subprocess.TimeoutExpired:
          p.kill()
          p.wait(5)
    for pid_file, name in (("slurmd.pid", "slurmd"), ("slurmctld.pid", "slurmctld"),
                           ("munge/munged.pid", "munged")):
      try:
        with open(os.path.join(self.root, pid_file), encoding="ascii") as f:
          pid = int(f.read().strip())
      except (OSError, ValueError):
        continue
      if _alive(pid) and name in _cmdline(pid):
        os.kill(pid, signal.SIGKILL)
    for pid in self.stragglers():
      with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
    self.procs = {}

  def stragglers(self) -> list:
    """Pids of live processes other than this one whose environment names this cluster's
    slurm.conf (what slurmd and the jobs inherit)."""
    mark = f"SLURM_CONF={self.conf}".encode()
    mine, pid = set(), os.getpid()  # this process and its ancestors: never
    while pid > 1 and pid not in mine:
      mine.add(pid)
      pid = _parent(pid)
    found = []
    for entry in os.listdir("/proc"):
      if not entry.isdigit() or int(entry) in mine:
        continue
      try:
        with open(f"/proc/{entry}/environ", "rb") as f:
          env = f.read().split(b"\0")
      except OSError:
        continue
      if mark in env and _alive(int(entry)):
        found.append(int(entry))
    return found


def why_not() -> str:
  """One line saying why the cluster cannot start here, or "" if it may."""
  missing = [b for b in DAEMONS + CLIENTS + ("scontrol",) if shutil.which(b) is None]
  if missing:
    return (f"no {', '.join(missing)} on PATH (`make slurm` installs slurm-wlm and munge where "
            "the user is root with apt)")
  if os.geteuid() != 0:
    return "the test cluster's daemons run as root (SlurmUser=root) and this is not root"
  return ""


def start(root: str) -> Cluster:
  """A running one-node cluster under `root`; Unavailable (one line) where it cannot run. A
  cluster that fails to come up is stopped before the exception leaves."""
  why = why_not()
  if why:
    raise Unavailable(why)
  cluster = Cluster(root)
  try:
    return cluster.start()
  except BaseException:
    cluster.stop()
    raise


def _interrupt(signum, frame):
  del signum, frame
  raise KeyboardInterrupt


@contextlib.contextmanager
def running():
  """A cluster in a fresh temporary directory for the `with` block (Unavailable if it cannot
  start); stopped and removed at its end, also on an exception, Ctrl-C or SIGTERM (`timeout`
  sends it), which the block turns into KeyboardInterrupt so that the stop runs."""
  root = tempfile.mkdtemp(prefix="attn-slurm-")  # short: a unix socket's path is <108 bytes
  main_thread = threading.current_thread() is threading.main_thread()
  previous = signal.signal(signal.SIGTERM, _interrupt) if main_thread else None
  try:
    cluster = start(root)
    try:
      yield cluster
    finally:
      if main_thread:  # a second Ctrl-C or SIGTERM must not cut the stop short
        held = [signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)]
      try:
        cluster.stop()
      finally:
        if main_thread:
          signal.signal(signal.SIGINT, held[0])
  finally:
    if main_thread:
      signal.signal(signal.SIGTERM, previous)
    shutil.rmtree(root, ignore_errors=True)


def main(argv) -> int:
  command = argv[argv.index("--") + 1:] if "--" in argv else []
  try:
    with running() as cluster:
      print(f"{cluster.version}: one node, {CPUS} CPUs, partition {PARTITION}; "
            f"SLURM_CONF={cluster.conf}", flush=True)
      if not command:
        print(cluster.run("sinfo"), end="", flush=True)
        return 0
      return subprocess.call(command, env=cluster.env)
  except Unavailable as e:
    print(f"slurm test cluster: {e}", file=sys.stderr)
    return 1


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
