"""Both Pallas kernels lower to Mosaic TPU from this CPU-only machine (`jax.export` for "tpu").

Exporting runs the whole Pallas TPU lowering (block-shape and memory-space checks, the kernel body
to Mosaic MLIR) without a TPU; the module must hold one `tpu_custom_call` per Pallas kernel, named
after it, so a silent fallback to XLA or a missing backward kernel fails. The kernels' TPU
launch (kernels/targets/tpu.py) is checked from its jaxpr: grid semantics, the VMEM its blocks and
scratch take at T = 16k, the forward's scratch (which blocks a step fetches:
tests/test_kernels_tpu_dma.py). Mosaic's own layout passes and
the VMEM budget belong to the TPU compiler in libtpu: the last test runs it, deviceless, where
libtpu is installed. Values are tested in interpret mode (tests/test_kernels_attention.py,
tests/test_kernels_additive.py); nothing here has run on a TPU.
"""

from __future__ import annotations

import math
import re

import jax
import jax.extend.core
import jax.numpy as jnp
import pytest
from jax.experimental.pallas import tpu as pltpu

import kernels
from kernels import additive as aa
from kernels import flash_attention as fa

B, TQ, TK, H = 2, 200, 136, 2  # odd-sized: the sequence axes are padded to the tiles
_LENGTHS = (jax.ShapeDtypeStruct((B,), jnp.int32),) * 2  # key_lengths, query_lengths


def _dot(d, dt, Tq=TQ, Tk=TK):
  def f(q, k, v, kl, ql):
    # Target "auto": lowered for a TPU, the "tpu" target's launch and tiles (the host is a CPU).
    return fa.attention(q, k, v, key_lengths=kl, query_lengths=ql, causal=True,
                        implementation="pallas", interpret=False)
  return f, (_arr(Tq, d, dt), _arr(Tk, d, dt), _arr(Tk, d, dt)), "flash_attention", ("dq", "dkdv")


def _additive(d, dt, Tq=TQ, Tk=TK):
  def f(q, k, w, v, kl, ql):
    # Target "auto": the "tpu" target's launch and tiles (tests/test_kernels_targets.py).
    return aa.additive_attention(q, k, w, v, key_lengths=kl, query_lengths=ql, causal=True,
                                 implementation="pallas", interpret=False)
  args = (_arr(Tq, d, dt), _arr(Tk, d, dt), jax.ShapeDtypeStruct((H, d), dt), _arr(Tk, 64, dt))
  return f, args, "additive_attention", ("dq", "dkv")


_BUILDS = {"dot": _dot, "additive": _additive}


def _arr(T, width, dtype):
  return jax.ShapeDtypeStruct((B, T, H, width), dtype)


def _with_grad(f, n_args):
  """f and its gradient in the first n_args arguments (the lengths follow them)."""
  wrt = tuple(range(n_args))
  return lambda *a: jax.grad(lambda *b: f(*b).astype(jnp.float32).sum(), argnums=wrt)(*a)


def _export(build, d, dtype, backward):
  """Exports the kernel's causal, padded call (and its gradient) for TPU: the kernel names."""
  f, args, name, bwd_names = build(d, dtype)
  lengths = (jax.ShapeDtypeStruct((B,), jnp.int32),) * 2
  if backward:
    f = _with_grad(f, len(args))
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
  build = _BUILDS[kernel]
  names, expected, n_calls = _export(build, d, dtype, backward)
  assert names == expected
  assert n_calls == len(expected)


# ----------------------------------------------------------------------------------------------
# The TPU launch, read from the jaxpr: the pallas_calls of the platform switch's TPU
# branch (its default branch where there is no TPU one).


def pallas_calls(jaxpr, platform):
  """The pallas_call equations of `jaxpr` (nested jaxprs included) that run when lowered for
  `platform`: in a platform switch, only its branch for `platform` (or its default)."""
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "pallas_call":
      yield eqn
      continue
    platforms = eqn.params.get("branches_platforms")
    if platforms is None:
      subs = jax.extend.core.jaxprs_in_params(eqn.params)
    else:
      branches = dict(zip(platforms, eqn.params["branches"]))
      subs = [b for b in [next((b for p, b in branches.items() if p and platform in p),
                               branches.get(None))] if b is not None]
    for sub in subs:
      yield from pallas_calls(getattr(sub, "jaxpr", sub), platform)


