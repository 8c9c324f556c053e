"""Training throughput of a seq2seq config on real batches, per compute dtype, against the bare
matmul ceiling of each dtype measured in the same run (entry point: experiments/bench_train.py).
The config's application (`application_of_config`: translate, summarize, caption, any later one
whose task is a `Seq2SeqTask`) sets up the run, so its own task's step is timed.

Compiles the train step of every compute dtype for every bucket shape first (so no compilation
is timed) and runs the batches once untimed, then times the same `steps` real training batches
one by one (block_until_ready, through attn.benchmarks.harness), round-robin: float32,
bfloat16, float32, bfloat16, ... (`rounds`), so that load from other jobs on a shared machine
hits every dtype alike. `auto` (named in `compute_dtypes`, or the config's own
train.compute_dtype) is resolved as a training run resolves it (attn.training.dtype_choice: the
model's matmul shapes timed in both dtypes, or their cached rates), and its row is labelled
with the dtype it chose, e.g. `auto (float32)`: the same compiled step as that dtype's row,
timed in turns of its own. `xla_options` adds, per dtype, the same step compiled with other XLA
options (e.g. XLA:CPU's library fusions), timed in the same rounds beside XLA's defaults. The
bare-matmul ceiling (n x n operands of the dtype, float32 accumulation) is measured before the
first and after the last round. Reports per dtype (and option set): the
median step time, target tokens/s (EOS included, padding excluded, as the training log counts
them), and the achieved matmul rate from the analytic FLOP count of the step
(`attn.models.cost.train_step_flops`, checked against the dot_generals of the traced step, also
printed) as a percent of that dtype's ceiling, and the tokens/s the step would reach with its
matmuls at that ceiling. The padding's cost is counted, not timed (`padding_work`): the matmul
work per real target token over the first epoch's bucketed batches, with no padding, and in
random batches padded to their longest. `shape_ceiling` (after the rounds) times every distinct
matmul of each run's traced step alone at its own shapes and dtypes (`shape_seconds`,
attn.benchmarks.shape_ceiling): the table then says the rate the step's matmuls reach alone and
the share of the measured step time they take at it. Every figure goes with the load average.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attn import precision
from attn.benchmarks import harness
from attn.common import applications, compile_cache
from attn.common.tables import markdown_table
from attn.config.configurable import option
from attn.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Settings:
  """The benchmark's settings (experiments/bench_train.py's flags besides --config)."""
  steps: int = option(30, "Timed training steps per dtype and round.")
  rounds: int = option(2, "Round-robin rounds over the compute dtypes (and XLA option sets).")
  compute_dtypes: tuple[str, ...] = option(
      ("auto",), "Compute dtypes to compare (float32,bfloat16,auto). auto: the dtype "
      "train.compute_dtype=auto chooses on this machine for this model "
      "(attn.training.dtype_choice), its row labelled with it, e.g. 'auto (float32)'; empty: "
      "the config's own train.compute_dtype.")
  ceiling_sizes: tuple[int, ...] = option(
      (1024, 2048), "n of the n x n bare-matmul ceiling, measured before the timed rounds and "
      "after them (none: no ceiling, and no percent of it)")
  shape_ceiling: bool = option(
      False, "Also time every distinct matmul of the step alone, at its own shapes and dtypes "
      "(attn.benchmarks.shape_ceiling), after the timed rounds: the rate the step's matmuls "
      "reach with nothing else running, and the share of the step's time they take at it.")
  xla_options: str = option("", "XLA compile option sets timed beside XLA's defaults, for every "
                            "dtype, as JSON: {\"name\": {\"xla_option\": value, ...}, ...}.")
  workdir: str = option("workdirs/bench_train", "Vocabulary and data cache.")

  def __post_init__(self):
    # Checked before the config is set up: a step count of 0 or no rounds would time nothing.
    if self.steps < 1:
      raise ConfigError(f"--steps must be >= 1, got {self.steps}")
    if self.rounds < 1:
      raise ConfigError(f"--rounds must be >= 1, got {self.rounds}")
    if any(n < 1 for n in self.ceiling_sizes):
      raise ConfigError(f"--ceiling_sizes must be integers >= 1, got {list(self.ceiling_sizes)}")


def seq2seq_applications() -> list[str]:
  """The registered applications whose task is a `Seq2SeqTask` (a source encoded, a target
  decoded, batches of src and tgt): those whose training step bench_train times."""
  from attn.training.seq2seq_task import Seq2SeqTask  # pylint: disable=import-outside-toplevel
  return [name for name, entry in applications.registry().items()
          if entry.task is not None and issubclass(entry.task_class, Seq2SeqTask)]


def application_of_config(config) -> str:
  """The application whose config `config` is: a registered application whose task's `data`
  section (its `sections["data"]` dataclass) has exactly the config's data fields. Where several
  share them (translation and summarization, whose steps train alike), translate, the training
  loop's default application, as bench_train read every config before it asked. A ConfigError,
  one line naming the applications bench_train times, when it is none of theirs."""
  fields = set(config.data.keys()) if "data" in config else set()
  supported = seq2seq_applications()
  matches = [name for name, entry in applications.registry().items()
             if entry.task is not None and "data" in entry.task_class.sections
             and fields == {f.name for f in dataclasses.fields(entry.task_class.sections["data"])}]
  if not matches:
    raise ConfigError("--config is the config of no registered application (its data fields "
                      "are no task's): bench_train times the training step of "
                      f"{', '.join(supported)} configs")
  name = "translate" if "translate" in matches else matches[0]
  if name not in supported:
    raise ConfigError(f"--config is a {name} config: bench_train times the training step of an "
                      f"application whose task is sequence to sequence ({', '.join(supported)})")
  return name


def matmul_ceiling(n: int, dtype_name: str) -> float:
  """GFLOP/s of a jitted n x n matmul with `dtype_name` operands and float32 accumulation."""
  dtype = precision.compute_dtype(dtype_name)
  return harness.matmul_flops_per_second(n, dtype, accumulate=jnp.float32) / 1e9


class Ceilings:
  """The bare-matmul ceiling (GFLOP/s, `matmul_ceiling`) of each dtype at each size n, measured
  anew at every `measure()` (before a benchmark's timed rounds and after them, so that a load
  that came or went in between shows); `best` reads a dtype's best size's median."""

  def __init__(self, dtypes, sizes):
    self.sizes = tuple(sizes)
    self.by_dtype = {d: {n: [] for n in self.sizes} for d in dtypes}

  def measure(self) -> None:
    """Measures every dtype at every size once, and prints them with the load average."""
    if not self.sizes:
      return
    for d, per_size in self.by_dtype.items():
      for n in self.sizes:
        per_size[n].append(matmul_ceiling(n, d))
    print("  ceiling: " + "; ".join(f"{d} " + ", ".join(f"{n}^2 {v[-1]:.0f}"
                                                          for n, v in per_size.items())
                                    for d, per_size in self.by_dtype.items())
          + f" GFLOP/s (load {harness.loadavg()})")

  def best(self, dtype: str) -> float | None:
    """The best size's median (None when no size was measured)."""
    return best_ceiling(self.by_dtype[dtype])


