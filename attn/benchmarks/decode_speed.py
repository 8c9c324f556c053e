"""Decoding speed of a finished translate run: the whole split per beam size, and the BLEU it gets
(entry point: experiments/bench_decode.py).

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
batch as examples finish when `shrink_to` is set (the tokens are the same either way). BLEU comes from the task's own
scoring of the decoded text, as in the run's results.json. Every figure goes with the load
average.
"""

from __future__ import annotations

import dataclasses
import os
import time

import jax
import numpy as np

from attn.benchmarks import harness
from attn.common import files
from attn.config.configurable import option
from attn.decoding.beam import STOP_RULES
from attn.errors import ConfigError, DataError


@dataclasses.dataclass(frozen=True)
class Settings:
  """The benchmark's settings (experiments/bench_decode.py's flags)."""
  workdir: str | None = option(None, "A finished translate run's directory (results.json).")
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
      raise ConfigError("--workdir is required: a finished translate run's directory")
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


def load(s: Settings):
  """The finished run of `s.workdir` (WorkdirError naming what is missing)."""
  from attn.training import loop, workdir  # pylint: disable=import-outside-toplevel
  if not os.path.isdir(s.workdir):
    raise workdir.WorkdirError(f"{s.workdir} is not a directory: pass a finished translate run "
                               "(its workdir holds results.json)")
  from attn.launching import entry_points  # pylint: disable=import-outside-toplevel
  from attn.training.seq2seq_task import Seq2SeqTask  # pylint: disable=import-outside-toplevel
  experiment = entry_points.experiment_of(s.workdir) or "translate"
  if not issubclass(entry_points.experiment(experiment).task_class, Seq2SeqTask):
    raise ConfigError(f"{s.workdir} is a {experiment} run, which decodes nothing: bench_decode "
                      "times the decoding of a sequence-to-sequence run")
  run = loop.load_run(s.workdir, task=experiment)
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
  load_start = harness.loadavg()
  machine = harness.machine()
  print(f"load average at start: {load_start} ({os.cpu_count()} CPUs); "
        f"{harness.cpu_line(machine['cpu'])}")
  run_ = load(s)
  base = run_.tc.search()
  stops = list(dict.fromkeys(base.stop if x == "run" else x for x in s.stops))
  # (beam size, stop rule) -> search; greedy once, its stop rule the run's (it has none).
  searches = {(k, stop): dataclasses.replace(base, beam_size=k, attention=s.attention,
                                             shrink_to=s.shrink_to, stop=stop)
              for k in s.beam_sizes for stop in (stops if k > 1 else [base.stop])}
  label = lambda k, stop: f"beam {k}" + (f" ({stop})" if k > 1 and len(stops) > 1 else "")
  first, bleu, words, n = {}, {}, {}, 0
  for key, search in searches.items():
    t0 = time.perf_counter()
    hyps = evaluation.decode_split(run_, s.split, search=search)  # compiles every shape
    first[key] = time.perf_counter() - t0
    bleu[key] = float(evaluation.score_outputs(run_, s.split, hyps)["bleu"])
    n = len(hyps.text)
    # Seconds depend on how much text comes out: words (whitespace-separated, the decoded text)
    # let two systems emitting different lengths be compared per word.
    words[key] = sum(len(t.split()) for t in hyps.text.values()) / max(n, 1)
    print(f"{label(*key)}: first pass (compiling) {first[key]:.1f} s, BLEU {bleu[key]:.2f} "
          f"(load {harness.loadavg()})")
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
                    "bleu": bleu[key], "mean_words": words[key],
                    "words_per_s": words[key] * n / t,
                    "compile_s": max(first[key] - t, 0.0), "decode_s_all": ts})
  record = {"sentences": n, "split": s.split, "workdir": s.workdir,
            "compute_dtype": run_.tc.compute_dtype, "attention": s.attention,
            "shrink_to": s.shrink_to,
            "load": {"start": load_start, "end": harness.loadavg()},
            "machine": machine, "results": results}
  for r in results:
    print(f"{label(r['beam_size'], r['stop'])}: {r['decode_s']:.2f} s for {n} sentences "
          f"({r['sentences_per_s']:.0f}/s), compile {r['compile_s']:.1f} s, BLEU {r['bleu']:.2f}")
  print(f"load average at end: {record['load']['end']}")
  if s.json_out:
    files.write_json(s.json_out, record)
    print(f"wrote {s.json_out}")
  return record
