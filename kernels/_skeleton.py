"""The skeleton every fused kernel runs through; a kernel module supplies only its score.

A kernel is described once by a `FusedKernel`: its Pallas forward and backward (kernel bodies,
each pallas_call described as a `kernels.launch.Call`), the per-tile score function of the blocked
and naive paths and its input checks. Where and how it runs (launch, tiles, platforms) is a
target's (`kernels/targets/`). From the kernel and a target this module provides, the same for
every kernel:
- `pallas_padded`: pads to kernel-friendly shapes and runs the Pallas kernels under one
  `jax.custom_vjp` (`_pallas_core`); outputs can start NaN-poisoned (tests and the benchmark's
  device check use it to prove every element is written);
- `check` and `dispatch`: the public wrappers' body: input checks and lengths, then the choice
  of implementation ("pallas", "blocked", "xla"; "auto") and of target, and the target's tiles.

Operands are named as in the blocked path, whatever the public names: q [B, Tq, H, dq],
k [B, Tk, H, dq], v [B, Tk, H, dv] (the Pallas kernels get them in the layout of the target's
launch, `kernels.launch.Layout`: as they are on the GPU, head-major [B, H, T, d] on the TPU), and
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
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.extend import core as jex_core
from jax.interpreters import mlir

from kernels import _common, launch, targets
from kernels._common import MIN_BLOCK, BlockSizes
from kernels.targets import AUTO, Target

IMPLEMENTATIONS = ("auto", "pallas", "blocked", "xla")


@dataclasses.dataclass(frozen=True)
class Config:
  """Static arguments of one padded Pallas run (a custom_vjp nondiff argument: hashable)."""
  causal: bool
  blocks: BlockSizes  # clamped to the sequence lengths; block_d resolved
  target: Target  # supplies the launch (`target.launch(call, inputs, cfg)`)
  poison: bool = False  # pre-fill outputs with NaN so unwritten elements show
  score_kw: tuple[tuple[str, Any], ...] = ()  # static score arguments, e.g. (("scale", 0.125),)

  @property
  def interpret(self):
    """pallas_call's `interpret`: the target's (False when compiled)."""
    return self.target.interpret

  @property
  def layout(self) -> launch.Layout:
    """The layout of the kernels' operands: the target's launch's."""
    return launch.layout_of(self.target.launch)


@dataclasses.dataclass(frozen=True)
class FusedKernel:
  """What makes one fused kernel different from another (targets supply launch and tiles).

  forward(q, k, v, theta, kl, ql, cfg) -> (out [B, H, Tq_p, dv_p], lse [B, H, Tq_p] float32) and
  backward(q, k, v, theta, do, lse, delta, kl, ql, cfg) -> (dq, dk, dv, dtheta) run the Pallas
  kernels on padded operands (q [B, H, Tq_p, dq_p], ...) through `cfg.target.launch`; delta =
  rowsum(dO ∘ O) − ∂L/∂lse, [B, H, Tq_p]. Shapes are written head-major: operands, outputs and
  row statistics are all in `cfg.layout` (token-major: q [B, Tq_p, H, dq_p], lse [B, Tq_p, H]).
  score(theta, q_blk [tq, dq], k_blk [tk, dq], **score_kw) -> [tq, tk] float32: the blocked and
  naive paths' score (differentiated by autodiff per tile).
  check_inputs(q, k, v, theta): raises ValueError with the public argument names.
  name: the key of the kernel's tiles in `Target.blocks`.
  """
  name: str
  forward: Callable
  backward: Callable
  score: Callable
  check_inputs: Callable
  min_qk_width: int = MIN_BLOCK  # q/k features are padded to a power of two >= this
  limits_qk_width: bool = True  # False: the kernel slices q/k features by block_d (any width)


# ----------------------------------------------------------------------------------------------
# Public-argument handling: implementation, target, tiles, lengths.


