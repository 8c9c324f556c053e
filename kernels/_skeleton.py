"""The skeleton every fused kernel runs through; a kernel module supplies only its score.

A kernel is described once by a `KernelSpec`: its Pallas forward and backward (kernel bodies and
BlockSpecs), the per-tile score function of the blocked and naive paths, its input checks and its
default tiles. From the spec this module provides, the same for every kernel:
- `pallas_padded`: pads to kernel-friendly shapes and runs the Pallas kernels under one
  `jax.custom_vjp` (`_pallas_core`); outputs can start NaN-poisoned (tests and the benchmark's
  device check use it to prove every element is written);
- `check` and `dispatch`: the public wrappers' body — input checks and lengths, then the choice
  of implementation ("pallas", "blocked", "xla"; "auto") and of tiles.

Operands are named as in the blocked path, whatever the public names: q [B, Tq, H, dq],
k [B, Tk, H, dq], v [B, Tk, H, dv] (the Pallas kernels get them head-major, [B, H, T, d]), and
theta, the score's per-head parameters ([H, dq]) or None.
theta's last axis lives in the q/k feature space and is zero-padded with it.
Static score arguments (the dot-product kernel's `scale`) travel as keyword arguments to the
Pallas kernels (through `Config.score_kw`) and to the score function of the other paths.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels import _common
from kernels._common import MAX_HEAD_DIM, MIN_BLOCK, BlockSizes

IMPLEMENTATIONS = ("auto", "pallas", "blocked", "xla")
# Which forward a CUDA lowering of implementation="pallas" uses: the Triton kernels, or a kernel
# spec's Mosaic GPU forward (Hopper: TMA + WGMMA) where it has one. Backward: Triton either way.
GPU_LOWERINGS = ("triton", "mosaic")


@dataclasses.dataclass(frozen=True)
class Config:
  """Static arguments of one padded Pallas run (a custom_vjp nondiff argument: hashable)."""
  causal: bool
  blocks: BlockSizes  # clamped to the sequence lengths; block_d resolved
  interpret: bool | pltpu.InterpretParams  # see `resolve_interpret`
  poison: bool = False  # pre-fill outputs with NaN so unwritten elements show
  score_kw: tuple[tuple[str, Any], ...] = ()  # static score arguments, e.g. (("scale", 0.125),)
  gpu_lowering: str = "triton"  # one of GPU_LOWERINGS

  @property
  def tpu_launch(self) -> bool:
    """Interpret mode runs the kernels' TPU launch (kernels/_tpu.py) on JAX's TPU interpreter."""
    return isinstance(self.interpret, pltpu.InterpretParams)


@dataclasses.dataclass(frozen=True)
class KernelSpec:
  """What makes one fused kernel different from another.

  forward(q, k, v, theta, kl, ql, cfg) -> (out [B, H, Tq_p, dv_p], lse [B, H, Tq_p] float32) and
  backward(q, k, v, theta, do, lse, delta, kl, ql, cfg) -> (dq, dk, dv, dtheta) run the Pallas
  kernels on padded, head-major operands (q [B, H, Tq_p, dq_p], ...);
  delta = rowsum(dO ∘ O) − ∂L/∂lse, [B, H, Tq_p].
  score(theta, q_blk [tq, dq], k_blk [tk, dq], **score_kw) -> [tq, tk] float32: the blocked and
  naive paths' score (differentiated by autodiff per tile).
  check_inputs(q, k, v, theta): raises ValueError with the public argument names.
  mosaic_forward: forward's signature; the forward under gpu_lowering="mosaic" (it chooses its own
  fallback where Mosaic GPU does not apply), or None where the kernel has no Mosaic GPU forward.
  """
  name: str
  forward: Callable
  backward: Callable
  score: Callable
  check_inputs: Callable
  gpu_blocks: BlockSizes
  interpret_blocks: BlockSizes  # interpret mode: large tiles, since grid steps are what costs
  blocked_blocks: BlockSizes
  min_qk_width: int = MIN_BLOCK  # q/k features are padded to a power of two >= this
  max_qk_dim: int | None = MAX_HEAD_DIM  # None: the kernel slices q/k features by block_d
  tpu_blocks: BlockSizes | None = None  # compiled tiles when running on a TPU (None: gpu_blocks)
  mosaic_forward: Callable | None = None

  def default_blocks(self, implementation: str, interpret: bool) -> BlockSizes:
    if implementation == "blocked":
      return self.blocked_blocks
    if interpret:
      return self.interpret_blocks
    if self.tpu_blocks is not None and jax.default_backend() == "tpu":
      return self.tpu_blocks
    return self.gpu_blocks


# ----------------------------------------------------------------------------------------------
# Public-argument handling.


def resolve_implementation(implementation: str) -> str:
  """"auto" -> "pallas" on GPU, "blocked" elsewhere. Unknown names fail with the known ones."""
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(
        f"unknown implementation {implementation!r}; known: {', '.join(IMPLEMENTATIONS)}")
  if implementation == "auto":
    # TPU stays on the blocked path: both kernels lower to Mosaic TPU and compile deviceless for
    # v5e (tests/test_kernels_tpu.py), but have neither run nor been timed on a TPU.
    return "pallas" if jax.default_backend() == "gpu" else "blocked"
  return implementation


def resolve_interpret(interpret) -> bool | pltpu.InterpretParams:
  """Pallas runs in interpret mode on CPU (there is no CPU lowering). True runs the GPU launch on
  the generic interpreter; a `pltpu.InterpretParams` runs the TPU launch (grid with a reduction
  axis, VMEM scratch) on JAX's TPU interpreter, which reads uninitialized scratch as NaN."""
  if interpret is None:
    return jax.default_backend() == "cpu"
  return interpret if isinstance(interpret, pltpu.InterpretParams) else bool(interpret)


