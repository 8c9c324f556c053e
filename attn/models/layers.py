"""Flax NNX layers whose matmuls run in a compute dtype (mixed precision), parameters float32.

flax 0.12.8's `nnx.Linear(dtype=bfloat16)` casts inputs, kernel *and bias* to bfloat16 and calls
`lax.dot_general` without `preferred_element_type`, so the product comes back rounded to bfloat16,
and its autodiff runs bfloat16 -> bfloat16 products (slower than float32 on this CPU); `GRUCell`
and `OptimizedLSTMCell` build such Linears and take no `dot_general`. Instead we keep every layer
float32 and swap only its `dot_general` hook for `attn.precision.matmul` (operands rounded to the
compute dtype, float32 accumulation forward and backward). Everything between the matmuls — the
bias add, gates, tanh, dropout, the recurrent carry, the attention normalizer and context, the
loss — stays float32.

With compute dtype float32 the layers go through `attn.precision.matmul` too: the same product
forward, and a backward that reads the transposed input saved in the forward pass instead of
XLA re-deriving it (inside the recurrent scans, from the loop's stacked residuals); the timings
are in docs/journal/speed.md.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from flax import nnx

from attn import precision as precision_lib


@functools.lru_cache(maxsize=None)
def dot_general_in(dtype):
  """A `dot_general` for nnx.Linear whose operands are rounded to `dtype` and whose products
  accumulate in float32 (the output stays float32). One function per dtype, so graphdefs of two
  models built alike compare equal."""

  def dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None,
                  out_sharding=None):
    del precision, preferred_element_type  # float32 accumulation is the point
    (lc, rc), (lb, rb) = dimension_numbers
    if tuple(lc) != (lhs.ndim - 1,) or tuple(rc) != (0,) or lb or rb or out_sharding is not None:
      raise ValueError(f"mixed-precision dot_general supports nnx.Linear's x [..., K] @ W [K, N] "
                       f"only, got dimension_numbers={dimension_numbers}")
    return precision_lib.matmul(lhs, rhs, dtype)

  dot_general.dtype = dtype  # read by `operand_dtype`
  return dot_general


def operand_dtype(layer: nnx.Linear):
  """The dtype `layer`'s matmul rounds its operands to (float32 for a layer not made `mixed`)."""
  return getattr(layer.dot_general, "dtype", jnp.float32)


def mixed(layer: nnx.Linear, compute_dtype: str) -> nnx.Linear:
  """`layer` with its matmul in `compute_dtype` through `attn.precision.matmul`. Its kernel and
  bias stay float32 (the bias is added to the float32 accumulator)."""
  layer.dot_general = dot_general_in(precision_lib.compute_dtype(compute_dtype))
  return layer


def linear(d_in: int, d_out: int, *, compute_dtype: str, rngs: nnx.Rngs, **kw) -> nnx.Linear:
  """nnx.Linear(d_in, d_out, **kw) with its matmul in `compute_dtype` (parameters as flax makes
  them: float32, the same draws from `rngs` whatever the compute dtype)."""
  return mixed(nnx.Linear(d_in, d_out, rngs=rngs, **kw), compute_dtype)


def mixed_cell(cell, compute_dtype: str):
  """A flax recurrent cell (GRUCell, OptimizedLSTMCell: input and recurrent nnx.Linear
  `dense_i`, `dense_h`) with both matmuls in `compute_dtype`. Gates and the carry stay float32:
  the carry is summed into at every step (h_t = (1 - z) n + z h_{t-1}), and rounding it to
  bfloat16 each step would compound over long sequences while saving nothing here (this CPU
  does elementwise bfloat16 arithmetic in float32 anyway)."""
  mixed(cell.dense_i, compute_dtype)
  mixed(cell.dense_h, compute_dtype)
  return cell