def best_ceiling(per_size: dict) -> float | None:
  """{n: [GFLOP/s, ...]} -> the best size's median (None for no sizes)."""
  return max((float(np.median(v)) for v in per_size.values()), default=None)


def resolved_dtype(base, dc, name: str) -> str:
  """The concrete dtype of `--compute_dtypes` entry `name` for the run `base` (of data section
  `dc`, the task's validated one): `auto` is
  resolved as a training run resolves train.compute_dtype=auto (attn.training.dtype_choice:
  the model's own matmul shapes timed in both dtypes, or the cached rates), and says so."""
  from attn.precision import AUTO  # pylint: disable=import-outside-toplevel
  from attn.training import dtype_choice  # pylint: disable=import-outside-toplevel
  if name != AUTO:
    precision.compute_dtype(name)  # an unknown name: refused here
    return name
  choice = dtype_choice.resolve(AUTO, lambda: dtype_choice.matmul_shapes(
      base.mc, dc.batch_size, getattr(dc, "tokens_per_batch", 0)))
  print(f"  {choice.line()}")
  return choice.dtype


def dtype_label(name: str, dtype: str) -> str:
  """A table row's dtype: the name, or for auto the dtype it chose, e.g. `auto (float32)`."""
  return name if name == dtype else f"{name} ({dtype})"


