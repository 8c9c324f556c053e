"""Decoding speed of a finished run of an application whose task decodes (translation,
summarization, captioning, any later one whose task is a `Seq2SeqTask`): the whole split per beam
size, and the task's own score of what it decodes (entry point: experiments/bench_decode.py).

Restores the run as the test decoding does (`loop.load_run`: the best checkpoint, else the
latest, with the run's compute dtype), then per beam size (and beam search stop rule, `stops`)
decodes the whole split once untimed, so every batch shape is compiled, and times `rounds`
further passes, round-robin over them (1, 5, 1, 5, ...: load from other jobs on a shared
machine hits each alike). A pass is what the run's own decoding does on the device
(`evaluation.dispatch_split`: every batch dispatched, then every output waited for with
block_until_ready); turning ids into text is not timed.
`compile_s` is the untimed first pass's time less the median timed pass (compilation,
first-call warm-up, and the first pass's reading of the outputs as text, which the timed passes
leave out). The searches are the run's (its length penalty, constraints and stop rule unless
`stops` names others), without the attention history unless `attention` is set, shrinking the
batch as examples finish when `shrink_to` is set (the tokens are the same either way). The score
beside each time is the task's own (the first of its `scores`: BLEU for translation, ROUGE-1 for
summarization, digit accuracy for captioning), from the task's scoring of the decoded text as in
the run's results.json; the record names it (`score`) and each result holds it under that name.
A run of an application whose task decodes nothing (recommendation, retrieval, the focus demo)
is refused before anything is loaded. Every figure goes with the load average.
"""

from __future__ import annotations

import dataclasses
import os
import time

import jax
import numpy as np

from attn.benchmarks import harness
from attn.common import applications, files
from attn.config.configurable import option
from attn.decoding.beam import STOP_RULES
from attn.errors import ConfigError, DataError


@dataclasses.dataclass(frozen=True)
class Settings:
  """The benchmark's settings (experiments/bench_decode.py's flags)."""
  workdir: str | None = option(None, "A finished run's directory (results.json), of an "
                               "application whose task decodes (translate, summarize, caption).")
  split: str = option("test", "The split to decode: test or eval.")
  beam_sizes: tuple[int, ...] = option((1, 5), "Beam sizes to time (1 = greedy).")
  rounds: int = option(1, "Timed passes over the split per beam size, round-robin.")
  json_out: str = option("", "Where to write the figures as JSON (none when empty).")
  shrink_to: int = option(0, "Finished examples leave the batch, halving it down "
                          "to this many rows (0 = never, as the run's own decoding). The same "
                          "outputs; each halving is one more loop to compile.")
  stops: tuple[str, ...] = option(
      ("run",), "Beam search stop rules to time, each with every beam size above 1: run (the "
      "run's own train.beam_stop), bound (exact) or k_finished (once K hypotheses have "
      "finished, as fairseq and JoeyNMT stop). Greedy has no stop rule: timed once.")
  attention: bool = option(False, "Also record each step's attention, as the run's test "
                           "decoding does for attention.npz (default: the outputs only, as the "
                           "evaluations during training decode; the same tokens).")

  def __post_init__(self):
    if not self.workdir:
      raise ConfigError("--workdir is required: the directory of a finished run whose task "
                        "decodes")
    if not self.beam_sizes or min(self.beam_sizes) < 1:
      raise ConfigError(f"--beam_sizes must be integers >= 1, got {list(self.beam_sizes)}")
    if self.rounds < 1:
      raise ConfigError(f"--rounds must be >= 1, got {self.rounds}")
    if self.shrink_to < 0:
      raise ConfigError(f"--shrink_to must be >= 0, got {self.shrink_to}")
    known = ("run",) + tuple(STOP_RULES)
    if not self.stops or any(x not in known for x in self.stops):
      raise ConfigError(f"--stops={','.join(self.stops)}: each must be one of "
                        f"{', '.join(known)}")
    if self.split not in ("test", "eval"):
      raise ConfigError(f"--split must be test or eval, got {self.split!r}")


def decoding_applications() -> list[str]:
  """The registered applications whose task decodes (a `Seq2SeqTask`: it encodes a source and
  decodes a target), the runs bench_decode reads."""
  from attn.training.seq2seq_task import Seq2SeqTask  # pylint: disable=import-outside-toplevel
  return [name for name, entry in applications.registry().items()
          if entry.task is not None and issubclass(entry.task_class, Seq2SeqTask)]


