r"""Training throughput of a seq2seq config on real batches, per compute dtype, against the bare
matmul ceiling of each dtype measured in the same run.

    python -m experiments.bench_train --config=experiments/configs/translate.py:multi30k \
        --config.model.rnn.decoder=bahdanau --compute_dtypes=float32,bfloat16 --steps=20 --rounds=2

Compiles the train step of every compute dtype for every bucket shape first (so no compilation
is timed) and runs the batches once untimed, then times the same `--steps` real training batches
one by one (block_until_ready), round-robin: float32, bfloat16, float32, bfloat16, ...
(`--rounds`), so that load from other jobs on a shared machine hits every dtype alike. The
bare-matmul ceiling (jnp.dot of n x n float32, and bfloat16 operands with float32 accumulation)
is measured before the first and after the last round. Reports per dtype: the median step time,
target tokens/s (EOS included, padding excluded, as the training log counts them), and the
achieved matmul rate from the analytic FLOP count of the step (`attn.models.cost.
train_step_flops`, checked against the dot_generals of the traced step, also printed) as a
percent of that dtype's ceiling. Every figure is printed with the load average: the 2 cores are
shared.
"""

import dataclasses
import os
import time

import numpy as np
from absl import flags
from ml_collections import config_flags

from attn.launching import cli

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", "experiments/configs/translate.py:multi30k",
                                "Experiment config (path.py:preset).", lock_config=True)
flags.DEFINE_integer("steps", 30, "Timed training steps per dtype and round.")
flags.DEFINE_integer("rounds", 2, "Round-robin rounds over the compute dtypes.")
flags.DEFINE_list("compute_dtypes", [], "Compute dtypes to compare (float32,bfloat16); "
                  "default: the config's train.compute_dtype.")
flags.DEFINE_list("ceiling_sizes", ["1024", "2048"], "n of the n x n bare-matmul ceiling.")
flags.DEFINE_string("workdir", "workdirs/bench_train", "Vocabulary and data cache.")


def loadavg() -> str:
  """The 1/5/15-minute load averages (the machine is shared: every figure goes with them)."""
  try:
    with open("/proc/loadavg") as f:
      return " ".join(f.read().split()[:3])
  except OSError:
    return "n/a"


