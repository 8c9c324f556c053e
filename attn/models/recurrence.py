"""A scan whose weight gradients are one product each, after the loop.

Differentiating `jax.lax.scan` through a step that multiplies by a weight W computes, at every
time step of the backward loop, that step's share x_t^T g_t of W's gradient and adds it to a
running sum: for the decoder's [1280, 1536] input weight, a product with a contraction of only B
rows, then a read and a write of the whole [K, N] sum, per time step. Besides their own time,
those reads and writes push the weights out of the cache that the step's other products (the
gradient of the state, g W^T) read them from. `scan` keeps the loop's backward pass to what the
recurrence needs (the gradients of the carry, the inputs and the other operands) and forms each
weight's gradient once the loop is done: X^T G, one product over every time step's rows, from
the stacked inputs X of W's products and their stacked output gradients G.

How it finds G: every product of W in the step adds a zero "tap" (a scanned input of the
product's shape), and the gradient of the taps is exactly G, stacked by the loop's transpose.
The step's other operands are differentiated as `jax.lax.scan` would; W itself is a constant of
that inner differentiation, so no per-step share of its gradient is formed.

Values and gradients equal those of the plain scan up to float32 rounding (summation order);
tests/test_recurrence.py compares both on every cell and both directions.
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp

from attn import precision


class Products:
  """The weights products are formed with inside one step, and what each product read.

  `__call__(name, x)` is x @ weights[name] (operands in `dtype`, float32 accumulation, as
  `attn.precision.matmul`), plus the step's tap for `name`; each name may be used once a step."""

  def __init__(self, weights: dict, dtype, taps: dict | None):
    self.weights, self.dtype, self.taps = weights, dtype, taps
    self.inputs: dict = {}

  def __call__(self, name: str, x):
    if name in self.inputs:
      raise ValueError(f"weight {name!r} is used twice in one step; scan allows one product each")
    self.inputs[name] = x.astype(self.dtype)
    y = _no_weight_gradient(x, self.weights[name], self.dtype)
    return y if self.taps is None else y + self.taps[name]


Body = Callable  # (products: Products, operands, carry, x) -> (carry, y)


def scan(body: Body, weights: dict, operands, carry, xs, *, dtype=jnp.float32,
         reverse: bool = False):
  """(final carry, stacked ys) of `jax.lax.scan` over xs (leading axis T) of the step
  `body(products, operands, carry, x_t) -> (carry, y_t)`.

  weights: {name: [K, N]}: the weights the step multiplies by, only through
  `products(name, x)` (x: [..., K] -> [..., N]). operands: every other array the step reads (the
  rest of the parameters, per-sequence arrays, keys): `body` must take them from here, not
  close over them, since its gradient is formed outside of JAX's tracing of the step. dtype:
  the products' operand dtype (float32 accumulation). Differentiable in weights, operands,
  carry and xs."""
  return _scan(body, dtype, reverse, weights, operands, carry, xs)


def _run(body, dtype, reverse, weights, operands, carry, xs, taps):
  """The loop; also returns the stacked inputs of every weight's products ({name: [T, ..., K]})."""

  def step(c, inp):
    x, tap = inp
    products = Products(weights, dtype, tap)
    c, y = body(products, operands, c, x)
    missing = set(weights) - set(products.inputs)
    if missing:
      raise ValueError(f"the step did not use weights {sorted(missing)}: pass only the weights "
                       "its products read")
    return c, (y, products.inputs)

  carry, (ys, inputs) = jax.lax.scan(step, carry, (xs, taps), reverse=reverse)
  return (carry, ys), inputs


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _scan(body, dtype, reverse, weights, operands, carry, xs):
  return _run(body, dtype, reverse, weights, operands, carry, xs, None)[0]


def _zero_taps(body, dtype, weights, operands, carry, xs):
  """Zeros of every product's output shape, stacked over T ({name: [T, ..., N]})."""
  x0 = jax.tree.map(lambda a: a[0], xs)

  def one_step():
    products = Products(weights, dtype, None)
    body(products, operands, carry, x0)
    return products.inputs

  shapes = jax.eval_shape(one_step)
  T = jax.tree.leaves(xs)[0].shape[0]
  return {k: jnp.zeros((T,) + shapes[k].shape[:-1] + (weights[k].shape[1],),
                       precision.accum_dtype(weights[k]))
          for k in weights}


def _scan_fwd(body, dtype, reverse, weights, operands, carry, xs):
  taps = _zero_taps(body, dtype, weights, operands, carry, xs)
  run = lambda operands, carry, xs, taps: _run(body, dtype, reverse, weights, operands, carry,
                                               xs, taps)
  out, vjp, inputs = jax.vjp(run, operands, carry, xs, taps, has_aux=True)
  return out, (vjp, inputs, weights)


def _scan_bwd(body, dtype, reverse, res, g):
  del body, reverse
  vjp, inputs, weights = res
  d_operands, d_carry, d_xs, d_taps = vjp(g)
  pin = precision.row_major if precision.is_reduced(dtype) else (lambda a: a)
  d_weights = {}
  for k, w in weights.items():
    x = inputs[k].reshape(-1, w.shape[0])  # [T * rows, K]
    gk = d_taps[k].reshape(-1, w.shape[1]).astype(dtype)  # [T * rows, N]
    dw = jnp.dot(pin(x.T), gk, preferred_element_type=precision.accum_dtype(w))
    d_weights[k] = dw.astype(w.dtype)
  return d_weights, d_operands, d_carry, d_xs


_scan.defvjp(_scan_fwd, _scan_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _no_weight_gradient(x, w, dtype):
  """x @ w as `attn.precision.matmul`, differentiated in x only: inside `scan`, w is a constant
  of the step (its gradient is formed after the loop), so only g w^T is needed."""
  return precision.matmul(x, w, dtype)


def _nwg_fwd(x, w, dtype):
  return precision.matmul(x, w, dtype), (w.astype(dtype), jnp.zeros((0,), x.dtype),
                                         jnp.zeros((0,), w.dtype))


def _nwg_bwd(dtype, res, g):
  wc, x_like, w_like = res
  dx = jnp.einsum("...n,kn->...k", g.astype(dtype), wc, preferred_element_type=g.dtype)
  return dx.astype(x_like.dtype), jnp.zeros(wc.shape, w_like.dtype)  # (dropped: a constant)


_no_weight_gradient.defvjp(_nwg_fwd, _nwg_bwd)
