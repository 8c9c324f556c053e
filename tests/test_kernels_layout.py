"""The layout of the Pallas kernels' operands is their launch's (`kernels.launch.Layout`).

The GPU loop launch (Triton, its interpreter) indexes the public [B, T, H, d] arrays directly,
so for shapes that need no padding nothing is transposed or padded around the pallas_calls
(checked on the StableHLO exported for CUDA, forward and backward, both kernels); the TPU grid
launch and the Mosaic GPU targets stay head-major. Values of every layout (token-major loop,
head-major loop, head-major grid) against the float64 references, at odd lengths and widths.
"""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import pytest

import kernels
from kernels import additive as aa
from kernels import flash_attention as fa
from kernels import launch
from kernels.targets import TARGETS, triton
from tests import kernel_cases as kc

TRITON_CALL = "__gpu$xla.gpu.triton"
B, H, D = 2, 2, 64


def _module(kernel, platform, T, backward):
  """StableHLO text of kernels.attention (or additive_attention) at [B, T, H, D], bfloat16,
  causal with lengths, exported for `platform` (its "auto" target); with its gradient."""
  x = jax.ShapeDtypeStruct((B, T, H, D), jnp.bfloat16)
  lens = jax.ShapeDtypeStruct((B,), jnp.int32)
  kw = dict(causal=True, implementation="pallas", interpret=False)
  if kernel == "dot":
    f = lambda q, k, v, kl, ql: fa.attention(q, k, v, key_lengths=kl, query_lengths=ql, **kw)
    args = (x, x, x, lens, lens)
  else:
    f = lambda q, k, w, v, kl, ql: aa.additive_attention(q, k, w, v, key_lengths=kl,
                                                         query_lengths=ql, **kw)
    args = (x, x, jax.ShapeDtypeStruct((H, D), jnp.float32), x, lens, lens)
  if backward:
    attend = f
    f = jax.grad(lambda *a: jnp.sum(attend(*a).astype(jnp.float32)),
                 argnums=tuple(range(len(args) - 2)))
  checks = [jax.export.DisabledSafetyCheck.custom_call(TRITON_CALL)]
  exported = jax.export.export(jax.jit(f), platforms=[platform], disabled_checks=checks)(*args)
  return exported.mlir_module()


def _count(op, text):
  return len(re.findall(rf"stablehlo\.{op}\b", text))


@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("kernel", ["dot", "additive"])
def test_gpu_export_has_no_transpose_or_pad(kernel, backward):
  """T = 128 (a multiple of every Triton tile), D = 64: the kernels take the arrays as given."""
  cuda = _module(kernel, "cuda", 128, backward)
  assert _count("custom_call", cuda) == (3 if backward else 1)
  assert _count("transpose", cuda) == 0 and _count("pad", cuda) == 0, (
      _count("transpose", cuda), _count("pad", cuda))
  # The TPU's grid launch is head-major: XLA transposes around its pallas_calls.
  assert _count("transpose", _module(kernel, "tpu", 128, backward)) > 0


def test_gpu_export_pads_a_length_off_the_tiles_without_transposing():
  cuda = _module("dot", "cuda", 100, backward=True)
  assert _count("pad", cuda) > 0 and _count("transpose", cuda) == 0


def test_each_target_has_its_launchs_layout():
  layouts = {name: kernels._skeleton.Config(causal=False, blocks=kernels.BlockSizes(),
                                            target=TARGETS.get(name)).layout
             for name in ("triton", "interpret", "tpu", "tpu_interpret", "mosaic_gpu")}
  assert layouts == {"triton": launch.TOKEN_MAJOR, "interpret": launch.TOKEN_MAJOR,
                     "tpu": launch.HEAD_MAJOR, "tpu_interpret": launch.HEAD_MAJOR,
                     "mosaic_gpu": launch.HEAD_MAJOR}


# ----------------------------------------------------------------------------------------------
# Values in every layout.


@pytest.fixture(scope="module")
def head_major_loop():
  """The interpreter target with the head-major loop launch (the Mosaic GPU targets' backward)."""
  name = "interpret_head_major"
  TARGETS.add(dataclasses.replace(TARGETS.get("interpret"), name=name,
                                  launch=triton.loop_launch_head_major))
  yield name
  TARGETS.remove(name)


# Odd lengths and widths (T and d padded), padded rows, Tq != Tk.
CASE = kc.Case("odd", B=2, Tq=37, Tk=45, H=3, d=24, dv=40, causal=True, key_lengths=(45, 20),
               query_lengths=(37, 30))
BLOCKS = kernels.BlockSizes(block_q=16, block_k=16)


def _check(run, naive, inputs, ref, names):
  cts = kc.cotangents(CASE)
  got = (*run(*inputs), *kc.loss_and_grads(run, inputs, *cts))
  dense = (*naive(*inputs), *kc.loss_and_grads(naive, inputs, *cts))
  for what, g, n, r in zip(names, got, dense, ref):
    kc.assert_as_close_as_naive(g, n, r, jnp.float32, what)


@pytest.mark.parametrize("target", ["interpret", "head_major_loop", "tpu_interpret"])
def test_dot_kernel_values_in_every_layout(target, head_major_loop):
  target = head_major_loop if target == "head_major_loop" else target
  q, k, v, kl, ql = kc.dot_inputs(CASE, jnp.float32)
  ref = kc.np_attention(q, k, v, kl, ql, CASE.causal, CASE.d ** -0.5, *kc.cotangents(CASE))
  run = lambda impl, **kw: lambda q, k, v: fa.attention_with_lse(
      q, k, v, key_lengths=kl, query_lengths=ql, causal=CASE.causal, implementation=impl, **kw)
  _check(run("pallas", target=target, block_sizes=BLOCKS), run("xla"), (q, k, v), ref,
         ("out", "lse", "dq", "dk", "dv"))


@pytest.mark.parametrize("target", ["interpret", "head_major_loop", "tpu_interpret"])
def test_additive_kernel_values_in_every_layout(target, head_major_loop):
  target = head_major_loop if target == "head_major_loop" else target
  qp, kp, w, val, kl, ql = kc.additive_inputs(CASE, jnp.float32)
  ref = kc.np_additive(qp, kp, w, val, kl, ql, CASE.causal, *kc.cotangents(CASE))
  run = lambda impl, **kw: lambda qp, kp, w, val: aa.additive_attention_with_lse(
      qp, kp, w, val, key_lengths=kl, query_lengths=ql, causal=CASE.causal, implementation=impl,
      **kw)
  _check(run("pallas", target=target, block_sizes=BLOCKS), run("xla"), (qp, kp, w, val), ref,
         ("out", "lse", "dq_proj", "dk_proj", "dv_vec", "dvalues"))


def test_head_major_loop_writes_every_output_element(head_major_loop):
  """Poisoned (NaN) outputs are all overwritten in the head-major loop launch too (the
  token-major one: tests/test_kernels_attention.py)."""
  q, k, v, kl, ql = kc.dot_inputs(CASE, jnp.float32)
  f = lambda q, k, v: fa.pallas_attention_padded(
      q, k, v, key_lengths=kl, query_lengths=ql, causal=True, block_sizes=BLOCKS,
      target=head_major_loop, poison=True)
  (out, lse), vjp = jax.vjp(f, q, k, v)
  assert out.shape == (2, 48, 3, 64) and lse.shape == (2, 3, 48)
  for x in (out, lse, *vjp((jnp.ones_like(out), jnp.zeros_like(lse)))):
    assert not jnp.any(jnp.isnan(x))
