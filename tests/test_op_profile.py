"""attn.benchmarks.op_profile: self times of nested events, HLO categories, a real trace."""

import jax
import jax.numpy as jnp
import pytest

from attn.benchmarks import op_profile
from attn.benchmarks.op_profile import Event


def test_self_times_subtract_nested_events_per_thread():
  events = [Event("while.1", "t0", 0, 100), Event("dot.2", "t0", 10, 30),
            Event("fusion.3", "t0", 50, 20), Event("dot.2", "t0", 200, 40),
            Event("while.1", "t1", 0, 10)]  # another thread: nothing nests across threads
  got = op_profile.self_times(events)
  assert got == pytest.approx({"while.1": (100 - 30 - 20 + 10) / 1e9, "dot.2": 70 / 1e9,
                               "fusion.3": 20 / 1e9})


def _scan_matmul(a, b):
  def body(c, x):
    return jnp.tanh(c @ b + x), None
  c, _ = jax.lax.scan(body, a, jnp.ones((4,) + a.shape))
  return (c @ b).sum()


def test_compiled_ops_name_categories_and_sources():
  a, b = jnp.ones((8, 16)), jnp.ones((16, 16))
  ops = op_profile.compiled_ops(jax.jit(_scan_matmul).lower(a, b).compile().as_text())
  cats = {op.opcode: op.category for op in ops.values()}
  assert cats.get("while") == "loop overhead"
  assert any(op.category == "matmul" and "dot_general" in op.source for op in ops.values())
  assert "matmul" not in {op.category for op in ops.values() if op.opcode == "copy"}


def test_trace_of_a_jitted_function_is_attributed(tmp_path):
  a, b = jnp.ones((64, 128)), jnp.ones((128, 128))
  fn = jax.jit(_scan_matmul)
  ops = op_profile.compiled_ops(fn.lower(a, b).compile().as_text())
  events = op_profile.trace_events(fn, [(a, b)] * 3, str(tmp_path / "trace"))
  times = op_profile.self_times(events)
  known = sum(t for n, t in times.items() if n in ops)
  assert times and known >= 0.9 * sum(times.values())  # the trace names the compiled module's ops
  cats, top = op_profile.summarize(times, ops, calls=3)
  assert {c for c, _, _ in cats} >= {"matmul"}
  assert sum(share for _, _, share in cats) == pytest.approx(1.0)
  assert top[0][1] >= top[-1][1]


def test_instructions_name_their_result_shapes(tmp_path):
  """The longest instructions come with their result types: the [64, 128] product of the scan's
  body is listed as a matmul of that shape."""
  a, b = jnp.ones((64, 128)), jnp.ones((128, 128))
  fn = jax.jit(_scan_matmul)
  ops = op_profile.compiled_ops(fn.lower(a, b).compile().as_text())
  assert any(op.category == "matmul" and op.shape == "f32[64,128]" for op in ops.values())
  times = op_profile.self_times(op_profile.trace_events(fn, [(a, b)] * 3,
                                                        str(tmp_path / "trace")))
  rows = op_profile.instructions(times, ops, calls=3, top=4)
  assert len(rows) == min(4, len(times)) and rows[0][4] >= rows[-1][4]
  assert ("matmul", "f32[64,128]") in {(r[1], r[2]) for r in rows}