def matmul_ceiling(n: int, dtype_name: str, repeats: int = 7) -> float:
  """GFLOP/s of a jitted n x n jnp.dot with `dtype_name` operands and float32 accumulation
  (median of `repeats` after a warm-up; operands passed as arguments, not closed over)."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from attn import precision  # pylint: disable=import-outside-toplevel
  dtype = precision.compute_dtype(dtype_name)
  a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32).astype(dtype)
  b = jax.random.normal(jax.random.PRNGKey(1), (n, n), jnp.float32).astype(dtype)
  f = jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32))
  jax.block_until_ready(f(a, b))
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(f(a, b))
    times.append(time.perf_counter() - t)
  return 2 * n ** 3 / float(np.median(times)) / 1e9


def with_compute_dtype(run, compute_dtype: str):
  """The run with a fresh model (same seed: same float32 parameters) whose matmuls run in
  `compute_dtype`, and its optimizer."""
  from flax import nnx  # pylint: disable=import-outside-toplevel
  from attn.training.config import make_optimizer  # pylint: disable=import-outside-toplevel
  tc = run.tc.replace(compute_dtype=compute_dtype)
  model = run.task.build_model(run.mc, seed=tc.seed, compute_dtype=compute_dtype)
  optimizer = nnx.Optimizer(model, make_optimizer(tc), wrt=nnx.Param)
  graphdef, state = nnx.split((model, optimizer))
  return dataclasses.replace(run, tc=tc, model=model, optimizer=optimizer, graphdef=graphdef,
                             state=state)


def main(argv):
  del argv
  import jax  # pylint: disable=import-outside-toplevel
  from attn import training  # pylint: disable=import-outside-toplevel
  from attn.models import count_params, cost  # pylint: disable=import-outside-toplevel
  from attn.training.evaluation import device_batch  # pylint: disable=import-outside-toplevel

  print(f"load average at start: {loadavg()} ({os.cpu_count()} CPUs)")
  base = training.setup(FLAGS.config, FLAGS.workdir)
  dtypes = FLAGS.compute_dtypes or [base.tc.compute_dtype]
  runs = {d: with_compute_dtype(base, d) for d in dtypes}
  steps = {d: r.step_fn() for d, r in runs.items()}
  it = base.bundle.train_iter(0)
  key = jax.random.PRNGKey(0)
  seen, t0, batches, counted = set(), time.time(), [], {}
  while len(batches) < FLAGS.steps or len(seen) < len(base.bundle.shapes):
    b = device_batch(next(it))
    shape = b["src"].shape + b["tgt"].shape
    if shape not in seen:
      seen.add(shape)
      for d, step in steps.items():
        jax.block_until_ready(step(runs[d].state, b, key))  # compile this bucket
      counted[shape] = cost.jaxpr_flops(steps[dtypes[0]], runs[dtypes[0]].state, b, key)
    batches.append(b)
    if len(batches) > 10 * FLAGS.steps:
      break
  batches = batches[:FLAGS.steps]
  print(f"compiled {len(seen)} bucket shapes x {len(dtypes)} dtypes in {time.time() - t0:.1f} s")

  sizes = [int(n) for n in FLAGS.ceiling_sizes]
  ceilings = {d: {n: [] for n in sizes} for d in dtypes}

  def measure_ceiling():
    for d in dtypes:
      for n in sizes:
        ceilings[d][n].append(matmul_ceiling(n, d))
    print("  ceiling: " + "; ".join(f"{d} " + ", ".join(f"{n}^2 {ceilings[d][n][-1]:.0f}"
                                                          for n in sizes) for d in dtypes)
          + f" GFLOP/s (load {loadavg()})")

  times = {d: [] for d in dtypes}
  states = {d: r.state for d, r in runs.items()}
  # One untimed pass over the batches per dtype: the first steps after compiling run several
  # times slower (buffers and thread pools warming up), whichever dtype goes first.
  for d in dtypes:
    for i, b in enumerate(batches):
      states[d], m = steps[d](states[d], b, jax.random.fold_in(key, i))
    jax.block_until_ready(m)
  measure_ceiling()
  for rnd in range(FLAGS.rounds):
    for d in dtypes:
      for i, b in enumerate(batches):
        t = time.perf_counter()
        states[d], m = steps[d](states[d], b, jax.random.fold_in(key, i))
        jax.block_until_ready(m)
        times[d].append(time.perf_counter() - t)
      round_t = np.array(times[d][-len(batches):])
      toks = sum(float(b["tgt_lengths"].sum()) for b in batches)
      print(f"  round {rnd + 1} {d}: median step {np.median(round_t):.3f} s, "
            f"{toks / round_t.sum():.0f} target tokens/s (load {loadavg()})")
  measure_ceiling()

  toks = np.array([float(b["tgt_lengths"].sum()) for b in batches] * FLAGS.rounds)
  shapes = [b["src"].shape + b["tgt"].shape for b in batches] * FLAGS.rounds
  traced = np.array([counted[s] for s in shapes])
  try:
    analytic = np.array([cost.train_step_flops(base.mc, B, Ts, Tt) for B, Ts, _, Tt in shapes])
    source = "analytic"
  except ValueError as e:  # a variant the analytic count does not cover: the traced one counts
    print(f"no analytic count ({e}): the rates below use the traced step's count")
    analytic, source = traced, "traced"
  B = batches[0]["src"].shape[0]
  out_layer = np.array([cost.output_layer_flops(base.mc, B, Tt) for _, _, _, Tt in shapes])
  print(f"model {base.mc.variant['decoder']}/{base.mc.variant['score']}: {FLAGS.steps} batches x {FLAGS.rounds} "
        f"rounds per dtype, batch {B}, {count_params(base.model):,} parameters")
  print(f"matmul work a step: {analytic.mean() / 1e9:.1f} GFLOP {source}, "
        f"{traced.mean() / 1e9:.1f} GFLOP counted on the traced step "
        f"(ratio {analytic.sum() / traced.sum():.4f}); the [D, V] output layer is "
        f"{out_layer.sum() / analytic.sum():.0%} of it")
  print("| compute dtype | median s/step | target tokens/s | GFLOP/s (matmul) | ceiling "
        "GFLOP/s (same run, best n) | % of ceiling |")
  print("|---|---|---|---|---|---|")
  rates = {}
  for d in dtypes:
    t = np.array(times[d])
    rates[d] = toks.sum() / t.sum()
    gflops = analytic.sum() / t.sum() / 1e9
    ceiling = max(float(np.median(v)) for v in ceilings[d].values())
    print(f"| {d} | {np.median(t):.3f} | {rates[d]:,.0f} | {gflops:.1f} | {ceiling:.0f} | "
          f"{gflops / ceiling:.0%} |")
  if len(dtypes) > 1:
    ref = dtypes[0]
    print("tokens/s relative to " + ref + ": " + ", ".join(
        f"{d} {rates[d] / rates[ref]:.2f}x" for d in dtypes[1:]))
  print(f"load average at end: {loadavg()}")


if __name__ == "__main__":
  cli.run(main)
