"""Checkpoints kept at training-time marks (`train.mark_wall_s`), for scores at equal wall time.

A run with `train.mark_wall_s=(600, 1800)` evaluates as soon as its training time (`wall_s`,
evaluations left out, counted across resumes) passes each mark, then copies the best checkpoint
so far (by the eval split, as best/ chooses) to `marks/wall_600s/`, `marks/wall_1800s/`: the
model a run stopped at that mark would have decoded the test split with. One hour-long run then
gives the 10-, 30- and 60-minute points of a BLEU-against-wall-time curve, each chosen on the
eval split only (`python -m experiments.score --checkpoints=marks`).

A mark already on disk is never taken again (a resumed run keeps the one it took); a run killed
between passing a mark and copying takes it at its next step. The copy goes to a temporary
directory first and is renamed, so a mark's directory is complete or absent.
"""

from __future__ import annotations

import json
import os
import shutil

from attn.training import distributed

MARKS_DIR = "marks"
INFO = "mark.json"


def mark_name(seconds: float) -> str:
  return f"wall_{seconds:g}s"


def mark_dir(workdir: str, seconds: float) -> str:
  return os.path.join(os.path.abspath(workdir), MARKS_DIR, mark_name(seconds))


def due(workdir: str, marks, wall_s: float) -> list[float]:
  """The marks `wall_s` has passed whose checkpoint is not kept yet."""
  return [m for m in marks if wall_s >= m and not os.path.isdir(mark_dir(workdir, m))]


def keep(ckpt, run, seconds: float) -> None:
  """Copies best/'s checkpoint (else the latest, for a run without an eval split) to the mark's
  directory, with mark.json: the mark, the run's training time and step when it passed, and
  the kept checkpoint's step and eval scores."""
  manager = ckpt.best if ckpt.best.latest_step() is not None else ckpt.latest
  step = manager.latest_step()
  if step is None:
    raise ValueError(f"no checkpoint to keep at the {seconds:g} s mark (save one first)")
  if not distributed.is_primary():
    return
  target = mark_dir(run.workdir, seconds)
  tmp = target + ".tmp"
  shutil.rmtree(tmp, ignore_errors=True)  # left by a copy that was cut off
  shutil.copytree(os.path.join(str(manager.directory), str(step)), os.path.join(tmp, str(step)))
  p = run.progress
  info = {"mark_s": seconds, "wall_s": p.wall_s, "step": p.step, "kept_step": step,
          "kept_eval": p.best_eval if manager is ckpt.best else {}}
  with open(os.path.join(tmp, INFO), "w") as f:
    json.dump(info, f, indent=1)
  os.replace(tmp, target)


def kept(workdir: str) -> list[tuple[str, dict]]:
  """[(mark directory, its mark.json)] of the workdir's kept marks, by mark time."""
  root = os.path.join(os.path.abspath(workdir), MARKS_DIR)
  out = []
  for name in sorted(os.listdir(root)) if os.path.isdir(root) else ():
    path = os.path.join(root, name)
    info = os.path.join(path, INFO)
    if name.startswith("wall_") and not name.endswith(".tmp") and os.path.exists(info):
      with open(info) as f:
        out.append((path, json.load(f)))
  return sorted(out, key=lambda x: x[1]["mark_s"])