def resolve_blocks(block_q, block_k, block_sizes, default: BlockSizes) -> BlockSizes:
  """The BlockSizes to use from the public arguments (block_sizes wins; block_q/k override)."""
  if block_sizes is not None:
    if block_q is not None or block_k is not None:
      raise ValueError("pass either block_sizes or block_q/block_k, not both")
    if not isinstance(block_sizes, BlockSizes):
      raise ValueError(
          f"block_sizes must be a kernels.BlockSizes, got {type(block_sizes).__name__}")
    return block_sizes
  changes = {}
  if block_q is not None:
    changes.update(block_q=block_q, block_q_bwd=block_q)
  if block_k is not None:
    changes.update(block_k=block_k, block_k_bwd=block_k)
  return dataclasses.replace(default, **changes)


def check_gpu_lowering(spec: KernelSpec, gpu_lowering: str) -> str:
  """gpu_lowering checked against GPU_LOWERINGS and what the kernel offers."""
  if gpu_lowering not in GPU_LOWERINGS:
    raise ValueError(
        f"unknown gpu_lowering {gpu_lowering!r}; known: {', '.join(GPU_LOWERINGS)}")
  if gpu_lowering == "mosaic" and spec.mosaic_forward is None:
    raise ValueError(f"the {spec.name} kernel has no Mosaic GPU forward; use gpu_lowering='triton'")
  return gpu_lowering


def check_lengths(name: str, lengths, B: int, T: int):
  """[B] int32 lengths clipped to [0, T]; T for every sequence when `lengths` is None."""
  if lengths is None:
    return jnp.full((B,), T, jnp.int32)
  lengths = jnp.asarray(lengths)
  if lengths.shape != (B,):
    raise ValueError(f"{name} must have shape [B]=({B},), got {lengths.shape}")
  if not jnp.issubdtype(lengths.dtype, jnp.integer):
    raise ValueError(f"{name} must be integer, got {lengths.dtype}")
  return jnp.clip(lengths.astype(jnp.int32), 0, T)


