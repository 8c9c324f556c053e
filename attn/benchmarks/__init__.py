"""Benchmarks' libraries (the entry points are experiments/bench_*.py and variant_costs.py).
`harness` is the one timing and memory harness; `kernels` (with `kernel_impls`) needs jax alone
(and matplotlib for its plot), so it runs on an accelerator machine without the data extras."""
