"""The matmul ceiling at a step's own shapes (attn.benchmarks.shape_ceiling): each distinct dot of
a traced function with how often it runs, its FLOPs against a hand count, the seconds a step's
matmuls take at their timed rates, and how one dot is timed."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attn.benchmarks import shape_ceiling
from attn.models import cost


def _dots(fn, *args):
  return shape_ceiling.step_dots(cost.jaxpr_matmuls(jax.make_jaxpr(fn)(*args)))


@pytest.mark.parametrize("fn, shapes, flops", [
    (lambda a, b: a @ b, [(6, 4), (4, 5)], 2 * 6 * 5 * 4),
    (lambda a, b: jax.lax.dot_general(a, b, (((1,), (1,)), ((), ()))), [(6, 4), (5, 4)],
     2 * 6 * 5 * 4),                                                               # [M,K] x [N,K]^T
    (lambda a, b: jnp.einsum("bik,bkj->bij", a, b), [(3, 6, 4), (3, 4, 5)], 2 * 3 * 6 * 5 * 4),
    (lambda a, b: jnp.einsum("btd,dhk->bthk", a, b), [(2, 3, 4), (4, 5, 6)], 2 * 2 * 3 * 5 * 6 * 4),
])
def test_a_dots_flops_are_2mnk_whatever_its_layout(fn, shapes, flops):
  args = [jnp.ones(s, jnp.float32) for s in shapes]
  dots = _dots(fn, *args)
  assert len(dots) == 1
  (dot, n), = dots.items()
  assert n == 1 and dot.flops == flops and shape_ceiling.flops(dots) == flops
  assert (dot.lhs, dot.rhs) == tuple(shapes)
  assert dot.lhs_dtype == dot.rhs_dtype == dot.out_dtype == "float32"


def test_a_dot_in_a_scan_runs_once_per_trip_and_equal_dots_are_one():
  w = jnp.ones((4, 6))
  def fn(x, h):
    h = jax.lax.scan(lambda c, xi: (c + xi @ w, None), h, x)[0]   # 5 trips of [3,4] x [4,6]
    return h + x[0] @ w + x[1] @ w                                 # the same dot twice more
  dots = _dots(fn, jnp.ones((5, 3, 4)), jnp.zeros((3, 6)))
  assert list(dots.values()) == [7]
  assert shape_ceiling.flops(dots) == 7 * 2 * 3 * 6 * 4
  mixed = _dots(lambda a, b: a.astype(jnp.bfloat16) @ b.astype(jnp.bfloat16),
                jnp.ones((3, 4)), jnp.ones((4, 6)))
  assert {(d.lhs_dtype, d.rhs_dtype) for d in mixed} == {("bfloat16", "bfloat16")}


def test_step_seconds_sum_executions_times_each_dots_seconds_timing_each_once():
  timed = []
  def timer(dot):
    timed.append(dot)
    return 1e-3 * dot.lhs[0]
  dots = _dots(lambda x, y: (x @ jnp.ones((4, 6)), y @ jnp.ones((4, 6)), y @ jnp.ones((4, 6))),
               jnp.ones((3, 4)), jnp.ones((7, 4)))
  ceiling = shape_ceiling.ShapeCeiling(timer)
  assert ceiling.step_seconds(dots) == pytest.approx(1 * 3e-3 + 2 * 7e-3, rel=1e-12)
  assert ceiling.step_seconds(dots) == pytest.approx(17e-3, rel=1e-12)
  assert sorted(d.lhs[0] for d in timed) == [3, 7]  # each distinct dot timed once


def test_time_dot_runs_the_dot_and_reads_the_clock_per_round():
  """With a clock that advances 10 ms a reading: the untimed call reads 10 ms, so a round of
  50 ms is 5 calls, and each round (one reading before, one after) gives 10 ms / 5."""
  clock = itertools.count(0.0, 0.01).__next__
  dot = shape_ceiling.Dot((8, 16), (16, 4), (((1,), (0,)), ((), ())), "float32", "float32",
                          "float32")
  assert shape_ceiling.time_dot(dot, round_seconds=0.05, repeats=3, clock=clock) == \
      pytest.approx(0.002)
  real = shape_ceiling.time_dot(dot, round_seconds=0.001, repeats=2)
  assert np.isfinite(real) and 0 < real < 1