def check(spec: KernelSpec, q, k, v, theta, key_lengths, query_lengths):
  """The spec's input checks, then the lengths: (kl, ql), [B] int32 clipped to [0, Tk], [0, Tq]."""
  spec.check_inputs(q, k, v, theta)
  B, Tq, Tk = q.shape[0], q.shape[1], k.shape[1]
  return (check_lengths("key_lengths", key_lengths, B, Tk),
          check_lengths("query_lengths", query_lengths, B, Tq))


# ----------------------------------------------------------------------------------------------
# The Pallas path: padding and the custom_vjp around the spec's kernels.


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _pallas_core(spec: KernelSpec, cfg: Config, operands, kl, ql):
  forward = spec.mosaic_forward if cfg.gpu_lowering == "mosaic" else spec.forward
  return tuple(forward(*operands, kl, ql, cfg))


def _pallas_core_fwd(spec, cfg, operands, kl, ql):
  out, lse = _pallas_core(spec, cfg, operands, kl, ql)
  return (out, lse), (operands, kl, ql, out, lse)


def _pallas_core_bwd(spec, cfg, res, cts):
  operands, kl, ql, out, lse = res
  g_out, g_lse = cts
  # delta_i = dO_i . O_i - dL/dlse_i: a cotangent on lse adds P_ij to dS_ij, i.e. shifts delta.
  delta = jnp.einsum("bhqd,bhqd->bhq", g_out.astype(jnp.float32), out.astype(jnp.float32)) - g_lse
  grads = spec.backward(*operands, g_out.astype(out.dtype), lse, delta, kl, ql, cfg)
  return tuple(grads), None, None


_pallas_core.defvjp(_pallas_core_fwd, _pallas_core_bwd)


def pallas_padded(spec: KernelSpec, q, k, v, theta, kl, ql, *, causal: bool,
                  blocks: BlockSizes | None = None, interpret=None,
                  poison: bool = False, gpu_lowering: str = "triton", **score_kw):
  """Pads to kernel-friendly shapes and runs the spec's Pallas kernels (differentiable).

  Sequence axes are padded to multiples of the (clamped) forward and backward tiles, q/k
  features to a power of two >= spec.min_qk_width, v's to a power of two >= 16. Zero feature
  padding is exact for our scores (a zero column adds nothing to q·k, and tanh(0 + 0)·0 nothing
  to the additive score); padded rows are masked by the lengths. kl, ql: [B] int32 in range.
  blocks: default the spec's Pallas tiles. Returns the padded (out [B, Tq_p, H, dv_p],
  lse [B, H, Tq_p]); with poison=True every output starts as NaN (unwritten elements show).
  gpu_lowering: GPU_LOWERINGS; "mosaic" runs the spec's Mosaic GPU forward (in the Mosaic GPU
  interpreter in interpret mode).
  """
  Tq, Tk, d, dv = q.shape[1], k.shape[1], q.shape[-1], v.shape[-1]
  if dv > MAX_HEAD_DIM or (spec.max_qk_dim is not None and d > spec.max_qk_dim):
    limit = "head dims" if spec.max_qk_dim is not None else "value head dims"
    raise ValueError(f"the {spec.name} Pallas kernel supports {limit} up to {MAX_HEAD_DIM}, got "
                     f"d={d}, dv={dv}; use implementation='blocked'")
  interpret = resolve_interpret(interpret)
  if blocks is None:
    blocks = spec.default_blocks("pallas", interpret)
  blocks = blocks.clamp(Tq, Tk)
  d_p = max(spec.min_qk_width, _common.next_pow2(d))
  blocks = dataclasses.replace(blocks, block_d=min(blocks.block_d or d_p, d_p))
  bq, bk = max(blocks.block_q, blocks.bwd_q), max(blocks.block_k, blocks.bwd_k)
  Tq_p, Tk_p = pl.cdiv(Tq, bq) * bq, pl.cdiv(Tk, bk) * bk
  dv_p = max(MIN_BLOCK, _common.next_pow2(dv))
  # Head-major inside the kernels: a [B, H, T, d] block (None, None, rows, d) keeps the last two
  # block dims (rows, d) TPU-legal; [B, T, H, d] would put a squeezed head axis second-minor.
  pad = lambda x, T, width: _common.pad_axis(_common.pad_axis(_to_heads(x), 2, T), 3, width)
  operands = (pad(q, Tq_p, d_p), pad(k, Tk_p, d_p), pad(v, Tk_p, dv_p),
              None if theta is None else _common.pad_axis(theta, theta.ndim - 1, d_p))
  cfg = Config(causal=bool(causal), blocks=blocks, interpret=interpret, poison=poison,
               score_kw=tuple(sorted(score_kw.items())),
               gpu_lowering=check_gpu_lowering(spec, gpu_lowering))
  out, lse = _pallas_core(spec, cfg, operands, kl, ql)
  return _to_heads(out), lse


