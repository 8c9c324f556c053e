r"""Training throughput of a seq2seq config on real batches: target tokens/s and s/step.

    python -m experiments.bench_train --config=experiments/configs/translate.py:multi30k \
        --config.model.decoder=bahdanau --steps=30

Compiles the train step for every bucket shape first (so no compilation is timed), then times
`--steps` real training batches one by one (block_until_ready) and reports the median step time,
target tokens/s (EOS included, padding excluded, as the training log counts them), and the
achieved rate against an analytic matmul FLOP count of the step (`attn.models.cost`: on the
padded shapes, backward counted as 2x forward), to compare with the machine's ~108 GFLOP/s
float32 matmul rate.
"""

import time

import numpy as np
from absl import flags
from ml_collections import config_flags

from experiments import cli

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", "experiments/configs/translate.py:multi30k",
                                "Experiment config (path.py:preset).", lock_config=True)
flags.DEFINE_integer("steps", 30, "Timed training steps.")
flags.DEFINE_string("workdir", "workdirs/bench_train", "Vocabulary and data cache.")


def main(argv):
  del argv
  import jax  # pylint: disable=import-outside-toplevel
  from attn import training  # pylint: disable=import-outside-toplevel
  from attn.models import count_params, cost  # pylint: disable=import-outside-toplevel
  from attn.training.evaluation import device_batch  # pylint: disable=import-outside-toplevel

  run = training.setup(FLAGS.config, FLAGS.workdir)
  step = run.step_fn()
  it = run.bundle.train_iter(0)
  key = jax.random.PRNGKey(0)
  seen, t0 = set(), time.time()
  batches = []
  while len(batches) < FLAGS.steps or len(seen) < len(run.bundle.shapes):
    b = device_batch(next(it))
    shape = b["src"].shape + b["tgt"].shape
    if shape not in seen:
      seen.add(shape)
      jax.block_until_ready(step(run.state, b, key))  # compile this bucket
    batches.append(b)
    if len(batches) > 10 * FLAGS.steps:
      break
  print(f"compiled {len(seen)} bucket shapes in {time.time() - t0:.1f} s")
  times, toks = [], []
  state = run.state
  for i, b in enumerate(batches[:FLAGS.steps]):
    t = time.time()
    state, m = step(state, b, jax.random.fold_in(key, i))
    jax.block_until_ready(m)
    times.append(time.time() - t)
    toks.append(float(b["tgt_lengths"].sum()))
  times, toks = np.array(times), np.array(toks)
  flops = np.array([cost.train_step_flops(run.mc, *b["src"].shape, b["tgt"].shape[1])
                    for b in batches[:FLAGS.steps]])
  print(f"model {run.mc.decoder}/{run.mc.score}: {FLAGS.steps} steps, batch "
        f"{batches[0]['src'].shape[0]}, {count_params(run.model):,} parameters")
  print(f"median step {np.median(times):.3f} s; target tokens/s {toks.sum() / times.sum():.0f}; "
        f"matmul work {flops.sum() / times.sum() / 1e9:.1f} GFLOP/s "
        f"({flops.mean() / 1e9:.1f} GFLOP a step)")


if __name__ == "__main__":
  cli.run(main)
