r"""Benchmark the fused attention kernels: time, TFLOP/s, % of matmul peak, memory.

CPU figures in docs/benchmarks.md (memory with YNNPACK fusion off, which otherwise hides the
attention temporaries from the memory analysis):

    XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type= python -m experiments.bench_kernel \
        --seq_lens=16384 --impls=blocked,naive --repeats=1 --name=dot_cpu_memory
    python -m experiments.bench_kernel --seq_lens=2048 --impls=blocked,naive --repeats=7

GPU (one prepared run; see docs/benchmarks.md for the whole device script):

    python -m experiments.bench_kernel --dtype=bfloat16 --head_dims=64,128 \
        --seq_lens=1024,2048,4096,8192,16384 --causal=false,true --modes=fwd,fwd_bwd \
        --impls=pallas,cudnn,xla,jax_triton,jax_mgpu,tokamax --batch=4 --heads=16 --repeats=5

Writes <outdir>/<name>.csv, .md (with this command and the machine) and .png (TFLOP/s vs T).
The benchmark itself is the library attn/benchmarks/kernels.py; this file only parses flags.
"""

import shlex
import sys

from absl import app, flags

_BOOLS = {"true": True, "false": False, "1": True, "0": False}

flags.DEFINE_enum("kernel", "dot", ["dot", "additive"], "dot: kernels.attention; additive: "
                  "kernels.additive_attention.")
flags.DEFINE_integer("batch", 1, "Batch size B.")
flags.DEFINE_integer("heads", 4, "Heads H.")
flags.DEFINE_list("seq_lens", ["1024", "2048"], "Sequence lengths T (Tq = Tk).")
flags.DEFINE_list("head_dims", ["64"], "Head dims d (dot) or d_attn (additive).")
flags.DEFINE_integer("value_dim", None, "dv; default d (dot) or 64 (additive).")
flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16", "float16"], "Input dtype.")
flags.DEFINE_list("causal", ["false"], "Causal settings to sweep (true/false).")
flags.DEFINE_list("modes", ["fwd"], "fwd and/or fwd_bwd.")
flags.DEFINE_list("impls", ["blocked", "naive"],
                  "dot: pallas, blocked, naive, xla, cudnn, jax_triton, jax_mgpu, tokamax; "
                  "additive: pallas, blocked, naive.")
flags.DEFINE_integer("repeats", 5, "Timed calls (median reported).")
flags.DEFINE_integer("warmup", 1, "Untimed calls first.")
flags.DEFINE_integer("num_inputs", 2, "Distinct input sets cycled through.")
flags.DEFINE_float("memory_budget_gib", None, "Skip runs whose compiled temporaries exceed this "
                   "(default: half the free host memory, 90% of a GPU's).")
flags.DEFINE_bool("check", True, "Check each implementation against the dense reference first.")
flags.DEFINE_integer("block_q", None, "Query tile (default: the kernel's).")
flags.DEFINE_integer("block_k", None, "Key tile.")
flags.DEFINE_integer("block_d", None, "d_attn slice of the additive tanh tile.")
flags.DEFINE_string("outdir", "bench_out", "Output directory.")
flags.DEFINE_string("name", None, "File stem (default <kernel>_<backend>).")
flags.DEFINE_bool("plot", True, "Write the TFLOP/s-vs-T plot.")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  from attn.benchmarks import kernels as bench  # pylint: disable=import-outside-toplevel
  try:
    causal = tuple(_BOOLS[c.lower()] for c in FLAGS.causal)
  except KeyError:
    raise app.UsageError(f"--causal takes true/false values, got {FLAGS.causal}") from None
  cfg = bench.BenchConfig(
      kernel=FLAGS.kernel, batch=FLAGS.batch, heads=FLAGS.heads,
      seq_lens=tuple(int(t) for t in FLAGS.seq_lens),
      head_dims=tuple(int(d) for d in FLAGS.head_dims), value_dim=FLAGS.value_dim,
      dtype=FLAGS.dtype, causal=causal, modes=tuple(FLAGS.modes), impls=tuple(FLAGS.impls),
      repeats=FLAGS.repeats, warmup=FLAGS.warmup, num_inputs=FLAGS.num_inputs,
      memory_budget_gib=FLAGS.memory_budget_gib, check=FLAGS.check, block_q=FLAGS.block_q,
      block_k=FLAGS.block_k, block_d=FLAGS.block_d, outdir=FLAGS.outdir, name=FLAGS.name,
      plot=FLAGS.plot)
  bad_modes = set(cfg.modes) - {"fwd", "fwd_bwd"}
  if bad_modes:
    raise app.UsageError(f"--modes takes fwd and/or fwd_bwd, got {sorted(bad_modes)}")
  try:
    result = bench.run_benchmark(cfg)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  command = "python -m experiments.bench_kernel " + " ".join(shlex.quote(a) for a in sys.argv[1:])
  for path in bench.write_outputs(result, cfg, command):
    print("wrote", path)
  print(bench.markdown_table(result["rows"]))


if __name__ == "__main__":
  app.run(main)
