r"""Training throughput of a seq2seq config on real batches: target tokens/s and s/step.

    python -m experiments.bench_train --config=experiments/configs/translate.py:multi30k \
        --config.model.decoder=bahdanau --steps=30

Compiles the train step for every bucket shape first (so no compilation is timed), then times
`--steps` real training batches one by one (block_until_ready) and reports the median step time,
target tokens/s (EOS included, padding excluded, as the training log counts them), and the
achieved rate against an analytic matmul FLOP count of the step (on the padded shapes, backward
counted as 2x forward), to compare with the machine's ~108 GFLOP/s float32 matmul rate.
"""

import time

from absl import app, flags
from ml_collections import config_flags
import numpy as np

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", "experiments/configs/translate.py:multi30k",
                                "Experiment config (path.py:preset).", lock_config=True)
flags.DEFINE_integer("steps", 30, "Timed training steps.")
flags.DEFINE_string("workdir", "workdirs/bench_train", "Vocabulary and data cache.")


def step_flops(mc, B, Ts, Tt):
  """Matmul FLOPs of one training step (forward x3) for the padded batch [B, Ts] -> [B, Tt]."""
  gates = {"gru": 3, "lstm": 4}[mc.cell]
  dirs = 2 if mc.bidirectional else 1
  enc, d_in = 0, mc.emb_dim
  for _ in range(mc.enc_layers):
    enc += dirs * 2 * gates * mc.enc_hidden * (d_in + mc.enc_hidden)
    d_in = mc.enc_out_dim
  He, D, E, da = mc.enc_out_dim, mc.dec_hidden, mc.emb_dim, mc.d_attn
  attention = mc.decoder != "none"
  in0 = E + (He if mc.decoder in ("none", "bahdanau") else (D if mc.input_feeding else 0))
  dec = 2 * gates * D * (in0 + D) + (mc.dec_layers - 1) * 2 * gates * D * 2 * D
  if mc.decoder == "luong":
    dec += 2 * (He + D) * D  # W_c
  else:
    dec += 2 * (D + He + E) * D  # deep-output readout
  dec += 2 * D * mc.tgt_vocab  # output layer
  per_key = 0
  if attention:
    additive = mc.score == "additive"
    dec += 2 * D * da if additive else 0  # W q
    per_key = (4 * da if additive else 2 * D) + 2 * He  # score + context per (query, key)
    enc += 2 * He * (da if additive else D)  # keys prepared once per source token
  fwd = B * Ts * enc + B * Tt * (dec + Ts * per_key)
  return 3 * fwd


def main(argv):
  del argv
  import functools  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  from attn import train  # pylint: disable=import-outside-toplevel

  run = train.setup(FLAGS.config, FLAGS.workdir)
  step = jax.jit(functools.partial(train.train_step, run.graphdef,
                                   label_smoothing=run.tc.label_smoothing))
  it = run.bundle.train_iter(0)
  key = jax.random.PRNGKey(0)
  seen, t0 = set(), time.time()
  batches = []
  while len(batches) < FLAGS.steps or len(seen) < len(run.bundle.shapes):
    b = train._device_batch(next(it))  # pylint: disable=protected-access
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
  flops = np.array([step_flops(run.mc, *b["src"].shape, b["tgt"].shape[1])
                    for b in batches[:FLAGS.steps]])
  print(f"model {run.mc.decoder}/{run.mc.score}: {FLAGS.steps} steps, batch "
        f"{batches[0]['src'].shape[0]}, {train.count_params(run.model):,} parameters")
  print(f"median step {np.median(times):.3f} s; target tokens/s {toks.sum() / times.sum():.0f}; "
        f"matmul work {flops.sum() / times.sum() / 1e9:.1f} GFLOP/s "
        f"({flops.mean() / 1e9:.1f} GFLOP a step)")


if __name__ == "__main__":
  app.run(main)
