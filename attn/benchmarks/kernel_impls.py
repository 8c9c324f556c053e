"""The implementations each fused kernel is benchmarked against, and what the benchmark needs to
know of each kernel (its inputs, its FLOPs per query-key pair, its reference): `KERNELS`, a
Registry of `BenchImpl`s, so the benchmark never branches on a kernel's name. jax alone.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

from attn.errors import ConfigError
from attn.registry import Registry
from kernels import additive as _additive
from kernels import flash_attention as _flash


class Unavailable(Exception):
  """This implementation does not exist on this machine (recorded, not fatal)."""


# ----------------------------------------------------------------------------------------------
# Implementations: build(causal, blocks) -> fn(*inputs) -> out [B, T, H, dv].


def _ours(fn, implementation, **options):
  def build(causal, blocks):
    if implementation == "pallas" and jax.default_backend() == "cpu":
      raise Unavailable("Pallas has only interpret mode on CPU (not a timing)")
    kw = {} if blocks is None else {"block_sizes": blocks}
    return lambda *a: fn(*a, causal=causal, implementation=implementation, **kw, **options)
  return build


def _ours_mosaic(fn, target="mosaic_gpu"):
  """Our kernel on a "mosaic_gpu" target (its Mosaic GPU forward): Hopper only (WGMMA)."""
  ours = _ours(fn, "pallas", target=target)

  def build(causal, blocks):
    if jax.default_backend() != "gpu":
      raise Unavailable("GPU only (Hopper)")
    capability = getattr(jax.devices()[0], "compute_capability", None)
    if capability != "9.0":
      raise Unavailable(f"WGMMA needs Hopper (sm_90), this GPU is sm_{capability}")
    return ours(causal, blocks)
  return build


def _jax_nn(implementation):
  def build(causal, blocks):
    del blocks
    if implementation == "cudnn" and jax.default_backend() != "gpu":
      raise Unavailable("cuDNN needs a GPU")
    return lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal,
                                                        implementation=implementation)
  return build


def _jax_pallas_triton(causal, blocks):
  del blocks
  if jax.default_backend() != "gpu":
    raise Unavailable("GPU only")
  from jax.experimental.pallas.ops.gpu import attention as jattn  # deprecated for tokamax
  return lambda q, k, v: jattn.mha(q, k, v, None, sm_scale=1 / math.sqrt(q.shape[-1]),
                                   causal=causal)


def _jax_mosaic_gpu(causal, blocks):
  del blocks
  if jax.default_backend() != "gpu":
    raise Unavailable("GPU only (Hopper)")
  from jax.experimental.pallas.ops.gpu import attention_mgpu as mgpu
  config = mgpu.TuningConfig(block_q=64, block_kv=128, max_concurrent_steps=2, causal=causal,
                             block_q_dkv=64, block_kv_dkv=64, block_q_dq=64, block_kv_dq=64)
  return lambda q, k, v: mgpu.attention(q, k, v, config)


def _tokamax(causal, blocks):
  del blocks
  try:
    import tokamax  # pylint: disable=import-outside-toplevel
  except ImportError:
    raise Unavailable("tokamax is not installed") from None
  return lambda q, k, v: tokamax.dot_product_attention(q, k, v, is_causal=causal)


def _dot_inputs(keys, B, T, H, d, dv, dtype):
  """q, k [B, T, H, d]; v [B, T, H, dv]."""
  return (jax.random.normal(keys[0], (B, T, H, d), dtype),
          jax.random.normal(keys[1], (B, T, H, d), dtype),
          jax.random.normal(keys[2], (B, T, H, dv), dtype))


def _additive_inputs(keys, B, T, H, d, dv, dtype):
  """q, k [B, T, H, d_attn]; the tanh weights w [H, d_attn] (float32); v [B, T, H, dv]."""
  return (jax.random.normal(keys[0], (B, T, H, d), dtype),
          jax.random.normal(keys[1], (B, T, H, d), dtype),
          jax.random.normal(keys[2], (H, d), jnp.float32) / math.sqrt(d),
          jax.random.normal(keys[3], (B, T, H, dv), dtype))


@dataclasses.dataclass(frozen=True)
class BenchImpl:
  """What the benchmark needs to know of one fused kernel.

  impls: implementation name -> build(causal, blocks) -> fn(*inputs) -> out [B, T, H, dv]
    ("naive" is the dense reference path every other is compared with).
  padded: the padded Pallas entry (NaN-poisoned outputs); reference: the dense reference.
  inputs: (keys, B, T, H, d, dv, dtype) -> the kernel's inputs.
  value_dim: d -> the default dv.
  pair_flops: (d, dv) -> forward FLOPs per (query, key) pair and head.
  """
  impls: dict[str, Callable]
  padded: Callable
  reference: Callable
  inputs: Callable
  value_dim: Callable[[int], int]
  pair_flops: Callable[[int, int], float]


KERNELS: Registry[BenchImpl] = Registry("kernel", error=ConfigError)
KERNELS.add("dot", BenchImpl(
    impls={
        "pallas": _ours(_flash.attention, "pallas"),
        "pallas_mosaic": _ours_mosaic(_flash.attention),  # Mosaic GPU forward, Triton backward
        "pallas_mosaic_ws": _ours_mosaic(_flash.attention, "mosaic_gpu_ws"),  # warp-specialized
        "blocked": _ours(_flash.attention, "blocked"),
        "naive": _ours(_flash.attention, "xla"),
        "xla": _jax_nn("xla"),  # jax.nn.dot_product_attention(implementation="xla")
        "cudnn": _jax_nn("cudnn"),
        "jax_triton": _jax_pallas_triton,  # jax.experimental.pallas.ops.gpu.attention.mha
        "jax_mgpu": _jax_mosaic_gpu,  # jax.experimental.pallas.ops.gpu.attention_mgpu
        "tokamax": _tokamax,
    },
    padded=_flash.pallas_attention_padded, reference=_flash.attention_reference,
    inputs=_dot_inputs, value_dim=lambda d: d,
    pair_flops=lambda d, dv: 4 * d))  # q.k and p.v, 2 FLOPs a multiply-add (dv = d)
KERNELS.add("additive", BenchImpl(
    impls={
        "pallas": _ours(_additive.additive_attention, "pallas"),
        "blocked": _ours(_additive.additive_attention, "blocked"),
        "naive": _ours(_additive.additive_attention, "xla"),
    },
    padded=_additive.pallas_additive_attention_padded,
    reference=_additive.additive_attention_reference,
    inputs=_additive_inputs, value_dim=lambda d: 64,
    pair_flops=lambda d, dv: 2 * d + 2 * dv))  # the tanh stage, then p.v
