"""float32 runs IEEE float32 dots; bfloat16/float16 keep the default precision.

Pallas' Triton lowering maps a dot's default precision to `tt.dot ... inputPrecision = tf32`
(10 mantissa bits), also for float32 operands; `lax.Precision.HIGHEST` maps to IEEE. So the
kernels' dots (`kernels._common.dot`, `dot_nt`, `dot_tn`) ask for HIGHEST on float32 operands.
Checked in the Triton IR that `jax.export` for CUDA embeds in each launch's custom call (its
backend config's `ir`, MLIR bytecode), and in the jaxpr of the blocked path (XLA's GPU dots
round to TF32 by default too). On CPU both precisions give the same bits.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax._src.interpreters import mlir as jax_mlir
from jax._src.lib import triton as jax_triton
from jax._src.lib.mlir import ir

import kernels
from kernels import _common

TRITON_CALL = "__gpu$xla.gpu.triton"
B, T, H = 1, 40, 1
LAUNCHES = {"dot": {"flash_attention_fwd", "flash_attention_dq", "flash_attention_dkdv"},
            "additive": {"additive_attention_fwd", "additive_attention_dq",
                         "additive_attention_dkv"}}
# tt.dot's inputPrecision enum, by value (Triton's InputPrecision: tf32, ieee in jax 0.10).
PRECISIONS = {int(getattr(jax_triton.dialect.InputPrecision, n)): n.lower()
              for n in dir(jax_triton.dialect.InputPrecision) if n.isupper()}
DOT_RE = re.compile(r'"tt\.dot"\(.*?inputPrecision = (\d+) : i32.*?\(tensor<(?:\d+x)+(\w+)>')


def export_for_cuda(f, *args):
  """jax.export of jit(f) for CUDA from this host (Triton IR only: nothing is compiled)."""
  checks = [jax.export.DisabledSafetyCheck.custom_call(TRITON_CALL)]
  return jax.export.export(jax.jit(f), platforms=["cuda"], disabled_checks=checks)(*args)


def _ops(op, name):
  """The operations called `name` nested anywhere in `op`."""
  for region in op.regions:
    for block in region.blocks:
      for child in block.operations:
        if child.operation.name == name:
          yield child.operation
        yield from _ops(child.operation, name)


def triton_modules(exported):
  """{launch name: its Triton module's text, generic form} of an exported module."""
  with jax_mlir.make_ir_context() as ctx:
    jax_triton.dialect.register_dialect(ctx)
    module = ir.Module.parse(exported.mlir_module())
    found = {}
    for call in _ops(module.operation, "stablehlo.custom_call"):
      if ir.StringAttr(call.attributes["call_target_name"]).value != TRITON_CALL:
        continue
      config = ir.DictAttr(call.attributes["mhlo.backend_config"])
      triton = ir.Module.parse(ir.StringAttr(config["ir"]).value_bytes)
      found[ir.StringAttr(config["name"]).value] = triton.operation.get_asm(
          print_generic_op_form=True)
    return found


def triton_dots(exported):
  """{launch name: [(inputPrecision, operand element type) of each tt.dot]}."""
  return {name: [(PRECISIONS[int(p)], elem) for p, elem in DOT_RE.findall(text)]
          for name, text in triton_modules(exported).items()}


def forward_and_backward(kernel, dtype, d=32, dv=32, implementation="pallas"):
  """(f, args): the gradient of sum(out) of `kernel` ("dot"/"additive") through its custom_vjp
  (for "pallas": Triton, its forward and both backward launches); args ShapeDtypeStructs."""
  x = lambda *shape, dt=dtype: jax.ShapeDtypeStruct(shape, dt)
  kw = dict(implementation=implementation)
  if implementation == "pallas":
    kw.update(interpret=False)
  if kernel == "dot":
    attend = lambda q, k, v: kernels.attention(q, k, v, **kw)
    args = (x(B, T, H, d), x(B, T, H, d), x(B, T, H, dv))
  else:
    attend = lambda q, k, w, v: kernels.additive_attention(q, k, w, v, **kw)
    args = (x(B, T, H, d), x(B, T, H, d), x(H, d, dt=jnp.float32), x(B, T, H, dv))
  loss = lambda *a: jnp.sum(attend(*a).astype(jnp.float32))
  return jax.grad(loss, argnums=tuple(range(len(args)))), args


@pytest.mark.parametrize("dtype,precision,elem", [(jnp.float32, "ieee", "f32"),
                                                  (jnp.bfloat16, "tf32", "bf16")],
                         ids=["float32", "bfloat16"])
@pytest.mark.parametrize("kernel", ["dot", "additive"])
def test_triton_dots_are_ieee_for_float32_and_default_for_16_bit(kernel, dtype, precision, elem):
  """float32: every tt.dot of the forward and both backward launches is IEEE. bfloat16: the
  dots take bf16 operands with the default's attribute (tf32, which Triton ignores for 16-bit
  operands), as before."""
  f, args = forward_and_backward(kernel, dtype)
  dots = triton_dots(export_for_cuda(f, *args))
  assert set(dots) == LAUNCHES[kernel]
  for name, found in dots.items():
    assert found and set(found) == {(precision, elem)}, (name, found)


def _dot_generals(jaxpr):
  """Every dot_general equation of `jaxpr`, nested jaxprs included."""
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general":
      yield eqn
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      yield from _dot_generals(getattr(sub, "jaxpr", sub))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_blocked_path_dots_ask_for_highest_on_float32(dtype):
  """The blocked path's dots (forward, and the backward's tile vjps and dV, all float32 there):
  HIGHEST on float32 operands, the default on 16-bit ones (the bf16 forward's scores)."""
  f, args = forward_and_backward("dot", dtype, implementation="blocked")
  seen = set()
  for eqn in _dot_generals(jax.make_jaxpr(f)(*args).jaxpr):
    operands = {v.aval.dtype for v in eqn.invars}
    highest = eqn.params["precision"] == (lax.Precision.HIGHEST, lax.Precision.HIGHEST)
    assert highest == (jnp.dtype(jnp.float32) in operands), eqn
    seen.add((str(max(operands, key=lambda t: t.itemsize)), highest))
  expected = {("float32", True)} | ({("bfloat16", False)} if dtype == jnp.bfloat16 else set())
  assert seen == expected, seen


@pytest.mark.parametrize("implementation", ["blocked", "pallas"])
def test_cpu_values_are_the_same_bits_as_with_the_default_precision(implementation,
                                                                    monkeypatch):
  """On CPU (the blocked path; Pallas interpret mode) HIGHEST changes no bit of the float32
  outputs or gradients: the CPU computes float32 products either way."""
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.standard_normal((2, 40, 2, 32)), jnp.float32) for _ in range(3))

  def run():
    jax.clear_caches()  # the public wrapper is jitted: trace again with the patched precision
    attend = lambda *a: kernels.attention(*a, key_lengths=jnp.array([40, 17]), causal=True,
                                          implementation=implementation)
    return attend(q, k, v), jax.grad(lambda *a: jnp.sum(attend(*a) ** 2), (0, 1, 2))(q, k, v)

  highest = run()
  monkeypatch.setattr(_common, "dot_precision", lambda a, b: None)
  default = run()
  for x, y in zip(jax.tree.leaves(highest), jax.tree.leaves(default)):
    np.testing.assert_array_equal(x, y)