def resolve_implementation(implementation: str, target: str = AUTO) -> str:
  """"auto" -> the named target's implementation, else "pallas" on GPU, "blocked" elsewhere.
  Unknown names fail with the known ones."""
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(
        f"unknown implementation {implementation!r}; known: {', '.join(IMPLEMENTATIONS)}")
  if implementation == "auto":
    if target != AUTO:
      return targets.get(target).implementation
    # TPU stays on the blocked path: both kernels lower to Mosaic TPU and compile deviceless for
    # v5e (tests/test_kernels_tpu.py), but have neither run nor been timed on a TPU.
    return "pallas" if jax.default_backend() == "gpu" else "blocked"
  return implementation


def resolve_interpret(interpret) -> bool | pltpu.InterpretParams:
  """Pallas runs in interpret mode on CPU (there is no CPU lowering): None -> True on a CPU host.
  True picks a target's interpreter twin ("interpret": the Triton launch on the generic
  interpreter); a `pltpu.InterpretParams` runs the TPU launch on JAX's TPU interpreter with them."""
  if interpret is None:
    return jax.default_backend() == "cpu"
  return interpret if isinstance(interpret, pltpu.InterpretParams) else bool(interpret)


def resolve_target(implementation: str, target: str = AUTO,
                   interpret=None) -> Target | dict[str, Target] | None:
  """The target(s) a call runs on, from its public arguments (implementation resolved).

  "xla": None (the dense reference runs no target). "blocked": target "auto" is "cpu_blocked".
  "pallas": a named target, or its interpreter twin when interpreting; with target "auto", the
  "interpret" target (or "tpu_interpret" for `pltpu.InterpretParams`) when interpreting, else
  {platform: target} of the targets "auto" compiles for each platform, to switch between at
  lowering (`lax.platform_dependent`). Unknown or mismatched targets raise ValueError.
  """
  if implementation == "xla":
    if target != AUTO:
      raise ValueError(f"implementation='xla' is the dense reference; it runs no target "
                       f"(got target={target!r})")
    return None
  if implementation == "blocked":
    chosen = targets.get("cpu_blocked" if target == AUTO else target)
  else:
    interpret = resolve_interpret(interpret)
    if target == AUTO:
      if interpret is False:
        return targets.TARGETS.auto("pallas")
      target = "tpu" if isinstance(interpret, pltpu.InterpretParams) else "triton"
    chosen = targets.get(target)
    if interpret is not False and chosen.interpreted is not None:
      chosen = targets.get(chosen.interpreted)
    if isinstance(interpret, pltpu.InterpretParams) and chosen.interpret is not False:
      chosen = dataclasses.replace(chosen, interpret=interpret)
  if chosen.implementation != implementation:
    raise ValueError(f"target {chosen.name!r} runs implementation={chosen.implementation!r}, "
                     f"not {implementation!r}")
  return chosen


def resolve_blocks(block_q, block_k, block_sizes, default: BlockSizes,
                   block_d: int | None = None) -> BlockSizes:
  """The BlockSizes to use from the public arguments (block_sizes wins; block_q/k/d override)."""
  if block_sizes is not None:
    if block_q is not None or block_k is not None:
      raise ValueError("pass either block_sizes or block_q/block_k, not both")
    if not isinstance(block_sizes, BlockSizes):
      raise ValueError(
          f"block_sizes must be a kernels.BlockSizes, got {type(block_sizes).__name__}")
    default = block_sizes
  changes = {}
  if block_q is not None:
    changes.update(block_q=block_q, block_q_bwd=block_q)
  if block_k is not None:
    changes.update(block_k=block_k, block_k_bwd=block_k)
  if block_d is not None:
    changes.update(block_d=block_d)
  return dataclasses.replace(default, **changes)


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