def application(s: Settings) -> str:
  """The application of the run in `s.workdir`, read from its records alone (application.json,
  launch.json, its scores or its application's results file; translate when none says): a
  WorkdirError when it is no directory, a ConfigError when its task decodes nothing or it names
  no registered application. Nothing is loaded."""
  from attn.launching import entry_points  # pylint: disable=import-outside-toplevel
  from attn.training import workdir  # pylint: disable=import-outside-toplevel
  if not os.path.isdir(s.workdir):
    raise workdir.WorkdirError(f"{s.workdir} is not a directory: pass a finished run of an "
                               f"application whose task decodes "
                               f"({', '.join(decoding_applications())}; its workdir holds "
                               "results.json)")
  name = (workdir.recorded_application(s.workdir) or entry_points.experiment_of(s.workdir)
          or "translate")
  applications.app(name)  # ConfigError listing the known applications if it is none of them
  decoding = decoding_applications()
  if name not in decoding:
    raise ConfigError(f"{s.workdir} holds a {name} run, whose task decodes nothing: "
                      "bench_decode times a run's decoding of its split and reads the run's "
                      "config.json, vocabularies and best checkpoint, and its task's own score, "
                      f"of an application whose task decodes ({', '.join(decoding)})")
  return name


def load(s: Settings, name: str):
  """The finished run of `s.workdir`, of application `name` (WorkdirError naming what is
  missing)."""
  from attn.training import loop  # pylint: disable=import-outside-toplevel
  run = loop.load_run(s.workdir, task=name)
  if s.split not in run.bundle.splits:
    raise DataError(f"{s.workdir} has no {s.split} split to decode")
  return run


def timed_pass(run, role, search) -> float:
  """Seconds to decode the whole split on the device (every output ready)."""
  from attn.training import evaluation  # pylint: disable=import-outside-toplevel
  t0 = time.perf_counter()
  jax.block_until_ready([res for _, res in evaluation.dispatch_split(run, role, search=search)])
  return time.perf_counter() - t0


def run(s: Settings) -> dict:
  """The benchmark: prints each figure with the load average and returns the JSON record
  (also written to s.json_out)."""
  from attn.training import evaluation  # pylint: disable=import-outside-toplevel
  name = application(s)  # a run that decodes nothing is refused before anything runs
  load_start = harness.loadavg()
  machine = harness.machine()
  print(f"load average at start: {load_start} ({os.cpu_count()} CPUs); "
        f"{harness.cpu_line(machine['cpu'])}")
  run_ = load(s, name)
  score = run_.task.scores[0]  # the task's own score (attn.training.task.Task.scores)
  base = run_.tc.search()
  stops = list(dict.fromkeys(base.stop if x == "run" else x for x in s.stops))
  # (beam size, stop rule) -> search; greedy once, its stop rule the run's (it has none).
  searches = {(k, stop): dataclasses.replace(base, beam_size=k, attention=s.attention,
                                             shrink_to=s.shrink_to, stop=stop)
              for k in s.beam_sizes for stop in (stops if k > 1 else [base.stop])}
  label = lambda k, stop: f"beam {k}" + (f" ({stop})" if k > 1 and len(stops) > 1 else "")
  first, scored, words, n = {}, {}, {}, 0
  for key, search in searches.items():
    t0 = time.perf_counter()
    hyps = evaluation.decode_split(run_, s.split, search=search)  # compiles every shape
    first[key] = time.perf_counter() - t0
    scored[key] = float(evaluation.score_outputs(run_, s.split, hyps)[score])
    n = len(hyps.text)
    # Seconds depend on how much text comes out: words (whitespace-separated, the decoded text)
    # let two systems emitting different lengths be compared per word.
    words[key] = sum(len(t.split()) for t in hyps.text.values()) / max(n, 1)
    print(f"{label(*key)}: first pass (compiling) {first[key]:.1f} s, {score} "
          f"{scored[key]:.4g} (load {harness.loadavg()})")
  times = {key: [] for key in searches}
  for rnd in range(s.rounds):
    for key, search in searches.items():
      times[key].append(timed_pass(run_, s.split, search))
      print(f"  round {rnd + 1} {label(*key)}: {times[key][-1]:.2f} s, "
            f"{n / times[key][-1]:.0f} sentences/s (load {harness.loadavg()})")
  results = []
  for key, ts in times.items():
    t = float(np.median(ts))
    results.append({"beam_size": key[0], "stop": key[1], "decode_s": t, "sentences_per_s": n / t,
                    score: scored[key], "mean_words": words[key],
                    "words_per_s": words[key] * n / t,
                    "compile_s": max(first[key] - t, 0.0), "decode_s_all": ts})
  record = {"application": name, "score": score, "sentences": n, "split": s.split,
            "workdir": s.workdir, "compute_dtype": run_.tc.compute_dtype,
            "attention": s.attention, "shrink_to": s.shrink_to,
            "load": {"start": load_start, "end": harness.loadavg()},
            "machine": machine, "results": results}
  for r in results:
    print(f"{label(r['beam_size'], r['stop'])}: {r['decode_s']:.2f} s for {n} sentences "
          f"({r['sentences_per_s']:.0f}/s), compile {r['compile_s']:.1f} s, {score} "
          f"{r[score]:.4g}")
  print(f"load average at end: {record['load']['end']}")
  if s.json_out:
    files.write_json(s.json_out, record)
    print(f"wrote {s.json_out}")
  return record
