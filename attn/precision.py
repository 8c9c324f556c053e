"""Accumulation dtype, and matmuls with low-precision operands that accumulate in float32.

Every primitive accumulates products and softmaxes in `accum_dtype` (float32 at least). Mixed
precision training (`train.compute_dtype=bfloat16`) rounds only the *operands* of the large
matmuls to bfloat16: `matmul` returns, and differentiates into, float32 accumulations.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

# The compute dtypes a config may name (`train.compute_dtype`), and their jnp dtypes.
COMPUTE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
# The config value that lets a run choose one of them by measuring the machine it runs on,
# resolved before the model is built (attn.training.dtype_choice): code below the training
# setup only ever sees a name of COMPUTE_DTYPES.
AUTO = "auto"


def accum_dtype(*xs):
  """The dtype products and softmaxes accumulate in: float32, or float64 for float64 inputs."""
  return jnp.result_type(jnp.float32, *(jnp.asarray(x).dtype if x is not None else jnp.float32
                                        for x in xs))


def compute_dtype(name: str):
  """The jnp dtype of a compute-dtype name ("float32" | "bfloat16")."""
  try:
    return COMPUTE_DTYPES[name]
  except KeyError:
    known = ", ".join(COMPUTE_DTYPES)
    raise ValueError(f"compute dtype {name!r} unknown; known: {known}") from None


def is_reduced(dtype) -> bool:
  """True for a compute dtype narrower than float32 (the matmuls then go through `matmul`)."""
  return jnp.finfo(dtype).bits < 32


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def matmul(x, w, dtype):
  """x @ w with both operands rounded to `dtype`, the products accumulated in float32.

  x: [..., K]; w: [K, N]. Returns [..., N] in accum_dtype(x, w) (float32 for float32 or
  bfloat16 inputs). The backward pass does the same: the cotangent g [..., N] is rounded to
  `dtype` (as mixed-precision training does) and dx = g w^T, dw = x^T g take `dtype` operands
  and accumulate in float32; dx and dw come back in x's and w's dtypes, so a float32 weight's
  gradient is a float32 sum over the batch, never a rounded one.

  Why a custom VJP: autodiff of `jnp.dot(x16, w16, preferred_element_type=float32)` transposes
  into float32 x bfloat16 products (float32's speed on this CPU, not bfloat16's) and rounds both
  gradients to bfloat16 through the transpose of the operand casts; with a bfloat16 result
  instead, every product is bfloat16 -> bfloat16, slower still here and rounded.

  The forward pass saves x^T [K, M], not x: XLA:CPU (jax 0.10.2) runs a bfloat16 dot whose
  left operand contracts its leading axis (x^T g read from x) by converting both operands to
  float32. Inside a scan (the recurrent cells) the backward reads x^T from the forward loop's
  stacked residuals; outside one (the output layer, every Transformer layer) XLA would fold the
  transpose back into the dot, so with a bfloat16 `dtype` the backward pins x^T and dw
  row-major (`row_major`) and every product gets the bfloat16 rate.
  """
  return _matmul_fwd(x, w, dtype)[0]


def _matmul_fwd(x, w, dtype):
  if w.ndim != 2 or x.shape[-1] != w.shape[0]:
    raise ValueError(f"matmul takes x [..., K] and w [K, N], got {x.shape} and {w.shape}")
  acc = accum_dtype(x, w)
  xc, wc = x.astype(dtype), w.astype(dtype)
  y = jnp.einsum("...k,kn->...n", xc, wc, preferred_element_type=acc)  # [..., N]
  xt = xc.reshape(-1, xc.shape[-1]).T  # [K, M], see the docstring
  # Zero-size arrays carry the primal dtypes to the backward pass (residuals must be arrays).
  return y, (xt, wc, jnp.zeros((0,), x.dtype), jnp.zeros((0,), w.dtype))


def row_major(a):
  """a, held in memory in row-major order (a copy where XLA had laid it out otherwise).

  XLA:CPU (jax 0.10.2) folds a transpose into the layout of its result, so x^T [K, M] formed
  from x [M, K] reaches a dot as x's own memory, read column-wise. A bfloat16 dot contracting
  its left operand's leading axis is run by converting both operands to float32, at about half
  the rate of the same product from a row-major [K, M]; float32 products run alike either way.
  A 1-D array has one layout, so flattening behind an optimization barrier makes XLA write x^T
  out row by row (a copy of x, small beside the product). What it gains a train step is in
  docs/journal/speed.md ("Weight gradients from a row-major x^T"). Other backends lay out a dot's
  operands themselves and get `a` as it is."""
  pin = lambda a: jax.lax.optimization_barrier(a.reshape(-1)).reshape(a.shape)
  return jax.lax.platform_dependent(a, cpu=pin, default=lambda a: a)


def _matmul_bwd(dtype, res, g):
  xt, wc, x_like, w_like = res
  # float32 products read a transposed x as fast as a row-major one: only bfloat16 needs the pin
  pin = row_major if is_reduced(dtype) else (lambda a: a)
  xt = pin(xt)
  acc = g.dtype
  gc = g.astype(dtype)  # [..., N]
  dx = jnp.einsum("...n,kn->...k", gc, wc, preferred_element_type=acc)  # [..., K]
  K, N = wc.shape
  dw = jnp.einsum("km,mn->kn", xt, gc.reshape(-1, N),
                  preferred_element_type=acc)  # [K, N], summed over every leading position
  # A transpose of dw (a tied output layer's w = E^T) would be folded back into the product,
  # contracting g's leading axis: the slow form again (and one XLA:CPU's bfloat16 dot refuses).
  dw = pin(dw)
  return dx.astype(x_like.dtype), dw.astype(w_like.dtype)


matmul.defvjp(_matmul_fwd, _matmul_bwd)