def check(kernel: FusedKernel, q, k, v, theta, key_lengths, query_lengths):
  """The kernel's input checks, then the lengths: (kl, ql), [B] int32 clipped to [0, Tk], [0, Tq]."""
  kernel.check_inputs(q, k, v, theta)
  B, Tq, Tk = q.shape[0], q.shape[1], k.shape[1]
  return (check_lengths("key_lengths", key_lengths, B, Tk),
          check_lengths("query_lengths", query_lengths, B, Tq))


# ----------------------------------------------------------------------------------------------
# The Pallas path: padding and the custom_vjp around the kernel's Pallas kernels.


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _pallas_core(kernel: FusedKernel, cfg: Config, operands, kl, ql):
  forward = cfg.target.forwards.get(kernel.name)
  if forward is not None:
    return tuple(forward(*operands, kl, ql, cfg, fallback=kernel.forward))
  return tuple(kernel.forward(*operands, kl, ql, cfg))


def _pallas_core_fwd(kernel, cfg, operands, kl, ql):
  out, lse = _pallas_core(kernel, cfg, operands, kl, ql)
  return (out, lse), (operands, kl, ql, out, lse)


def _pallas_core_bwd(kernel, cfg, res, cts):
  operands, kl, ql, out, lse = res
  g_out, g_lse = cts
  # delta_i = dO_i . O_i - dL/dlse_i: a cotangent on lse adds P_ij to dS_ij, i.e. shifts delta.
  # A sum over the last axis, so delta comes in the layout of lse (either layout).
  delta = jnp.sum(g_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1) - g_lse
  grads = kernel.backward(*operands, g_out.astype(out.dtype), lse, delta, kl, ql, cfg)
  return tuple(grads), None, None


_pallas_core.defvjp(_pallas_core_fwd, _pallas_core_bwd)


def _run_padded(kernel: FusedKernel, target: Target, q, k, v, theta, kl, ql, *, causal: bool,
                blocks: BlockSizes, poison: bool, score_kw):
  """The kernel's Pallas kernels on `target` with tiles `blocks`: (out [B, Tq_p, H, dv_p],
  lse [B, Tq_p, H]) (see `pallas_padded`)."""
  Tq, Tk, d, dv = q.shape[1], k.shape[1], q.shape[-1], v.shape[-1]
  blocks = blocks.clamp(Tq, Tk)
  d_p = max(kernel.min_qk_width, _common.next_pow2(d))
  blocks = dataclasses.replace(blocks, block_d=min(blocks.block_d or d_p, d_p))
  bq, bk = max(blocks.block_q, blocks.bwd_q), max(blocks.block_k, blocks.bwd_k)
  Tq_p, Tk_p = pl.cdiv(Tq, bq) * bq, pl.cdiv(Tk, bk) * bk
  dv_p = max(MIN_BLOCK, _common.next_pow2(dv))
  cfg = Config(causal=bool(causal), blocks=blocks, target=target, poison=poison,
               score_kw=tuple(sorted(score_kw.items())))
  B, H = q.shape[0], q.shape[2]
  if B == 0 or H == 0:  # no rows or no heads: an empty grid, nothing to launch or differentiate
    return (jnp.zeros((B, Tq_p, H, dv_p), v.dtype),
            jnp.full((B, Tq_p, H), -jnp.inf, jnp.float32))
  # Operands in the launch's layout (a transpose only for head-major), padded only where a
  # length is not a multiple of the tiles or a width not a power of two: `pad_axis` is the
  # identity otherwise, so a [B, T, H, d] call with such shapes reaches Triton untouched.
  # Pallas Triton does not mask block loads at the array's end (a load is a plain pointer
  # offset, masked only where the kernel passes a mask), so sequences stay padded to whole tiles.
  layout = cfg.layout
  pad = lambda x, T, width: _common.pad_axis(
      _common.pad_axis(layout.arrange(x), layout.seq_axis, T), 3, width)
  operands = (pad(q, Tq_p, d_p), pad(k, Tk_p, d_p), pad(v, Tk_p, dv_p),
              None if theta is None else _common.pad_axis(theta, theta.ndim - 1, d_p))
  out, lse = _pallas_core(kernel, cfg, operands, kl, ql)
  return layout.arrange(out), layout.arrange(lse)


