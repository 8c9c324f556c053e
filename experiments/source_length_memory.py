r"""Memory of one summarization train step against the source length (from XLA's compiled memory
analysis, nothing is run): long sources are truncated at data.max_src_len, and what a longer cap
costs should grow linearly in it.

    python -m experiments.source_length_memory --config=experiments/configs/summarize.py:aeslc \
        --config.model.rnn.pointer=True --config.model.rnn.coverage=True --lengths=100,200,400,800

For each source width Ts: XLA's temporary buffers of the jitted train step (activations kept for
the backward pass, the attention weights [B, Tt, Ts], the extended distribution's copy terms)
for a batch of data.batch_size examples with max_tgt_len target tokens, and their growth per
source token between consecutive widths (constant = linear). Vocabulary: data.vocab_size.
"""

import dataclasses

from absl import flags
from ml_collections import config_flags

import attn.apps  # noqa: F401  (registers the built-in applications)
from attn.common.tables import markdown_table
from attn.config.configurable import option
from attn.launching import cli

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", "experiments/configs/summarize.py:aeslc",
                                "Experiment config (path.py:preset).", lock_config=True)


@dataclasses.dataclass(frozen=True)
class Settings:
  """The flags besides --config."""
  lengths: tuple[int, ...] = option((100, 200, 400, 800), "Source widths Ts (EOS included).")


def step_memory(config, src_width: int):
  """harness.Memory (bytes) of the compiled train step for a [B, src_width] source batch."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from attn.benchmarks import harness  # pylint: disable=import-outside-toplevel
  from attn.common.jitting import jitted  # pylint: disable=import-outside-toplevel
  from flax import nnx  # pylint: disable=import-outside-toplevel
  from attn.data.config import DataConfig  # pylint: disable=import-outside-toplevel
  from attn.models import ModelConfig  # pylint: disable=import-outside-toplevel
  from attn.training import TrainConfig, get_task, make_optimizer  # pylint: disable=import-outside-toplevel
  from attn.training.step import train_step  # pylint: disable=import-outside-toplevel

  dc, tc = DataConfig.from_config(config.data), TrainConfig.from_config(config.train)
  vocab = dc.vocab_size or 10_000
  task = get_task("summarize")
  mc = ModelConfig.from_config(config.model, src_vocab=vocab, tgt_vocab=vocab)
  from attn.training import dtype_choice  # pylint: disable=import-outside-toplevel
  # train.compute_dtype=auto resolved as a training run resolves it (measured, or cached).
  dtype = dtype_choice.resolve(
      tc.compute_dtype, lambda: dtype_choice.matmul_shapes(mc, dc.batch_size, 0)).dtype
  model = task.build_model(mc, seed=0, compute_dtype=dtype)
  graphdef, state = nnx.split((model, nnx.Optimizer(model, make_optimizer(tc), wrt=nnx.Param)))
  B, Tt = dc.batch_size, dc.max_tgt_len
  i32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32)
  batch = {"src": i32(B, src_width), "src_lengths": i32(B), "tgt": i32(B, Tt),
           "tgt_lengths": i32(B)}
  if mc.rnn.pointer:
    batch.update(src_ext=i32(B, src_width), tgt_ext=i32(B, Tt))
  step = jitted(train_step, task, graphdef, label_smoothing=0.0)
  return harness.memory(harness.compile(step, state, batch, jax.random.PRNGKey(0)))


def main(argv):
  del argv
  lengths = sorted(cli.settings_from_flags(Settings).lengths)
  mib = 2.0 ** 20
  rows, prev = [], None
  for ts in lengths:
    temp = step_memory(FLAGS.config, ts).temp
    print(f"Ts={ts}: {temp / mib:.1f} MiB of temporaries", flush=True)
    slope = "" if prev is None else f"{(temp - prev[1]) / (ts - prev[0]) / mib:.3f}"
    rows.append([str(ts), f"{temp / mib:.1f}", slope])
    prev = (ts, temp)
  print(markdown_table(["Ts", "temporaries (MiB)", "MiB per extra source token"], rows))


if __name__ == "__main__":
  cli.define_settings_flags(Settings)
  cli.run(main)
