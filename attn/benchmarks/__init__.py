"""Benchmarks' libraries (the entry points are experiments/bench_*.py). `kernels` needs jax alone
(and matplotlib for its plot), so it runs on an accelerator machine without the data extras."""
