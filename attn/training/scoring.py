"""Scoring finished runs on any test split, with any of their kept checkpoints.

    rows = scoring.score_workdir("workdirs/m30k", splits=("test_2016_flickr", "test_2017_mscoco"),
                                 which="both", beam_size=5, data_dir="data/multi30k")

A run scores its own `data.test_split` when it finishes (results.json). This scores it again on
other splits of the same data (Multi30k's four test sets: `data.dir` must hold them, e.g. what
`experiments.get_data multi30k` wrote), with best/ and with the checkpoints kept at training-time
marks (attn.training.marks), so that several runs compare on every test set and at equal wall
time. The checkpoint of each row was chosen on the eval split only.

Each (checkpoint, split, beam) is decoded once: its scores go to
`<workdir>/scores/<checkpoint>/<split>.beam<K>.json` (and its outputs to `.txt`), which a rerun
reads instead of decoding again (`force=True` decodes again), but only while everything the
decoding depends on is the same (`decoding_key`: the data settings and the data directory's
files, the split, the checkpoint's step, the decoding settings and the length buckets).

A row: workdir, checkpoint ("best", "wall_600s"), step (the checkpoint's), wall_s (the run's
training time when the mark was passed; for best/, at the best step), split, beam_size, sentences, the task's
scores (BLEU, chrF, ...) and, for BLEU-scored tasks, `bleu_by_src_words`: corpus BLEU per bucket
of source length in words (whitespace-separated words of the raw source, so that runs with
different vocabularies, words or subwords, share buckets), with each bucket's sentence count.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import os
from typing import Callable

from attn.common import files
from attn.errors import ConfigError
from attn.evaluation import metrics as metrics_lib
from attn.training import averaging, evaluation, marks
from attn.training.checkpoints import restore_for_reading
from attn.training.building import load_run

log = logging.getLogger(__name__)

KINDS = ("best", "marks", "averaged")
SHOWN = ("bleu", "chrf", "rouge1", "rouge2", "rougeL")  # in the progress lines
ALIASES = {"both": ("best", "marks"), "all": KINDS}


@dataclasses.dataclass(frozen=True)
class Kept:
  """A checkpoint of a finished run: its name, directory (None: best/, else the latest) and the
  training time and step at which it was kept (None for best/: read from the checkpoint)."""
  name: str
  directory: str | None = None
  wall_s: float | None = None
  step: int | None = None


def _kinds(which: str) -> list[str]:
  """The checkpoint kinds a --checkpoints value names: comma-separated KINDS or an ALIASES key."""
  out = []
  for name in (n.strip() for n in which.split(",")):
    if name not in KINDS and name not in ALIASES:
      raise ConfigError(f"checkpoints={which!r}: {name!r} unknown; known: "
                        f"{', '.join((*KINDS, *ALIASES))}")
    out += [k for k in ALIASES.get(name, (name,)) if k not in out]
  return out


def kept_checkpoints(workdir: str, which: str) -> list[Kept]:
  """best/ ("best"), the kept marks ("marks"), the averaged checkpoint ("averaged",
  attn.training.averaging), in that order, of those `which` names (comma-separated; "both" =
  best,marks; "all"); a ConfigError when the workdir kept none of a kind asked for."""
  kinds = _kinds(which)
  out = [Kept("best")] if "best" in kinds else []
  if "marks" in kinds:
    found = [Kept(os.path.basename(path), path, float(info["wall_s"]), int(info["kept_step"]))
             for path, info in marks.kept(workdir)]
    if not found:
      raise ConfigError(f"{workdir} kept no checkpoint at a training-time mark (train it with "
                        "--config.train.mark_wall_s=600,1800,3600)")
    out += found
  if "averaged" in kinds:
    info = averaging.read_info(workdir)
    if info is None:
      raise ConfigError(f"{workdir} has no averaged checkpoint (write it with python -m "
                        f"experiments.average --workdirs={workdir} --last=5)")
    out.append(Kept(averaging.AVERAGED_DIR, averaging.averaged_dir(workdir),
                    float(info["wall_s"]), int(info["step"])))
  return out


def check_split_names(splits, flag: str) -> None:
  """ConfigError (one line) for a name of `splits` that is not a plain name: a split's decodings
  are written to scores/<checkpoint>/<split>.beam<K>.*, so a path separator or `..` would write
  them outside the run (`--splits=../../../x`). `flag`: the flag that gave them, for the
  message."""
  for split in splits:
    if split in ("", ".", "..") or any(c in split for c in ("/", "\\", os.sep, "\0")):
      raise ConfigError(f"--{flag}={','.join(splits)}: {split!r} is not a split name: a split is "
                        "named plainly (no path separator, not '.' or '..'), e.g. "
                        "test_2016_flickr")


def _cache_path(workdir: str, kept: Kept, split: str, beam_size: int, ext: str,
                search=None) -> str:
  check_split_names([split], "splits")  # (the entry point checks first: this guards the library)
  settings = "".join(f".{k}{v:g}" for k, v in sorted((search or {}).items()))
  return os.path.join(workdir, "scores", kept.name, f"{split}.beam{beam_size}{settings}.{ext}")


def _best_step(workdir: str) -> int | None:
  """The step best/ holds (its step directory's name), or None when it holds none."""
  try:
    steps = [int(n) for n in os.listdir(os.path.join(workdir, "best")) if n.isdigit()]
  except OSError:
    return None
  return max(steps, default=None)


def _files_of(directory: str) -> list:
  """[relative path, size, mtime in ns] of every file under `directory` (sorted; [] when it is
  not a directory): a change to any data file changes the list."""
  out = []
  for root, dirs, names in os.walk(directory):
    dirs.sort()
    for name in sorted(names):
      st = os.stat(os.path.join(root, name))
      out.append([os.path.relpath(os.path.join(root, name), directory), st.st_size,
                  st.st_mtime_ns])
  return out


def decoding_key(workdir: str, kept: Kept, split: str, beam_size: int, overrides: dict,
                 buckets) -> dict:
  """Everything a cached decoding of `workdir` depends on, as JSON: the run's data settings with
  `overrides` ({"data.dir": ..., "train.length_penalty": ...}) applied, the absolute data
  directory and its files (`_files_of`), the split, the checkpoint (name and step), the decoding
  settings (the train section with `overrides`), the beam and the length buckets. A cached
  decoding is read back only under an equal key."""
  recorded = files.read_json(os.path.join(workdir, "config.json")) or {}
  sections = {s: dict(recorded.get(s, {})) for s in ("data", "train")}
  for path, value in overrides.items():
    section, field = path.split(".")
    sections[section][field] = value
  data_dir = sections["data"].get("dir") or ""
  data_dir = os.path.abspath(data_dir) if data_dir else ""
  step = kept.step if kept.step is not None else _best_step(workdir)
  return json.loads(json.dumps({
      "data": sections["data"], "data_dir": data_dir,
      "data_files": _files_of(data_dir) if data_dir else [], "split": split,
      "checkpoint": [kept.name, step], "train": sections["train"], "beam_size": beam_size,
      "buckets": list(buckets)}, sort_keys=True))


def bucket_edges(lengths, width: int, min_count: int) -> list[int]:
  """Edges [e_0, ..., e_n] of buckets `width` wide over `lengths`, the sparse ends merged into
  their neighbours until the first and the last bucket hold at least `min_count` lengths (or one
  bucket is left): a BLEU over a handful of sentences says nothing."""
  lengths = sorted(int(x) for x in lengths)
  if not lengths:
    raise ValueError("no lengths to bucket")
  edges = list(range(lengths[0] // width * width, lengths[-1] + width + 1, width))
  count = lambda lo, hi: sum(lo <= x < hi for x in lengths)
  while len(edges) > 2 and count(edges[0], edges[1]) < min_count:
    del edges[1]
  while len(edges) > 2 and count(edges[-2], edges[-1]) < min_count:
    del edges[-2]
  return edges


def _decode_and_score(run, buckets) -> tuple[dict, list[str]]:
  """Scores of decoding the run's test split with `run.tc`'s search, and the outputs in order."""
  hyps = evaluation.decode_split(run, "test", search=run.tc.search())
  scores = {k: v for k, v in evaluation.score_outputs(run, "test", hyps).items()
            if isinstance(v, float)}
  ids = sorted(hyps.text)
  out = [hyps.text[i] for i in ids]
  scores["sentences"] = len(ids)
  if "bleu" in scores:
    sources, refs = run.bundle.sources("test"), run.bundle.references("test")
    words = [len(sources[i].split()) for i in ids]
    width, min_count = buckets
    scores["bleu_by_src_words"] = metrics_lib.bleu_by_bucket(
        out, [refs[i] for i in ids], words, bucket_edges(words, width, min_count),
        lowercase=bool(run.bundle.config.lowercase))
  return scores, out


def score_workdir(workdir: str, *, splits=(), which: str = "best", beam_size: int = 0,
                  data_dir: str = "", task: str = "translate", buckets=(5, 50), force: bool = False,
                  search: dict | None = None,
                  progress: Callable[[str], None] = log.info) -> list[dict]:
  """The rows (see the module docstring) of `workdir` on each of `splits` (() = its recorded
  test split) with the checkpoints `which` names; beam_size 0 = the run's train.beam_size;
  data_dir '' = the run's data.dir; buckets: (width in source words, fewest sentences in the
  first and last bucket), see `bucket_edges`; search: decoding settings of the train section
  replacing the run's ({"length_penalty": 0.6, "min_decode_len": 2}), kept in each row."""
  search = dict(search or {})
  if data_dir and not os.path.isdir(data_dir):
    raise ConfigError(f"data_dir={data_dir}: no such directory (the directory holding the splits "
                      f"to score {workdir} on; leave it empty for the run's recorded data.dir)")
  kept = kept_checkpoints(workdir, which)
  recorded = files.read_json(os.path.join(workdir, "config.json")) or {}
  splits = scored_splits(workdir, splits)
  beam = beam_size or int(recorded.get("train", {}).get("beam_size", 1))
  rows = []
  for split in splits:
    overrides = {"data.test_split": split, "data.eval_split": "", "train.beam_size": beam,
                 **{f"train.{k}": v for k, v in search.items()}}
    if data_dir:
      overrides["data.dir"] = data_dir
    keys = {k.name: decoding_key(workdir, k, split, beam, overrides, buckets) for k in kept}
    pending = [k for k in kept if force or (files.read_json(_cache_path(
        workdir, k, split, beam, "json", search)) or {}).get("key") != keys[k.name]]
    run = None
    if pending:
      # Loaded with the first checkpoint to decode; each later one is restored into the same
      # run, so its decoding functions compile once per split.
      run = load_run(workdir, task, overrides=overrides, checkpoint_dir=pending[0].directory)
    for k in kept:
      path = _cache_path(workdir, k, split, beam, "json", search)
      if k in pending:
        if k is not pending[0]:
          restore_for_reading(workdir, run, k.directory)  # (decoding reads run.state)
        scores, outputs = _decode_and_score(run, buckets)
        scores.update(buckets=list(buckets),
                      step=run.progress.step if k.step is None else k.step,
                      wall_s=run.progress.wall_s if k.wall_s is None else k.wall_s,
                      key=keys[k.name])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        files.write_text(_cache_path(workdir, k, split, beam, "txt", search),
                         "".join(o + "\n" for o in outputs))
        files.write_json(path, scores)
      scores = files.read_json(path)
      scores.pop("key")
      row = {"workdir": workdir, "checkpoint": k.name, "split": split, "beam_size": beam,
             **search, **scores}
      progress(f"{workdir} {k.name} (step {row['step']}, {row['wall_s'] / 60:.1f} min) {split} "
               f"beam {beam}{''.join(f', {n} {v:g}' for n, v in search.items())}: "
               + ", ".join(f"{m} {row[m]:.2f}" for m in SHOWN if m in row))
      rows.append(row)
  return rows


def scored_splits(workdir: str, splits=()) -> tuple[str, ...]:
  """The splits `score_workdir` scores: `splits`, or the run's recorded data.test_split."""
  recorded = files.read_json(os.path.join(workdir, "config.json")) or {}
  return tuple(splits) or (recorded.get("data", {}).get("test_split", ""),)


def decoded_split(workdir: str, split: str) -> str:
  """The name of the split the run in `workdir` decodes when scored on `split` (score_workdir
  sets its data.test_split to it), as the run's data source reads it: `split` itself for a
  corpus or a TFDS dataset, a built-in task's own test split whatever `split` names
  (attn.data.split_names). Reads config.json alone."""
  from attn import data  # pylint: disable=import-outside-toplevel
  recorded = files.read_json(os.path.join(workdir, "config.json")) or {}
  return data.split_names({**recorded.get("data", {}), "test_split": split}).get("test", split)


def check_tune_split(workdirs, tune_split: str, splits=()) -> None:
  """ConfigError when tuning on `tune_split` would decode a split a run is scored on (`splits`,
  else its recorded test split), compared as the run's data reads them (`decoded_split`: a
  built-in task decodes its own test split whatever either names): the settings would be
  chosen on the split they are scored on. Reads config.json alone: call it before decoding."""
  if not tune_split:
    return
  for workdir in workdirs:
    tuned = decoded_split(workdir, tune_split)
    for split in scored_splits(workdir, splits):
      if decoded_split(workdir, split) != tuned:
        continue
      given = (f"--splits={','.join(splits)}" if splits else
               f"its own test split (data.test_split={split}), which is scored when --splits is "
               "not given")
      if tuned == tune_split == split:
        why = ("the settings would be chosen on the split they are scored on; tune on another "
               "split (e.g. the dev split) or name other --splits")
      else:  # the data source reads both names as one split
        task = ((files.read_json(os.path.join(workdir, "config.json")) or {})
                .get("data", {}).get("task", ""))
        why = (f"data.task={task} decodes its own {tuned!r} split whatever split is named, so "
               "the settings would be chosen on the split they are scored on; score it without "
               "--tune_split")
      raise ConfigError(f"--tune_split={tune_split} is what {workdir} is scored on, {given}: "
                        f"{why}")


def tune_search(workdir: str, split: str, grid: dict, metric: str, **kw) -> tuple[dict, list]:
  """The decoding settings among `grid` ({"length_penalty": (0.0, 0.6, 1.0), ...}: every
  combination) under which best/ scores highest on `split` by `metric` (the first of equals),
  and the rows of every combination; **kw: score_workdir's (beam_size, data_dir, task, ...)."""
  names = sorted(grid)
  rows = []
  for values in itertools.product(*(grid[n] for n in names)):
    rows += score_workdir(workdir, splits=(split,), which="best",
                          search=dict(zip(names, values)), **kw)
  if any(metric not in r for r in rows):
    raise ConfigError(f"{workdir}'s scores on {split} have no {metric!r} to choose by")
  chosen = max(rows, key=lambda r: r[metric])  # max keeps the first of equals
  return {n: chosen[n] for n in names}, rows