def _tpu_kernels(f, *args):
  """{name: pallas_call equation} of what f launches when lowered for TPU."""
  return {str(e.params["name"]): e for e in pallas_calls(jax.make_jaxpr(f)(*args).jaxpr, "tpu")}


def _vmem_bytes(shape, dtype):
  """VMEM a [.., rows, lanes] buffer takes in (8 x 32-bit sublanes, 128 lanes) tiles."""
  shape = (1,) * (2 - len(shape)) + tuple(shape)
  itemsize = jnp.dtype(dtype).itemsize
  rows = 8 * 4 // itemsize  # bf16 packs 16 rows per tile
  return (math.prod(shape[:-2]) * -(-shape[-2] // rows) * rows * -(-shape[-1] // 128) * 128
          * itemsize)


def _pipeline_vmem(eqn):
  """What a TPU kernel's pipeline holds in VMEM, at most: two buffers of every block (the one in
  use and the next, being copied) and the scratch."""
  mapping = eqn.params["grid_mapping"]
  blocks = sum(2 * _vmem_bytes(m.transformed_block_aval.shape, m.array_aval.dtype)
               for m in mapping.block_mappings)
  n = mapping.num_scratch_operands
  scratch = eqn.params["jaxpr"].invars[len(eqn.params["jaxpr"].invars) - n:]
  return blocks + sum(_vmem_bytes(v.aval.shape, v.aval.dtype) for v in scratch)


V5E_SCOPED_VMEM = 16 * 2**20  # the TPU compiler's default scoped-VMEM limit on v5e


@pytest.mark.parametrize("kernel", ["dot", "additive"])
def test_tpu_vmem_stays_per_tile_at_16k(kernel):
  """T = 16k, bf16, d = 128, forward and backward: no TPU kernel holds a whole sequence; each
  kernel's pipelined blocks and scratch take at most a quarter of v5e's scoped VMEM, leaving the
  rest to its tile temporaries. (Holding all of Tq, either dk/dv kernel asked libtpu for 24 MiB;
  the opt-in libtpu test below compiles these cases.)"""
  T = 16384
  f, args, name, bwd_names = _BUILDS[kernel](128, jnp.bfloat16, Tq=T, Tk=T)
  calls = _tpu_kernels(_with_grad(f, len(args)), *args, *_LENGTHS)
  assert sorted(calls) == sorted([f"{name}_fwd"] + [f"{name}_{n}" for n in bwd_names])
  for kernel, eqn in calls.items():
    for m in eqn.params["grid_mapping"].block_mappings:
      assert T not in m.transformed_block_aval.shape, (kernel, m.transformed_block_aval.shape)
    assert _pipeline_vmem(eqn) <= V5E_SCOPED_VMEM // 4, (kernel, _pipeline_vmem(eqn))


def _additive_tile_vmem(eqn, block_d=8):
  """Estimated VMEM of an additive TPU kernel: its pipeline (`_pipeline_vmem`, the stash of the
  backward's tanh slabs included) plus the step's temporaries, taken as three [block_d, bq, bk]
  float32 slabs (the sum's operands and result) and six [bq, bk] float32 tiles (S, P, dP, dS,
  the mask and a product)."""
  q_block, k_block = eqn.params["grid_mapping"].block_mappings[:2]  # every kernel: q, k first
  bq, bk = q_block.transformed_block_aval.shape[-2], k_block.transformed_block_aval.shape[-2]
  return (_pipeline_vmem(eqn) + 3 * _vmem_bytes((block_d, bq, bk), jnp.float32)
          + 6 * _vmem_bytes((bq, bk), jnp.float32))


def test_additive_tpu_tiles_fit_scoped_vmem():
  """The additive kernel's TPU tiles (64 x 128, backward 32 x 128, block_d 8), bf16, T = 16k:
  each kernel's estimate stays within v5e's scoped VMEM for d_attn up to 512, and the figures
  are pinned (the backward's stash, [d_attn, 32, 128] float32, is 4 MiB at d_attn = 256 and
  dropped above it: its slabs are then formed twice). libtpu compiles these (the opt-in test)."""
  T, got = 16384, {}
  for d_attn in (128, 256, 512):
    f, args, name, _ = _BUILDS["additive"](d_attn, jnp.bfloat16, Tq=T, Tk=T)
    calls = _tpu_kernels(_with_grad(f, len(args)), *args, *_LENGTHS)
    for kernel, eqn in calls.items():
      got[kernel.rsplit("_", 1)[1], d_attn] = _additive_tile_vmem(eqn)
  assert max(got.values()) <= V5E_SCOPED_VMEM, got
  assert {k: round(v / 2**20, 2) for k, v in got.items()} == {  # MiB
      ("fwd", 128): 1.49, ("fwd", 256): 1.78, ("fwd", 512): 2.36,
      ("dq", 128): 2.98, ("dq", 256): 5.33, ("dq", 512): 2.03,
      ("dkv", 128): 3.22, ("dkv", 256): 5.69, ("dkv", 512): 2.62}, got


@pytest.mark.parametrize("kernel", ["dot", "additive"])
def test_tpu_grid_semantics(kernel):
  """Grid (b, h, written block, read block): the last axis reduces into scratch ("arbitrary"),
  the others are "parallel" (megacore may split them)."""
  f, args, _, _ = _BUILDS[kernel](64, jnp.float32)
  calls = _tpu_kernels(_with_grad(f, len(args)), *args, *_LENGTHS)
  assert len(calls) == 3
  for kernel, eqn in calls.items():
    params = eqn.params["compiler_params"]
    assert isinstance(params, pltpu.CompilerParams), kernel
    assert params.dimension_semantics == ("parallel", "parallel", "parallel", "arbitrary"), kernel
    assert len(eqn.params["grid_mapping"].grid) == 4


@pytest.mark.parametrize("kernel", ["dot", "additive"])
def test_tpu_forward_keeps_m_and_l_lane_replicated(kernel):
  """The forward's online-softmax scratch: m and l as [block_q, 128] (each row's value in every
  lane, stored as whole vregs), acc as [block_q, dv]; all float32."""
  f, args, name, _ = _BUILDS[kernel](64, jnp.float32)
  eqn = _tpu_kernels(f, *args, *_LENGTHS)[f"{name}_fwd"]
  n = eqn.params["grid_mapping"].num_scratch_operands
  scratch = [v.aval for v in eqn.params["jaxpr"].invars[-n:]]
  bq = kernels.targets.get("tpu").tiles(name).clamp(TQ, TK).block_q
  assert [(a.shape, a.dtype) for a in scratch[:2]] == [((bq, 128), jnp.float32)] * 2, scratch
  assert scratch[2].shape == (bq, args[-1].shape[-1]) and scratch[2].dtype == jnp.float32


# Which blocks each grid step fetches (skipped steps: none) is tested from the index maps in
# tests/test_kernels_tpu_dma.py.


# ----------------------------------------------------------------------------------------------
# With libtpu installed (`pip install libtpu` matching jax's `tpu` extra; not a project
# dependency), the whole TPU compile, Mosaic's layout passes and VMEM budget included, runs
# deviceless against a v5e topology. It runs in a subprocess: libtpu must load before any backend.

_TPU_ENV = {"TPU_ACCELERATOR_TYPE": "v5litepod-4", "TPU_WORKER_HOSTNAMES": "localhost",
            "TPU_SKIP_MDS_QUERY": "1"}


# Beyond CASES: T = 16k, bf16, d = 128, forward + backward (holding a whole sequence in VMEM,
# both kernels' dk/dv backward ran out of v5e's 16 MiB scoped VMEM).
# The additive kernel also at d_attn = 256 (its backward's tanh stash at 4 MiB) and 512 (no stash).
LONG_CASES = [("dot", 128, jnp.bfloat16, True, 16384)] + [
    ("additive", d, jnp.bfloat16, True, 16384) for d in (128, 256, 512)]


def _aot_compile_all():
  """Compiles every CASES and LONG_CASES entry (forward, or its gradient) for a TPU v5e core;
  prints one line each."""
  from jax.experimental import topologies
  from jax.sharding import SingleDeviceSharding
  topo = topologies.get_topology_desc(topology_name="v5e:2x2", platform="tpu")
  sharding = SingleDeviceSharding(topo.devices[0])
  for kernel, d, dtype, backward, *T in CASES + LONG_CASES:
    lengths = dict(Tq=T[0], Tk=T[0]) if T else {}
    f, args, _, _ = _BUILDS[kernel](d, dtype, **lengths)
    args = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding) for a in args + _LENGTHS]
    if backward:
      f = _with_grad(f, len(args) - 2)
    jax.jit(f).lower(*args).compile()
    print("compiled", kernel, d, jnp.dtype(dtype).name, backward, *T, flush=True)


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
  assert run.stdout.count("compiled") == len(CASES) + len(LONG_CASES)


if __name__ == "__main__":
  _aot_compile_all()
