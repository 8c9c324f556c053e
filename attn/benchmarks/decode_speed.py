"""Decoding speed of a finished run of an application whose task decodes (translation,
summarization, captioning, any later one whose task is a `Seq2SeqTask`): the whole split per beam
size, and the task's own score of what it decodes (entry point: experiments/bench_decode.py).

Restores the run as the test decoding does (`building.load_run`: the best checkpoint, else the
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
Beside each time, the matmul work along the outputs (`output_work`: the encoder once an example
and K decoder rows a step per output token, no padding; what any implementation of the model
must multiply to emit those outputs) and the rate the pass did it at, against the bare-matmul
ceiling in the run's compute dtype measured before the timed passes and after them (as
bench_train reads its own): how far a decoding time is from what the CPU allows. Beside that,
the model's decoding step timed alone (`step_alone`, `step_steps` steps on the split's first
batch at each beam size's rows, apart from the search): the rate its own matmuls run at, so
that what the search adds (finished and padding rows, its bookkeeping) can be told from what
the step loses.
A run of an application whose task decodes nothing (recommendation, retrieval, the focus demo)
is refused before anything is loaded. Every figure goes with the load average.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time

import jax
import numpy as np

from attn.benchmarks import harness, train_throughput
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
  json_out: str = option("", "Where to write the figures as JSON (none when empty; its "
                         "directory must exist, and the file is replaced atomically).")
  shrink_to: int = option(0, "Finished examples leave the batch, halving it down "
                          "to this many rows (0 = never, as the run's own decoding). The same "
                          "outputs; each halving is one more loop to compile.")
  stops: tuple[str, ...] = option(
      ("run",), "Beam search stop rules to time, each with every beam size above 1: run (the "
      "run's own train.beam_stop), bound (exact) or k_finished (once K hypotheses have "
      "finished, as fairseq and JoeyNMT stop). Greedy has no stop rule: timed once.")
  ceiling_sizes: tuple[int, ...] = option(
      (1024, 2048), "n of the n x n bare-matmul ceiling in the run's compute dtype, measured "
      "before the timed passes and after them (none: no ceiling)")
  attention: bool = option(False, "Also record each step's attention, as the run's test "
                           "decoding does for attention.npz (default: the outputs only, as the "
                           "evaluations during training decode; the same tokens).")
  step_steps: int = option(20, "Steps of the model's decoding step timed alone, apart from "
                           "the search, on the split's first batch at each beam size's rows "
                           "(0 = not timed): how near the ceiling one step's matmuls run.")

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
    if self.step_steps < 0:
      raise ConfigError(f"--step_steps must be >= 0, got {self.step_steps}")
    known = ("run",) + tuple(STOP_RULES)
    if not self.stops or any(x not in known for x in self.stops):
      raise ConfigError(f"--stops={','.join(self.stops)}: each must be one of "
                        f"{', '.join(known)}")
    if any(n < 1 for n in self.ceiling_sizes):
      raise ConfigError(f"--ceiling_sizes must be integers >= 1, got {list(self.ceiling_sizes)}")
    if self.split not in ("test", "eval"):
      raise ConfigError(f"--split must be test or eval, got {self.split!r}")
    why = self.json_out and cannot_write_file(self.json_out)
    if why:  # checked before the benchmark runs: its record is written only at the end
      raise ConfigError(f"--json_out={self.json_out}: {why}")


def cannot_write_file(path: str) -> str:
  """Why a file cannot be written at `path` ('' when it can): it is a directory, or its
  directory is missing, not a directory, or not writable by this process."""
  if os.path.isdir(path):
    return "is a directory; name the file to write"
  directory = os.path.dirname(os.path.abspath(path))
  if not os.path.isdir(directory):
    return f"no directory {directory} to write it in"
  if not os.access(directory, os.W_OK | os.X_OK):
    return f"{directory} is not writable"
  return ""


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
  from attn.training import building  # pylint: disable=import-outside-toplevel
  run = building.load_run(s.workdir, task=name)
  if s.split not in run.bundle.splits:
    raise DataError(f"{s.workdir} has no {s.split} split to decode")
  return run


def timed_pass(run, role, search):
  """(seconds to decode the whole split on the device, every output ready; the [(host batch,
  DecodeOutput)] it decoded)."""
  from attn.training import evaluation  # pylint: disable=import-outside-toplevel
  t0 = time.perf_counter()
  out = evaluation.dispatch_split(run, role, search=search)
  jax.block_until_ready([res for _, res in out])
  return time.perf_counter() - t0, out


def output_work(run, decoded, beam_size: int) -> int | None:
  """Matmul FLOPs of decoding `decoded`'s outputs ([(host batch, DecodeOutput)]) with no padding
  and no finished rows: per example the encoder once over its source, and `beam_size` decoder
  rows a step for as many steps as its output has tokens (EOS included), counted by the
  architecture's analytic count of the teacher-forced forward (`cost.forward_flops`: at batch 1,
  Ts the source's length; a decoding step does a teacher-forced step's products). A lower bound of
  a search's work: it decodes padded batches, and beam search runs on until its stop rule. None
  for a model that is not its architecture's own (the captioner's image encoder is not counted)."""
  from attn.models import cost  # pylint: disable=import-outside-toplevel
  mc = run.mc
  if type(run.model) is not mc.architecture:  # pylint: disable=unidiomatic-typecheck
    return None
  flops = functools.lru_cache(maxsize=None)(lambda ts, tt: cost.forward_flops(mc, 1, ts, tt))
  total = 0
  for batch, res in decoded:
    for example, ts, tt in zip(batch["example_id"], batch["src_lengths"], np.asarray(res.lengths)):
      if example >= 0:  # not a padding row
        encoder = flops(int(ts), 0)
        total += encoder + beam_size * (flops(int(ts), int(tt)) - encoder)
  return total


def work_figures(flops: int | None, seconds: float, ceiling: float | None) -> dict:
  """A result's matmul figures: the work along its outputs (`output_work`, GFLOP; None where not
  counted), the rate the timed pass did it at, that rate as a percent of the same run's ceiling
  and the seconds the work would take at the ceiling (None without a ceiling)."""
  gflop = None if flops is None else flops / 1e9
  at = lambda f: None if gflop is None or ceiling is None else f()
  return {"matmul_gflop": gflop,
          "matmul_gflop_per_s": None if gflop is None else gflop / seconds,
          "percent_of_ceiling": at(lambda: 100.0 * gflop / seconds / ceiling),
          "decode_s_at_ceiling": at(lambda: gflop / ceiling)}


def step_alone(run, batch, beam_size: int, steps: int, params=None) -> dict:
  """The model's decoding step alone, apart from the search: `steps` steps of its step function
  in a `fori_loop` over `batch` tiled to beam_size rows an example (BOS fed at every step),
  less the encoder and the tiling, timed alone. Returns {"rows", "source_width", "steps",
  "step_ms", "step_gflop" (the traced step's matmul FLOPs), "step_gflop_per_s"}. Against a
  pass's rate it tells what the search adds to its steps' products (finished and padding rows,
  its bookkeeping). params: the (graphdef, params) of `evaluation.params_view(run)`, when the
  caller has them."""
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from flax import nnx  # pylint: disable=import-outside-toplevel
  from attn.data.tokens import BOS  # pylint: disable=import-outside-toplevel
  from attn.decoding.step import tile_beams, unpack  # pylint: disable=import-outside-toplevel
  from attn.models import cost  # pylint: disable=import-outside-toplevel
  from attn.training import evaluation  # pylint: disable=import-outside-toplevel
  graphdef, params = params or evaluation.params_view(run)
  inputs = evaluation.decode_inputs(batch)
  longest = run.model.longest_output
  n = steps if longest is None else max(1, min(steps, longest))
  rows = inputs["src"].shape[0] * beam_size
  feed = jnp.full((rows,), BOS, jnp.int32)

  def start(params, inputs):
    model = nnx.merge(graphdef, params)
    return model, tile_beams(model.initial_decode_state(
        inputs["src"], inputs["src_lengths"], inputs.get("src_ext"), max_len=n), beam_size)

  def run_steps(params, inputs):
    model, state = start(params, inputs)
    step = model.step_fn()

    def body(_, carry):
      state, total = carry
      state, logp = unpack(step(state, feed))[:2]
      return state, total + logp[:, 0]
    return jax.lax.fori_loop(0, n, body, (state, jnp.zeros((rows,), jnp.float32)))[1]

  encode = jax.jit(lambda params, inputs: start(params, inputs)[1])
  fastest = lambda fn: min(harness.call_times(fn, [(params, inputs)]))
  seconds = (fastest(jax.jit(run_steps)) - fastest(encode)) / n
  # The step's products counted on its trace, from the state's shapes (no encoder run).
  state = jax.eval_shape(lambda params, inputs: start(params, inputs)[1], params, inputs)
  gflop = cost.jaxpr_flops(nnx.merge(graphdef, params).step_fn(), state, feed) / 1e9
  return {"rows": rows, "source_width": int(inputs["src"].shape[1]), "steps": n,
          "step_ms": 1e3 * seconds, "step_gflop": gflop,
          "step_gflop_per_s": gflop / seconds if seconds > 0 else None}


def print_result(r: dict, label: str, record: dict) -> None:
  """One result's lines: its time, compile time and score, then its matmul work and rate (and
  their share of the ceiling, where one was measured)."""
  score, ceiling = record["score"], record["ceiling_gflop_per_s"]
  print(f"{label}: {r['decode_s']:.2f} s for {record['sentences']} sentences "
        f"({r['sentences_per_s']:.0f}/s), compile {r['compile_s']:.1f} s, {score} "
        f"{r[score]:.4g}")
  if r["matmul_gflop"] is not None:
    print(f"  matmul work along the outputs {r['matmul_gflop']:.1f} GFLOP: "
          f"{r['matmul_gflop_per_s']:.1f} GFLOP/s"
          + ("" if ceiling["best"] is None else
             f", {r['percent_of_ceiling']:.0f}% of the {ceiling['dtype']} ceiling "
             f"({ceiling['best']:.0f}); {r['decode_s_at_ceiling']:.2f} s at the ceiling"))
  alone = r.get("step_alone")
  if alone and alone["step_gflop_per_s"]:
    share = ("" if alone["percent_of_ceiling"] is None
             else f", {alone['percent_of_ceiling']:.0f}% of the ceiling")
    print(f"  its step alone at {alone['rows']} rows, source width {alone['source_width']}: "
          f"{alone['step_ms']:.2f} ms, {alone['step_gflop']:.2f} GFLOP, "
          f"{alone['step_gflop_per_s']:.1f} GFLOP/s{share}")


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
  dtype = run_.tc.compute_dtype
  ceilings = train_throughput.Ceilings([dtype], s.ceiling_sizes)
  ceilings.measure()
  times, work = {key: [] for key in searches}, {}
  for rnd in range(s.rounds):
    for key, search in searches.items():
      seconds, decoded = timed_pass(run_, s.split, search)
      times[key].append(seconds)
      if key not in work:  # the same outputs every pass
        work[key] = output_work(run_, decoded, key[0])
      print(f"  round {rnd + 1} {label(*key)}: {times[key][-1]:.2f} s, "
            f"{n / times[key][-1]:.0f} sentences/s (load {harness.loadavg()})")
  first_batch = next(iter(run_.bundle.batches(s.split)))
  view = evaluation.params_view(run_) if s.step_steps else None
  alone = {k: step_alone(run_, first_batch, k, s.step_steps, view)
           for k in dict.fromkeys(s.beam_sizes)} if s.step_steps else {}
  ceilings.measure()
  ceiling = ceilings.best(dtype)
  for figures in alone.values():
    rate = figures["step_gflop_per_s"]
    figures["percent_of_ceiling"] = (None if rate is None or ceiling is None
                                     else 100.0 * rate / ceiling)
  results = []
  for key, ts in times.items():
    t = float(np.median(ts))
    results.append({"beam_size": key[0], "stop": key[1], "decode_s": t, "sentences_per_s": n / t,
                    score: scored[key], "mean_words": words[key],
                    "words_per_s": words[key] * n / t,
                    "compile_s": max(first[key] - t, 0.0), "decode_s_all": ts,
                    **work_figures(work[key], t, ceiling),
                    "step_alone": alone.get(key[0])})
  record = {"application": name, "score": score, "sentences": n, "split": s.split,
            "workdir": s.workdir, "compute_dtype": run_.tc.compute_dtype,
            "attention": s.attention, "shrink_to": s.shrink_to,
            "load": {"start": load_start, "end": harness.loadavg()},
            "ceiling_gflop_per_s": {"dtype": dtype, "best": ceiling,
                                    **{str(n): v for n, v in ceilings.by_dtype[dtype].items()}},
            "machine": machine, "results": results}
  for r in results:
    print_result(r, label(r["beam_size"], r["stop"]), record)
  print(f"load average at end: {record['load']['end']}")
  if s.json_out:
    files.write_json(s.json_out, record)
    print(f"wrote {s.json_out}")
  return record
