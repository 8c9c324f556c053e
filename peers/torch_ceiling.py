r"""torch's matmul rate on this machine: the peer's side of the sitting's ceiling.

Run by the peer's own environment (.peer-venv/, `make peer-venv`), never by the project's: it
imports torch, which the project does not depend on. The sitting (python -m
experiments.bench_peer) runs it at the sizes where bench_train measures XLA's ceiling, so that
each of our rows can say its share of the better of the two; by hand:

    .peer-venv/bin/python peers/torch_ceiling.py --sizes=1024,2048 \
        --json_out=workdirs/peer/torch_ceiling.json

For each dtype (float32, bfloat16) and size n: an n x n torch.matmul, called twice untimed, then
timed `--repeats` times (the median counts), on torch's own threads (all cores, as JoeyNMT
trains). The bfloat16 matmul returns bfloat16 (oneDNN accumulates in float32); XLA's ceiling
returns float32 from bfloat16 operands, the form our models' matmuls take. Writes
{"torch": version, "threads": n, "gflops": {dtype: {n: GFLOP/s}}}.

Only the standard library is imported at the top, so that the project's tests can read this
file without torch.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

DTYPES = ("float32", "bfloat16")


def rate(torch, n: int, dtype_name: str, repeats: int) -> float:
  """GFLOP/s of an n x n torch.matmul of `dtype_name` operands (2 n^3 FLOPs a call)."""
  dtype = getattr(torch, dtype_name)
  a = torch.randn(n, n).to(dtype)
  b = torch.randn(n, n).to(dtype)
  for _ in range(2):
    torch.matmul(a, b)
  seconds = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    torch.matmul(a, b)
    seconds.append(time.perf_counter() - t0)
  return 2 * n ** 3 / statistics.median(seconds) / 1e9


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
  parser.add_argument("--sizes", default="1024,2048", help="n of the n x n matmuls")
  parser.add_argument("--repeats", type=int, default=7)
  parser.add_argument("--json_out", required=True)
  args = parser.parse_args(argv)
  import torch  # pylint: disable=import-outside-toplevel  (the peer's environment only)
  sizes = [int(n) for n in args.sizes.split(",") if n]
  gflops = {d: {str(n): rate(torch, n, d, args.repeats) for n in sizes} for d in DTYPES}
  out = {"torch": torch.__version__, "threads": torch.get_num_threads(), "gflops": gflops}
  os.makedirs(os.path.dirname(os.path.abspath(args.json_out)), exist_ok=True)
  with open(args.json_out, "w", encoding="utf-8") as f:
    json.dump(out, f, indent=1)
  print(json.dumps(out))


if __name__ == "__main__":
  main()
