r"""Where the training step's time goes, per XLA operation, for each compute dtype.

    python -m experiments.profile_step --config=experiments/configs/translate.py:multi30k \
        --config.model.rnn.decoder=bahdanau --compute_dtypes=float32,bfloat16 --steps=10

Compiles the train step for every bucket shape (as experiments.bench_train does), runs the
batches once untimed, then traces --steps of them per dtype with `jax.profiler` and prints, per
dtype, the step's time by category (matmul, elementwise, copies, slices and updates of the
scans' buffers, gathers/scatters, reductions, random bits, loop overhead) and the operations
that took longest, named by the JAX source operation they came from
(attn.benchmarks.op_profile says how). --trace_dir keeps the raw traces for TensorBoard.
"""

import dataclasses
import os

import jax
from absl import flags
from ml_collections import config_flags

import attn.apps  # noqa: F401  (registers the built-in applications)
from attn.benchmarks import harness, op_profile, train_throughput
from attn.common.tables import markdown_table
from attn.config.configurable import option
from attn.launching import cli

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", "experiments/configs/translate.py:multi30k",
                                "Experiment config (path.py:preset).", lock_config=True)


@dataclasses.dataclass(frozen=True)
class Settings:
  """The profile's settings (flags besides --config)."""
  steps: int = option(10, "Traced training steps per dtype.")
  compute_dtypes: tuple[str, ...] = option((), "Compute dtypes (float32,bfloat16,auto); default: the "
                                           "config's train.compute_dtype.")
  top: int = option(15, "Operations listed per dtype, longest first.")
  instructions: int = option(0, "Also list this many compiled HLO instructions per dtype, "
                             "longest first, with their result shapes.")
  source_depth: int = option(3, "Parts of the JAX op_name path that name an operation.")
  trace_dir: str = option("workdirs/profile_step", "Where the raw traces are written.")
  workdir: str = option("workdirs/bench_train", "Vocabulary and data cache.")


def profile(config, s: Settings) -> str:
  """Prints and returns the per-dtype tables."""
  from attn import training  # pylint: disable=import-outside-toplevel
  print(f"load average at start: {harness.loadavg()} ({os.cpu_count()} CPUs); "
        f"{harness.cpu_line()}")
  base = training.setup(config, s.workdir)
  # auto is resolved as bench_train resolves it; the config's own dtype was resolved by setup.
  dc = base.task.data_config(config.data)
  runs = {d: train_throughput.with_compute_dtype(base, train_throughput.resolved_dtype(base, dc, d))
          for d in s.compute_dtypes or [base.tc.compute_dtype]}
  steps = {d: r.step_fn() for d, r in runs.items()}
  batches, _ = train_throughput.compiled_batches(base, runs, steps, s.steps)
  key, out = jax.random.PRNGKey(0), []
  for d, run in runs.items():
    state = run.state
    for i, b in enumerate(batches):  # warm: the first steps after compiling run slower
      state, _ = jax.block_until_ready(steps[d](state, b, jax.random.fold_in(key, i)))
    ops = {}
    for b in {train_throughput.batch_shape(b): b for b in batches}.values():
      ops.update(op_profile.compiled_ops(steps[d].lower(state, b, key).compile().as_text()))
    arg_sets = [(state, b, jax.random.fold_in(key, i)) for i, b in enumerate(batches)]
    events = op_profile.trace_events(steps[d], arg_sets, os.path.join(s.trace_dir, d))
    times = op_profile.self_times(events)
    cats, top = op_profile.summarize(times, ops, calls=len(batches), top=s.top,
                                         depth=s.source_depth)
    step_ms = sum(r[1] for r in cats)
    listed = op_profile.instructions(times, ops, calls=len(batches), top=s.instructions,
                                     depth=s.source_depth) if s.instructions else []
    out.append(f"### {d}: {step_ms:.0f} ms of traced operations a step "
               f"(load {harness.loadavg()})\n\n"
               + markdown_table(["category", "ms a step", "share"],
                                [[c, f"{ms:.1f}", f"{sh:.0%}"] for c, ms, sh in cats])
               + "\n\n"
               + markdown_table(["operation (category: source)", "ms a step", "share"],
                                [[n, f"{ms:.1f}", f"{sh:.1%}"] for n, ms, sh in top])
               + ("\n\n" + markdown_table(
                   ["instruction", "category", "result", "source", "ms a step", "share"],
                   [[n, c, shp, src, f"{ms:.1f}", f"{sh:.1%}"]
                    for n, c, shp, src, ms, sh in listed]) if listed else ""))
  text = "\n\n".join(out)
  print(text)
  return text


def main(argv):
  del argv
  profile(FLAGS.config, cli.settings_from_flags(Settings))


if __name__ == "__main__":
  cli.define_settings_flags(Settings)
  cli.run(main)