def with_compute_dtype(run, compute_dtype: str):
  """The run with a fresh model (same seed: same float32 parameters) whose matmuls run in
  `compute_dtype`, and its optimizer; its state placed as the run's is (its shardings), so that
  the state the step returns matches the one it was first compiled for: an unplaced state
  compiles every shape a second time at its second step."""
  from attn.training import distributed  # pylint: disable=import-outside-toplevel
  from attn.training.config import make_optimizer  # pylint: disable=import-outside-toplevel
  tc = run.tc.replace(compute_dtype=compute_dtype)
  model = run.task.build_model(run.mc, seed=tc.seed, compute_dtype=compute_dtype)
  optimizer = nnx.Optimizer(model, make_optimizer(tc), wrt=nnx.Param)
  graphdef, state = nnx.split((model, optimizer))
  if run.shardings is not None:
    state = distributed.place(state, run.shardings)
  return dataclasses.replace(run, tc=tc, model=model, optimizer=optimizer, graphdef=graphdef,
                             state=state)


def xla_option_sets(text: str) -> dict[str, dict]:
  """The option sets of `Settings.xla_options` ("" = none), each checked by compiling a trivial
  function with it, so that a misspelt option fails in one line before the model is set up."""
  if not text.strip():
    return {}
  try:
    sets = json.loads(text)
  except json.JSONDecodeError as e:
    raise ConfigError(f"--xla_options is not JSON ({e}): {text!r}") from e
  if not isinstance(sets, dict) or not all(name and isinstance(o, dict)
                                           for name, o in sets.items()):
    raise ConfigError(f"--xla_options must map names to option dicts, got {text!r}")
  for name, opts in sets.items():
    try:
      jax.jit(lambda x: x + 1, compiler_options=opts)(1.0)
    except Exception as e:  # pylint: disable=broad-except  # XLA raises its own runtime error
      raise ConfigError(f"--xla_options {name!r}: {e}") from e
  return sets


def batch_shape(batch) -> tuple:
  # (B, Ts, B, Tt); a source of features (the captioner's regions, [B, R, P*P]) by its first two
  return batch["src"].shape[:2] + batch["tgt"].shape


def compiled_batches(base, runs, steps, n: int):
  """`n` training batches, with every bucket shape compiled for every dtype on the way (at most
  10 n batches are drawn looking for them); (batches, traced matmul FLOPs per shape)."""
  from attn.models import cost  # pylint: disable=import-outside-toplevel
  from attn.training.evaluation import device_batch  # pylint: disable=import-outside-toplevel
  it, key, first = base.bundle.train_iter(0), jax.random.PRNGKey(0), next(iter(runs))
  # A bundle that lists no shapes has one (the captioner's strips): the first batch's.
  shapes = len(getattr(base.bundle, "train_shapes", ()))
  batches, counted = [], {}
  while len(batches) < n or len(counted) < shapes:
    b = device_batch(next(it))
    if batch_shape(b) not in counted:
      for d, step in steps.items():
        jax.block_until_ready(step(runs[d].state, b, key))  # compile this bucket
      counted[batch_shape(b)] = cost.jaxpr_flops(steps[first], runs[first].state, b, key)
    batches.append(b)
    if len(batches) > 10 * n:
      break
  return batches[:n], counted


def time_rounds(runs, steps, batches, s: Settings):
  """Seconds of every timed step per run (a dtype, or a dtype and XLA option set), and the
  ceiling (GFLOP/s) per run's dtype and size, each measured before the first and after the
  last round."""
  labels, key = list(runs), jax.random.PRNGKey(0)
  measured = Ceilings(dict.fromkeys(r.tc.compute_dtype for r in runs.values()), s.ceiling_sizes)
  ceilings = {lb: measured.by_dtype[r.tc.compute_dtype] for lb, r in runs.items()}

  times, states = {lb: [] for lb in labels}, {lb: r.state for lb, r in runs.items()}
  # One untimed pass over the batches per run: the first steps after compiling run several
  # times slower (buffers and thread pools warming up), whichever run goes first.
  for d in labels:
    for i, b in enumerate(batches):
      states[d], _ = harness.timed_call(steps[d], states[d], b, jax.random.fold_in(key, i))[0]
  measured.measure()
  toks = sum(float(b["tgt_lengths"].sum()) for b in batches)
  for rnd in range(s.rounds):
    for d in labels:
      for i, b in enumerate(batches):
        (states[d], _), t = harness.timed_call(steps[d], states[d], b, jax.random.fold_in(key, i))
        times[d].append(t)
      round_t = np.array(times[d][-len(batches):])
      print(f"  round {rnd + 1} {d}: median step {np.median(round_t):.3f} s, "
            f"{toks / round_t.sum():.0f} target tokens/s (load {harness.loadavg()})")
  measured.measure()
  return times, ceilings


