"""Both Pallas kernels lower to Mosaic TPU from this CPU-only machine (`jax.export` for "tpu").

Exporting runs the whole Pallas TPU lowering (block-shape and memory-space checks, the kernel body
to Mosaic MLIR) without a TPU; the module must hold one `tpu_custom_call` per Pallas kernel, named
after it, so a silent fallback to XLA or a missing backward kernel fails. Mosaic's own layout
passes run in the TPU compiler, on a TPU: they are not exercised here. Values are tested in
interpret mode (tests/test_kernels_attention.py, tests/test_kernels_additive.py).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest

from kernels import additive as aa
from kernels import flash_attention as fa

B, TQ, TK, H = 2, 200, 136, 2  # odd-sized: the sequence axes are padded to the tiles


def _dot(d, dt):
  def f(q, k, v, kl, ql):
    return fa.attention(q, k, v, key_lengths=kl, query_lengths=ql, causal=True,
                        implementation="pallas", interpret=False)
  return f, (_arr(TQ, d, dt), _arr(TK, d, dt), _arr(TK, d, dt)), "flash_attention", ("dq", "dkdv")


def _additive(d, dt):
  def f(q, k, w, v, kl, ql):
    return aa.additive_attention(q, k, w, v, key_lengths=kl, query_lengths=ql, causal=True,
                                 implementation="pallas", interpret=False)
  args = (_arr(TQ, d, dt), _arr(TK, d, dt), jax.ShapeDtypeStruct((H, d), dt), _arr(TK, 64, dt))
  return f, args, "additive_attention", ("dq", "dkv")


def _arr(T, width, dtype):
  return jax.ShapeDtypeStruct((B, T, H, width), dtype)


def _export(build, d, dtype, backward):
  """Exports the kernel's causal, padded call (and its gradient) for TPU: the kernel names."""
  f, args, name, bwd_names = build(d, dtype)
  lengths = (jax.ShapeDtypeStruct((B,), jnp.int32),) * 2
  if backward:
    fwd = f
    wrt = tuple(range(len(args)))
    f = lambda *a: jax.grad(lambda *b: fwd(*b).astype(jnp.float32).sum(), argnums=wrt)(*a)
  text = jax.export.export(jax.jit(f), platforms=["tpu"])(*args, *lengths).mlir_module()
  calls = [line for line in text.splitlines() if "stablehlo.custom_call @tpu_custom_call" in line]
  names = sorted(n for line in calls for n in re.findall(r'kernel_name = "(\w+)"', line))
  expected = sorted([f"{name}_fwd"] + ([f"{name}_{n}" for n in bwd_names] if backward else []))
  return names, expected, len(calls)


CASES = [(k, d, dt, bwd) for k, ds in (("dot", (64, 128)), ("additive", (64, 128, 256)))
         for d in ds for dt in (jnp.float32, jnp.bfloat16) for bwd in (False, True)]


@pytest.mark.parametrize("kernel,d,dtype,backward", CASES, ids=[
    f"{k}-d{d}-{jnp.dtype(dt).name}-{'fwd_bwd' if b else 'fwd'}" for k, d, dt, b in CASES])
def test_kernel_lowers_to_mosaic_tpu(kernel, d, dtype, backward):
  build = {"dot": _dot, "additive": _additive}[kernel]
  names, expected, n_calls = _export(build, d, dtype, backward)
  assert names == expected
  assert n_calls == len(expected)
