"""What a sweep's run directories hold: whether each run is new, finished, failed, still pending,
or belongs to another config (its launch.json records other settings) and must be refused."""

from __future__ import annotations

import os

from attn.launching.launchers import LOG, RECORD, SLURM_DIR, log_lines, read_record

RESULTS = "results.json"  # what a finished run leaves in its directory
# launch's own files in a workdir: they do not make a directory someone else's run.
OWN_FILES = ("results.md", "results.png", RECORD, LOG, SLURM_DIR)


def differences(recorded: dict, current: dict) -> list:
  """'what: before -> now' for each part of the two identities that differs."""
  out = [f"--{part} {recorded.get(part)!r} -> {current[part]!r}"
         for part in ("experiment", "config") if recorded.get(part) != current[part]]
  old, new = recorded.get("overrides") or {}, current["overrides"]
  show = lambda v: "(unset)" if v is None else v  # pylint: disable=unnecessary-lambda-assignment
  for k in list(old) + [k for k in new if k not in old]:
    if old.get(k) != new.get(k):
      out.append(f"{k}: {show(old.get(k))} -> {show(new.get(k))}")
  return out


def unfinished(rec) -> str:
  """Why a run recorded without an exit status has none."""
  job = rec.get("slurm_job")
  if not rec.get("started"):
    if job:
      return f"submitted as Slurm job {job} and not started (if still queued: scancel {job})"
    return "recorded but never started (its submission failed or was interrupted)"
  where = f" as Slurm job {job}" if job else ""
  return (f"started {rec['started']}{where} and recorded no exit status (still running, or "
          "stopped: interrupted, or at its time limit)")


def _unrecorded(run):
  """The status of a run directory without launch.json: new if empty, else someone else's."""
  present = sorted(f for f in os.listdir(run.workdir) if f not in OWN_FILES
                   and not f.startswith(".")) if os.path.isdir(run.workdir) else []
  if present:
    return "refuse", (f"{run.workdir} holds a run launch did not start (no {RECORD}; it has "
                      f"{', '.join(present[:4])}{', ...' if len(present) > 4 else ''}), so its "
                      "config is unknown: use a new --workdir")
  return "new", ""


def status(run):
  """What the run directory holds, as (state, detail):
  ("new", "") nothing yet; ("done", results) finished by this command;
  ("failed", why) the last attempt exited non-zero (why ends with its output's last line), or
  cleanly without a readable results.json;
  ("pending", why) recorded without an exit status yet (submitted, running or interrupted);
  ("refuse", why) another config's run, or one launch did not start."""
  rec_path = os.path.join(run.workdir, RECORD)
  if not os.path.exists(rec_path):
    return _unrecorded(run)
  rec, why = read_record(rec_path)
  if rec is None:
    return "refuse", f"{why}, so the config of {run.workdir} is unknown: use a new --workdir"
  diff = differences(rec, run.identity())
  if diff:
    return "refuse", (f"{run.workdir} was run with other settings ({'; '.join(diff)}) and holds "
                      "that config's checkpoints: use a new --workdir for the new settings")
  if rec.get("exit_code") is None:
    return "pending", unfinished(rec)
  log = rec.get("slurm_log") or os.path.join(run.workdir, LOG)
  seen = f" (output: {log})" if os.path.exists(log) else ""
  if rec["exit_code"] != 0:
    last = log_lines(log)[-1:]  # most often the error line
    said = f"; its last line: {last[0].strip()}" if last else ""
    return "failed", f"the last attempt exited {rec['exit_code']}{seen}{said}"
  res, why = read_record(os.path.join(run.workdir, RESULTS))
  if res is None:
    return "failed", f"{why}{seen}: not finished"
  return "done", res


def survey(runs, collect):
  """Prints what each run directory holds; the [(tag, run)] to start (none with collect)."""
  todo = []
  for i, run in enumerate(runs, 1):
    tag = f"[{i}/{len(runs)}] {run.name}"
    state, detail = status(run)
    if collect:
      print(f"{tag}: " + {"done": "finished", "new": "not started"}.get(
          state, f"{'refused' if state == 'refuse' else state}: {detail}"), flush=True)
      continue
    print(f"{tag}: {' '.join(run.command[1:])}", flush=True)
    if state == "done":
      print(f"{tag}: finished before; its results.json is reused", flush=True)
    elif state == "refuse":
      print(f"{tag}: refused: {detail}", flush=True)
    else:
      if detail:
        print(f"{tag}: {detail}; running it again (it resumes from its checkpoint)", flush=True)
      todo.append((tag, run))
  return todo