def no_target_error(platform: str, platforms) -> ValueError:
  """The one error for compiled Pallas asked of a platform none of `platforms` is."""
  return ValueError(f"no compiled Pallas target for platform {platform!r} (targets for: "
                    f"{', '.join(platforms)}); pass interpret=True or a target")


# The branch of the compiled Pallas path for a platform no target compiles for (a CPU, with
# interpret=False): `lax.platform_dependent` picks the branch when the call is lowered, so the
# error must come then too; raised while tracing it would also refuse lowering for the other
# platforms from a CPU host (jax.export for cuda or tpu). Without this branch that lowering
# fails inside MLIR ("platform_index ... not found for platform cpu").
_no_target_p = jex_core.Primitive("no_compiled_pallas_target")
_no_target_p.multiple_results = True
_no_target_p.def_abstract_eval(lambda *, avals, platforms: list(avals))


def _no_target_lowering(ctx, *, avals, platforms):
  del avals
  raise no_target_error(ctx.module_context.platforms[0], platforms)


mlir.register_lowering(_no_target_p, _no_target_lowering)


def _host_target(chosen) -> Target:
  """One target from `resolve_target`'s answer: a table is read for the host's platform."""
  if isinstance(chosen, Target):
    return chosen
  platform = {"gpu": "cuda"}.get(jax.default_backend(), jax.default_backend())
  if platform not in chosen:
    raise no_target_error(platform, chosen)
  return chosen[platform]


def pallas_padded(kernel: FusedKernel, q, k, v, theta, kl, ql, *, causal: bool,
                  blocks: BlockSizes | None = None, target: str = AUTO, interpret=None,
                  poison: bool = False, **score_kw):
  """Pads to kernel-friendly shapes and runs the kernel's Pallas kernels (differentiable).

  Sequence axes are padded to multiples of the (clamped) forward and backward tiles, q/k
  features to a power of two >= kernel.min_qk_width, v's to a power of two >= 16. Zero feature
  padding is exact for our scores (a zero column adds nothing to q·k, and tanh(0 + 0)·0 nothing
  to the additive score); padded rows are masked by the lengths. kl, ql: [B] int32 in range.
  target, interpret: as `resolve_target`; the padded shapes depend on the tiles, so target
  "auto" compiled is the host's platform's target. blocks: default the target's tiles.
  Returns the padded (out [B, Tq_p, H, dv_p], lse [B, H, Tq_p]); with poison=True every output
  starts as NaN (unwritten elements show).
  """
  chosen = _host_target(resolve_target("pallas", target, interpret))
  chosen.check(kernel, q, v)
  if blocks is None:
    blocks = chosen.tiles(kernel.name, dtype=jnp.promote_types(q.dtype, v.dtype),
                          d=q.shape[-1], dv=v.shape[-1])
  out, lse = _run_padded(kernel, chosen, q, k, v, theta, kl, ql, causal=causal, blocks=blocks,
                         poison=poison, score_kw=score_kw)
  return out, jnp.swapaxes(lse, 1, 2)


# ----------------------------------------------------------------------------------------------
# Implementations: each (kernel, target, q, k, v, theta, kl, ql, *, causal, tiles, score_kw)
# -> (out [B, Tq, H, dv] in v's dtype, lse [B, Tq, H] float32); tiles(target) -> BlockSizes.


def _to_heads(x):  # [B, T, H, d] -> [B, H, T, d]: the layout of the blocked and naive cores
  return jnp.swapaxes(x, 1, 2)