def shape_seconds(runs, steps, batches) -> dict:
  """Per run: (matmul FLOPs counted on the traced step, seconds those matmuls take alone at their
  own shapes), summed over `batches` (`attn.benchmarks.shape_ceiling`; each distinct dot is
  timed once, whichever run and bucket shape it comes from)."""
  from attn.benchmarks import shape_ceiling  # pylint: disable=import-outside-toplevel
  from attn.models import cost  # pylint: disable=import-outside-toplevel
  ceiling, key, out, traced = shape_ceiling.ShapeCeiling(), jax.random.PRNGKey(0), {}, {}
  by_shape = {batch_shape(b): b for b in batches}
  for label, run in runs.items():
    per_shape = {}
    for shape, b in by_shape.items():
      # auto's row runs the same step as the dtype it chose: traced once.
      if (id(steps[label]), shape) not in traced:
        dots = shape_ceiling.step_dots(cost.jaxpr_matmuls(
            jax.make_jaxpr(steps[label])(run.state, b, key)))
        traced[id(steps[label]), shape] = (shape_ceiling.flops(dots), ceiling.step_seconds(dots))
      per_shape[shape] = traced[id(steps[label]), shape]
    out[label] = tuple(sum(per_shape[batch_shape(b)][i] for b in batches) for i in (0, 1))
    print(f"  {label}: {len(ceiling.seconds)} distinct matmuls timed alone so far; at their own "
          f"shapes the step's matmuls run at {out[label][0] / out[label][1] / 1e9:.1f} GFLOP/s "
          f"(load {harness.loadavg()})")
  return out


def report(base, batches, counted, times, ceilings, s: Settings, alone=None) -> str:
  """Prints the work per step (analytic and traced FLOPs) and returns the table per dtype.
  alone: `shape_seconds` per run, for the columns of the ceiling at the step's own shapes."""
  from attn.models import cost, count_params  # pylint: disable=import-outside-toplevel
  shapes = [batch_shape(b) for b in batches] * s.rounds
  toks = np.array([float(b["tgt_lengths"].sum()) for b in batches] * s.rounds)
  traced = np.array([counted[sh] for sh in shapes])
  try:
    if type(base.model) is not base.mc.architecture:  # pylint: disable=unidiomatic-typecheck
      raise ValueError(f"the model is a {type(base.model).__name__}, not its architecture's "
                       "own, which the analytic count covers")
    analytic = np.array([cost.train_step_flops(base.mc, B, Ts, Tt) for B, Ts, _, Tt in shapes])
    source = "analytic"
  except ValueError as e:  # a variant the analytic count does not cover: the traced one counts
    print(f"no analytic count ({e}): the rates below use the traced step's count")
    analytic, source = traced, "traced"
  B = batches[0]["src"].shape[0]
  out_layer = np.array([cost.output_layer_flops(base.mc, B, Tt) for _, _, _, Tt in shapes])
  print(f"model {base.mc.variant['decoder']}/{base.mc.variant['score']}: {s.steps} batches x "
        f"{s.rounds} rounds per dtype, batch {B}, {count_params(base.model):,} parameters")
  print(f"matmul work a step: {analytic.mean() / 1e9:.1f} GFLOP {source}, "
        f"{traced.mean() / 1e9:.1f} GFLOP counted on the traced step "
        f"(ratio {analytic.sum() / traced.sum():.4f}); the [D, V] output layer is "
        f"{out_layer.sum() / analytic.sum():.0%} of it")
  if source == "analytic":
    print(padding_work(base))
  rows, rates = [], {}
  for d, t in times.items():
    t = np.array(t)
    rates[d] = toks.sum() / t.sum()
    gflops = analytic.sum() / t.sum() / 1e9
    ceiling = best_ceiling(ceilings[d])
    at_ceiling = (["n/a"] * 3 if ceiling is None else  # --ceiling_sizes= measured none
                  [f"{ceiling:.0f}", f"{gflops / ceiling:.0%}",
                   f"{rates[d] * ceiling / gflops:,.0f}"])
    # The timed batches ran `rounds` times; `alone` sums them once.
    at_shapes = [] if alone is None else [
        f"{alone[d][0] / alone[d][1] / 1e9:.0f}", f"{s.rounds * alone[d][1] / t.sum():.0%}"]
    rows.append([d, f"{np.median(t):.3f}", f"{rates[d]:,.0f}", f"{gflops:.1f}", *at_ceiling,
                 *at_shapes])
  table = markdown_table(["compute dtype", "median s/step", "target tokens/s",
                          "GFLOP/s (matmul)", "ceiling GFLOP/s (same run, best n)",
                          "% of ceiling", "tokens/s at the ceiling"]
                         + ([] if alone is None else [
                             "GFLOP/s of its matmuls alone at their shapes",
                             "% of the step's time they take alone"]), rows)
  dtypes = list(times)
  if len(dtypes) > 1:
    table += "\ntokens/s relative to " + dtypes[0] + ": " + ", ".join(
        f"{d} {rates[d] / rates[dtypes[0]]:.2f}x" for d in dtypes[1:])
  return table


