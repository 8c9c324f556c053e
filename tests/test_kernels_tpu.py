"""Both Pallas kernels lower to Mosaic TPU from this CPU-only machine (`jax.export` for "tpu").

Exporting runs the whole Pallas TPU lowering (block-shape and memory-space checks, the kernel body
to Mosaic MLIR) without a TPU; the module must hold one `tpu_custom_call` per Pallas kernel, named
after it, so a silent fallback to XLA or a missing backward kernel fails. Mosaic's own layout
passes and the VMEM budget belong to the TPU compiler in libtpu: the last test runs it, deviceless,
where libtpu is installed. Values are tested in interpret mode (tests/test_kernels_attention.py,
tests/test_kernels_additive.py); nothing here has run on a TPU.
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
    # The tiles "pallas" defaults to on a TPU (here the host is a CPU): see test_tpu_tiles below.
    return aa.additive_attention(q, k, w, v, key_lengths=kl, query_lengths=ql, causal=True,
                                 implementation="pallas", interpret=False,
                                 block_sizes=aa.TPU_BLOCKS)
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


def test_tpu_tiles_are_the_default_on_a_tpu(monkeypatch):
  monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
  assert aa.SPEC.default_blocks("pallas", interpret=False) == aa.TPU_BLOCKS
  # the dot kernel has no TPU tiles of its own
  assert fa.SPEC.default_blocks("pallas", interpret=False) == fa.GPU_BLOCKS
  assert aa.SPEC.default_blocks("pallas", interpret=True) == aa.INTERPRET_BLOCKS


# ----------------------------------------------------------------------------------------------
# With libtpu installed (`pip install libtpu` matching jax's `tpu` extra; not a project
# dependency), the whole TPU compile, Mosaic's layout passes and VMEM budget included, runs
# deviceless against a v5e topology. It runs in a subprocess: libtpu must load before any backend.

_TPU_ENV = {"TPU_ACCELERATOR_TYPE": "v5litepod-4", "TPU_WORKER_HOSTNAMES": "localhost",
            "TPU_SKIP_MDS_QUERY": "1"}


def _aot_compile_all():
  """Compiles every CASES entry (forward and gradient) for a TPU v5e core; prints one line each."""
  from jax.experimental import topologies
  from jax.sharding import SingleDeviceSharding
  topo = topologies.get_topology_desc(topology_name="v5e:2x2", platform="tpu")
  sharding = SingleDeviceSharding(topo.devices[0])
  for kernel, d, dtype, backward in CASES:
    f, args, _, _ = {"dot": _dot, "additive": _additive}[kernel](d, dtype)
    lengths = (jax.ShapeDtypeStruct((B,), jnp.int32),) * 2
    args = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding) for a in args + lengths]
    if backward:
      fwd, wrt = f, tuple(range(len(args) - 2))
      f = lambda *a, fwd=fwd, wrt=wrt: jax.grad(
          lambda *b: fwd(*b).astype(jnp.float32).sum(), argnums=wrt)(*a)
    jax.jit(f).lower(*args).compile()
    print("compiled", kernel, d, jnp.dtype(dtype).name, backward, flush=True)


def test_kernels_compile_for_tpu_v5e_with_libtpu():
  import importlib.util
  import os
  import subprocess
  import sys
  if importlib.util.find_spec("libtpu") is None:
    pytest.skip("libtpu is not installed (the Mosaic compiler; optional)")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = {**os.environ, **_TPU_ENV, "JAX_PLATFORMS": "",
         "PYTHONPATH": os.pathsep.join([root] + sys.path)}
  run = subprocess.run([sys.executable, os.path.abspath(__file__)], env=env, cwd=root,
                       capture_output=True, text=True, timeout=600)
  assert run.returncode == 0, run.stderr[-3000:]
  assert run.stdout.count("compiled") == len(CASES)


if __name__ == "__main__":
  _aot_compile_all()