def _impl_pallas(kernel, chosen, q, k, v, theta, kl, ql, *, causal, tiles, score_kw):
  Tq, dv = q.shape[1], v.shape[-1]

  def run(target, q, k, v, theta, kl, ql):
    out, lse = _run_padded(kernel, target, q, k, v, theta, kl, ql, causal=causal,
                           blocks=tiles(target), poison=False, score_kw=score_kw)
    return out[:, :Tq, :, :dv], lse[:, :Tq]  # no op where nothing was padded

  if isinstance(chosen, Target) and not chosen.platforms:
    return run(chosen, q, k, v, theta, kl, ql)  # interpreted: runs wherever it is traced
  if isinstance(chosen, Target):  # compiled: lowering for a platform it lacks is refused there
    chosen = {p: chosen for p in chosen.platforms}
  B, H = q.shape[0], q.shape[2]
  avals = (jax.core.ShapedArray((B, Tq, H, dv), v.dtype),  # out, lse
           jax.core.ShapedArray((B, Tq, H), jnp.float32))
  refuse = lambda *_: tuple(_no_target_p.bind(avals=avals, platforms=tuple(chosen)))
  # Tiles, padding and launch chosen together per platform at lowering, not from the host.
  return lax.platform_dependent(q, k, v, theta, kl, ql, default=refuse,
                                **{p: functools.partial(run, t) for p, t in chosen.items()})


def _impl_blocked(kernel, chosen, q, k, v, theta, kl, ql, *, causal, tiles, score_kw):
  blocks = tiles(chosen)
  out, lse = _common.blocked_attention(
      functools.partial(kernel.score, **score_kw), _to_heads(q), _to_heads(k), _to_heads(v),
      theta, kl, ql, causal=causal, block_q=blocks.block_q, block_k=blocks.block_k)
  return _to_heads(out).astype(v.dtype), jnp.swapaxes(lse, 1, 2)


def _impl_xla(kernel, chosen, q, k, v, theta, kl, ql, *, causal, tiles, score_kw):
  del chosen, tiles
  out, lse = _common.naive_attention(
      functools.partial(kernel.score, **score_kw), _to_heads(q), _to_heads(k), _to_heads(v),
      theta, kl, ql, causal=causal)
  return _to_heads(out).astype(v.dtype), jnp.swapaxes(lse, 1, 2)


_IMPLEMENTATIONS = {"pallas": _impl_pallas, "blocked": _impl_blocked, "xla": _impl_xla}


def dispatch(kernel: FusedKernel, q, k, v, theta, kl, ql, *, causal: bool, implementation: str,
             block_q: int | None, block_k: int | None, block_sizes: BlockSizes | None,
             interpret, block_d: int | None = None, target: str = AUTO, **score_kw):
  """Runs the chosen implementation on checked inputs (kl, ql from `check`) on the chosen
  target (`resolve_target`); the tiles are the target's defaults for the kernel, overridden by
  block_q / block_k / block_d or replaced by block_sizes."""
  impl = resolve_implementation(implementation, target)
  chosen = resolve_target(impl, target, interpret)
  for t in ([] if chosen is None else [chosen] if isinstance(chosen, Target)
            else chosen.values()):
    t.check(kernel, q, v)
  # Defaults fitted to the target's on-chip memory for these inputs, unless given whole.
  given = block_sizes is not None or (block_q is not None and block_k is not None)
  fit = {} if given else dict(dtype=jnp.promote_types(q.dtype, v.dtype), d=q.shape[-1],
                              dv=v.shape[-1])
  tiles = lambda t: resolve_blocks(block_q, block_k, block_sizes, t.tiles(kernel.name, **fit),
                                   block_d)
  if q.shape[0] == 0:
    impl = "xla"  # an empty batch: the empty result (and lse) of the right shapes and dtypes
  return _IMPLEMENTATIONS[impl](kernel, chosen, q, k, v, theta, kl, ql, causal=bool(causal),
                                tiles=tiles, score_kw=score_kw)
