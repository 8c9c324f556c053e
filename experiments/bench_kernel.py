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
The flags are the fields of attn.benchmarks.kernels.BenchConfig (their defaults and help live
there); the benchmark itself is that library.
"""

import shlex
import sys

from attn.benchmarks import kernels as bench
from attn.launching import cli


def main(argv):
  del argv
  cfg = cli.settings_from_flags(bench.BenchConfig)  # a bad flag ends here, before any run
  result = bench.run_benchmark(cfg)
  command = "python -m experiments.bench_kernel " + " ".join(shlex.quote(a) for a in sys.argv[1:])
  for path in bench.write_outputs(result, cfg, command):
    print("wrote", path)
  print(bench.markdown_table(result["rows"]))


if __name__ == "__main__":
  cli.define_settings_flags(bench.BenchConfig)
  cli.run(main)