def padding_work(base, seed: int = 0) -> str:
  """One line: the training matmul work per real target token over the first epoch's batches
  (the buckets, or the packed rows), with no padding at all, and in random batches of as many
  examples padded to their longest (no buckets); the padding's share of the bucketed work. At a fixed share of the
  ceiling, tokens/s goes as the inverse of the work per token."""
  from attn.data import bucketing  # pylint: disable=import-outside-toplevel
  from attn.models import cost  # pylint: disable=import-outside-toplevel
  bundle, mc = base.bundle, base.mc
  sp = bundle.splits["train"]
  epoch = bundle.train_epoch_batches(0)
  bucketed = cost.plan_flops_per_token(mc, epoch, sp.tgt_len)
  floor = cost.unpadded_flops_per_token(mc, sp.src_len, sp.tgt_len)
  size = int(round(np.mean([np.count_nonzero(rows >= 0) for _, _, rows in epoch])))  # examples
  random = cost.plan_flops_per_token(mc, bucketing.unbucketed_batches(
      sp.src_len, sp.tgt_len, size, np.random.default_rng(seed)), sp.tgt_len)
  ours, short = ((f"rows packed into {bundle.pack_widths}", "packed rows") if bundle.pack_widths
                 else ("the buckets", "buckets"))
  return (f"matmul work per target token over the first epoch: {bucketed / 1e6:.2f} MFLOP in "
          f"{ours}, {floor / 1e6:.2f} with no padding (padding {1 - floor / bucketed:.0%} "
          f"of the work), {random / 1e6:.2f} in random batches of {size} padded to their longest "
          f"({random / bucketed:.2f}x the {short}')")


def run(config, s: Settings) -> str:
  """The benchmark for the experiment config `config` (a ConfigDict); prints its progress and
  returns the table."""
  from attn import training  # pylint: disable=import-outside-toplevel
  print(f"load average at start: {harness.loadavg()} ({os.cpu_count()} CPUs); "
        f"{harness.cpu_line()}")
  name = application_of_config(config)  # a config bench_train cannot run costs one line
  option_sets = {"": None, **xla_option_sets(s.xla_options)}
  base = training.setup(config, s.workdir, task=name)
  dc = base.task.data_config(config.data)
  # auto by default; empty: the config's own dtype (its `auto` resolved as the run resolved it).
  asked = s.compute_dtypes or [config.train.compute_dtype]
  dtypes = {d: resolved_dtype(base, dc, d) for d in asked}
  variants = {(f"{dtype_label(d, dtypes[d])}, {name}" if name
               else dtype_label(d, dtypes[d])): (dtypes[d], opts)
              for d in asked for name, opts in option_sets.items()}
  # One run and one compiled step per concrete dtype and option set: `auto`'s row times the
  # same step as the row of the dtype it chose, in its own turns of the rounds.
  built = {}
  for d, opts in variants.values():
    key = (d, json.dumps(opts, sort_keys=True))
    if key not in built:
      fresh = with_compute_dtype(base, d)
      built[key] = (fresh, fresh.step_fn(opts))
  runs = {lb: built[d, json.dumps(o, sort_keys=True)][0] for lb, (d, o) in variants.items()}
  steps = {lb: built[d, json.dumps(o, sort_keys=True)][1] for lb, (d, o) in variants.items()}
  t0, before = time.time(), compile_cache.stats()
  batches, counted = compiled_batches(base, runs, steps, s.steps)
  loaded = (compile_cache.stats() - before).loaded
  print(f"compiled {len(counted)} bucket shapes x {len(runs)} runs in "
        f"{time.time() - t0:.1f} s" + (f" ({loaded} programs loaded from the compilation cache)"
                                      if loaded else ""))
  times, ceilings = time_rounds(runs, steps, batches, s)
  alone = shape_seconds(runs, steps, batches) if s.shape_ceiling else None
  table = report(base, batches, counted, times, ceilings, s, alone)
  print(table)
  print(f"load average at end: {harness.loadavg()}")
  return table
