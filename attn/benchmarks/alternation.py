"""Shell commands timed in alternation across checkouts of the repository: round after round,
each command runs once in every checkout, one after another, so a slow stretch of a shared host
falls on every side alike. This is how a regression between two commits is measured where a
run's wall time moves by more than the regression (`experiments.bench_alternate`).

A command runs in its checkout's directory with `{workdir}` replaced by a fresh temporary
directory, removed afterwards. `python -m experiments.X` there imports that checkout's `attn`
(the working directory leads sys.path). Every timing is appended to a JSON-lines file as soon as
it is taken, so a failed command or a Ctrl-C loses none of those before it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import shutil
import statistics
import subprocess
import tempfile
import time

from attn.common.tables import markdown_table
from attn.errors import AttnError, ConfigError


class CommandFailed(AttnError):
  """A timed command exited with a non-zero status."""


@dataclasses.dataclass(frozen=True)
class Timing:
  """One run of `command` in `checkout`: wall and CPU seconds (user + system, of the command
  and everything it started), the 1-minute load average after it, and its round."""
  command: str
  checkout: str
  round: int
  wall_s: float
  cpu_s: float
  load: float


def named_strings(text: str, flag: str) -> dict[str, str]:
  """A JSON object of names to strings (an ordered flag value), or a ConfigError naming `flag`."""
  try:
    value = json.loads(text)
  except json.JSONDecodeError as e:
    raise ConfigError(f"--{flag} is not JSON ({e}): {text!r}") from e
  if (not isinstance(value, dict) or not value
      or not all(isinstance(v, str) and v for v in value.values())):
    raise ConfigError(f"--{flag} must map names to non-empty strings, got {text!r}")
  return value


def check_checkouts(checkouts: dict[str, str]) -> None:
  """Every checkout is a directory (before anything is timed)."""
  for name, path in checkouts.items():
    if not os.path.isdir(path):
      raise ConfigError(f"checkout {name!r}: {path} is not a directory (git worktree add "
                        f"{path} <commit> makes one)")


def _children_cpu_s() -> float:
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  return usage.ru_utime + usage.ru_stime


def run_once(command: str, cwd: str, env: dict[str, str] | None = None) -> tuple[float, float]:
  """Runs `command` (a shell line; `{workdir}` becomes a fresh temporary directory) in `cwd`.
  Returns (wall s, CPU s); a CommandFailed with the end of its output when it fails."""
  workdir = tempfile.mkdtemp(prefix="alternation-")
  try:
    line = command.replace("{workdir}", workdir)
    cpu0, t0 = _children_cpu_s(), time.perf_counter()
    done = subprocess.run(line, shell=True, cwd=cwd, env={**os.environ, **(env or {})},
                          capture_output=True, text=True, check=False)
    wall, cpu = time.perf_counter() - t0, _children_cpu_s() - cpu0
  finally:
    shutil.rmtree(workdir, ignore_errors=True)
  if done.returncode:
    tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
    raise CommandFailed(f"exit status {done.returncode}: {line}\n" + "\n".join(tail))
  return wall, cpu


def alternate(commands: dict[str, str], checkouts: dict[str, str], rounds: int, *,
              env: dict[str, str] | None = None, record_path: str | None = None,
              say=print) -> list[Timing]:
  """`rounds` rounds; in each, every command once in every checkout, in the given orders.
  Appends each Timing to `record_path` (JSON lines) as it is taken."""
  if rounds < 1:
    raise ConfigError(f"--rounds must be >= 1, got {rounds}")
  check_checkouts(checkouts)
  out = []
  for r in range(1, rounds + 1):
    for name, command in commands.items():
      for checkout, path in checkouts.items():
        try:
          wall, cpu = run_once(command, path, env)
        except CommandFailed as e:
          raise CommandFailed(f"command {name!r} in checkout {checkout!r} ({path}), round {r}: "
                              f"{e}") from None
        t = Timing(name, checkout, r, wall, cpu, os.getloadavg()[0])
        out.append(t)
        if record_path:
          with open(record_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(dataclasses.asdict(t)) + "\n")
        say(f"round {r} {name} {checkout}: {wall:.2f} s wall, {cpu:.2f} s CPU "
            f"(load {t.load:.2f})", flush=True)
  return out


def summary(timings: list[Timing]) -> str:
  """Markdown: per command and checkout, the runs' mean, median and range of wall seconds, the
  mean CPU seconds, and the mean wall against the first checkout's."""
  rows, first = [], {}
  for name in dict.fromkeys(t.command for t in timings):
    for checkout in dict.fromkeys(t.checkout for t in timings):
      runs = [t for t in timings if t.command == name and t.checkout == checkout]
      if not runs:
        continue
      walls = [t.wall_s for t in runs]
      mean = statistics.fmean(walls)
      base = first.setdefault(name, mean)
      rows.append([name, checkout, str(len(runs)), f"{mean:.2f}", f"{statistics.median(walls):.2f}",
                   f"{min(walls):.2f}–{max(walls):.2f}",
                   f"{statistics.fmean(t.cpu_s for t in runs):.2f}", f"{mean / base:.2f}x"])
  return markdown_table(["command", "checkout", "runs", "mean wall s", "median", "range",
                         "mean CPU s", "vs the first checkout"], rows)
