"""The matmul ceiling at a step's own shapes: every distinct dot_general of the traced step,
timed alone at its shapes, dtypes and dimension numbers, and the seconds the step's matmuls
would take at those rates with nothing else running (entry point: experiments/bench_train.py
--shape_ceiling).

The n x n ceiling (`train_throughput.matmul_ceiling`) is what the machine's matmuls reach on
large squares. A step's own products are smaller and oddly shaped ([128, 512] x [512, 1536] a
recurrent step; a [D, V] output layer with V = 5,908, whose product runs at 110-160 GFLOP/s on
the 2-core EPYC where the squares run at ~190-210), so a step can be far below the square ceiling
with almost nothing but matmuls in it. Against the shape ceiling, the share left is the step's
own overhead: the work between the matmuls, the copies, the loop, and the products XLA runs side
by side on fewer threads than alone.

    dots = step_dots(cost.jaxpr_matmuls(jax.make_jaxpr(step)(state, batch, key)))
    ceiling = ShapeCeiling()
    seconds = ceiling.step_seconds(dots)   # each distinct dot timed once, then cached

Each dot is timed as `n` calls dispatched back to back and waited for once (per call: the
elapsed time over n), n chosen from an untimed call so that a round lasts about
`round_seconds`, median of `repeats` rounds; the operands are random normal arrays of the dot's
shapes and dtypes, passed as arguments (closed-over arrays would be folded as constants). The
timing needs jax alone.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp


class Dot(NamedTuple):
  """One distinct dot_general: operand shapes and dtypes, dimension numbers, result dtype."""
  lhs: tuple
  rhs: tuple
  dims: tuple
  lhs_dtype: str
  rhs_dtype: str
  out_dtype: str

  @property
  def flops(self) -> int:
    """2 M N K of one call (`attn.models.cost.dot_flops`)."""
    from attn.models import cost  # pylint: disable=import-outside-toplevel
    return cost.dot_flops(self.lhs, self.rhs, self.dims)


def step_dots(matmuls) -> dict[Dot, int]:
  """Dot -> how many times the step runs it, from `attn.models.cost.jaxpr_matmuls` (a dot in a
  scan body runs once per trip)."""
  out: dict[Dot, int] = {}
  for m in matmuls:
    d = Dot(tuple(m.lhs.shape), tuple(m.rhs.shape), m.dims, str(m.lhs.dtype), str(m.rhs.dtype),
            str(m.out.dtype))
    out[d] = out.get(d, 0) + m.executions
  return out


def time_dot(dot: Dot, *, round_seconds: float = 0.05, repeats: int = 5,
             clock: Callable[[], float] = time.perf_counter) -> float:
  """Seconds of one call of `dot` alone (the module docstring says how it is timed)."""
  f = jax.jit(lambda a, b: jax.lax.dot_general(a, b, dot.dims,
                                               preferred_element_type=jnp.dtype(dot.out_dtype)))
  keys = jax.random.split(jax.random.PRNGKey(0), 2)
  a = jax.random.normal(keys[0], dot.lhs, jnp.float32).astype(dot.lhs_dtype)
  b = jax.random.normal(keys[1], dot.rhs, jnp.float32).astype(dot.rhs_dtype)
  jax.block_until_ready(f(a, b))  # compile
  t0 = clock()
  jax.block_until_ready(f(a, b))
  n = max(1, min(1000, math.ceil(round_seconds / max(clock() - t0, 1e-6))))
  per_call = []
  for _ in range(repeats):
    t0 = clock()
    out = [f(a, b) for _ in range(n)]
    jax.block_until_ready(out)
    per_call.append((clock() - t0) / n)
  return float(statistics.median(per_call))


class ShapeCeiling:
  """Seconds of each distinct dot, timed once by `timer` (default `time_dot`) and kept."""

  def __init__(self, timer: Callable[[Dot], float] | None = None):
    self.timer = timer or time_dot
    self.seconds: dict[Dot, float] = {}

  def step_seconds(self, dots: dict[Dot, int]) -> float:
    """Seconds the step's matmuls take at their alone rates: sum of executions x seconds."""
    for d in dots:
      if d not in self.seconds:
        self.seconds[d] = self.timer(d)
    return sum(n * self.seconds[d] for d, n in dots.items())


def flops(dots: dict[Dot, int]) -> int:
  """The step's matmul FLOPs: sum of executions x 2 M N K."""
  return sum(n * d.flops for d, n in dots.items())