# ----------------------------------------------------------------------------------------------
# Implementations: each (spec, q, k, v, theta, kl, ql, *, causal, blocks, interpret, score_kw)
# -> (out [B, Tq, H, dv] in v's dtype, lse [B, Tq, H] float32).


def _to_heads(x):  # [B, T, H, d] -> [B, H, T, d]: the layout of the blocked and naive cores
  return jnp.swapaxes(x, 1, 2)


def _impl_pallas(spec, q, k, v, theta, kl, ql, *, causal, blocks, interpret, score_kw,
                 gpu_lowering="triton"):
  out, lse = pallas_padded(spec, q, k, v, theta, kl, ql, causal=causal, blocks=blocks,
                           interpret=interpret, gpu_lowering=gpu_lowering, **score_kw)
  Tq, dv = q.shape[1], v.shape[-1]
  return out[:, :Tq, :, :dv], jnp.swapaxes(lse[:, :, :Tq], 1, 2)


def _impl_blocked(spec, q, k, v, theta, kl, ql, *, causal, blocks, interpret, score_kw):
  del interpret
  out, lse = _common.blocked_attention(
      functools.partial(spec.score, **score_kw), _to_heads(q), _to_heads(k), _to_heads(v), theta,
      kl, ql, causal=causal, block_q=blocks.block_q, block_k=blocks.block_k)
  return _to_heads(out).astype(v.dtype), jnp.swapaxes(lse, 1, 2)


def _impl_xla(spec, q, k, v, theta, kl, ql, *, causal, blocks, interpret, score_kw):
  del blocks, interpret
  out, lse = _common.naive_attention(
      functools.partial(spec.score, **score_kw), _to_heads(q), _to_heads(k), _to_heads(v), theta,
      kl, ql, causal=causal)
  return _to_heads(out).astype(v.dtype), jnp.swapaxes(lse, 1, 2)


_IMPLEMENTATIONS = {"pallas": _impl_pallas, "blocked": _impl_blocked, "xla": _impl_xla}


def dispatch(spec: KernelSpec, q, k, v, theta, kl, ql, *, causal: bool, implementation: str,
             block_q: int | None, block_k: int | None, block_sizes: BlockSizes | None,
             interpret, block_d: int | None = None, gpu_lowering: str = "triton",
             **score_kw):
  """Runs the chosen implementation on checked inputs (kl, ql from `check`); the tiles are the
  spec's defaults for it, overridden by block_q / block_k / block_d or replaced by block_sizes.
  gpu_lowering (GPU_LOWERINGS) is checked always and used by the Pallas path only."""
  impl = resolve_implementation(implementation)
  gpu_lowering = check_gpu_lowering(spec, gpu_lowering)
  extra = {"gpu_lowering": gpu_lowering} if impl == "pallas" else {}
  interpret = resolve_interpret(interpret)
  blocks = resolve_blocks(block_q, block_k, block_sizes, spec.default_blocks(impl, interpret))
  if block_d is not None:
    blocks = dataclasses.replace(blocks, block_d=block_d)
  return _IMPLEMENTATIONS[impl](spec, q, k, v, theta, kl, ql, causal=bool(causal), blocks=blocks,
                                interpret=interpret, score_kw=score_kw, **extra)
