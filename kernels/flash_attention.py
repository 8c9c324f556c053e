"""Fused scaled dot-product attention (flash attention) in Pallas, with its CPU path and reference.

    out_i = Σ_j softmax_j(scale · q_i·k_j over valid j) v_j

computed in one pass over key blocks with the online softmax (FlashAttention-2, Dao 2023,
Algorithm 1), never forming the [Tq, Tk] matrix; the backward pass (Algorithm 2) recomputes each
probability tile from the saved log-sum-exp in two Pallas kernels, one for dq (grid over query
blocks) and one for dk/dv (grid over key blocks), so neither needs atomics.

Layout `[B, T, H, d]` as in `jax.nn.dot_product_attention`. Masks follow `attn/masks.py`: key j is
visible to query i when j < key_lengths[b], i < query_lengths[b] and, if causal, j <= i (top-left
aligned, also when Tq != Tk). A query row with no visible key (key length 0, a padded query row,
or a causal row with no key) returns an all-zero output row and log-sum-exp -inf, and passes zero,
finite gradients — never NaN, never the uniform average. Scores, softmax and accumulation are
float32 whatever the input dtype; the output has the input dtype.

GPU lowering: Triton (`jax.experimental.pallas.triton`), chosen knowingly over Mosaic GPU.
- The kernel body below is plain Pallas (BlockSpecs, `fori_loop`, `dot_general`), so the same code
  runs in CPU interpret mode, which is what our CI tests; a Mosaic GPU kernel is a different
  program (warpgroups, TMA copies, barriers, explicit pipelining) that CPU interpret mode would
  not cover the same way.
- Triton runs on Ampere to Hopper with its tiles fitted to the GPU's shared memory
  (`kernels/targets/smem.py`: the host's GPU class, or ATTN_TRITON_SMEM=ampere|sm86|hopper);
  Mosaic GPU targets Hopper+. float32 dots are IEEE float32 (precision HIGHEST; Triton's
  default would be TF32), on CUDA cores: bfloat16/float16 is the fast path.
- The cost: JAX deprecated the Pallas Triton lowering in 0.11 (still present in 0.11.2, our GPU
  pin), and Triton-from-Pallas leaves Hopper's wgmma/TMA speed on the table. The road to the
  Hopper target is a Mosaic GPU forward behind the same `implementation="pallas"` name, validated
  on a GPU against this kernel. That forward exists (`kernels/flash_attention_mgpu.py`, TMA +
  WGMMA), chosen with target="mosaic_gpu" (or "mosaic_gpu_ws", FlashAttention-3's
  warp-specialized schedule; "auto" keeps Triton until they have run on a Hopper GPU); their
  residuals feed the same Triton backward.
The GPU launch indexes the [B, T, H, d] arrays as given (blocks (None, rows, None, d)): no
transpose around the pallas_calls, and padding only for lengths off the tiles or widths that are
not powers of two >= 16.
TPU lowering: Mosaic TPU, with its own launch (`kernels/targets/tpu.py`). The kernels see head-major
[B, H, T, d] operands (transposed by XLA around the pallas_call), so every block's last two dims
are (rows, d), with rows a multiple of 8 and d the whole (padded) head dim; row statistics are
[B, H, T, 1] columns and lengths [B, 1, 128] rows (see `kernels/_common.py`). Where the GPU
bodies loop over the other sequence held whole in on-chip memory (which at T = 16k outgrows
v5e's 16 MiB of scoped VMEM), the TPU bodies take one tile per step of an innermost "arbitrary"
grid axis and accumulate in VMEM scratch; causal steps above the diagonal neither compute nor
fetch. Both launches share the per-tile math (`_fwd_tile`, `_grad_tile`). The TPU launch lowers
and compiles from a CPU host (tests/test_kernels_tpu.py) and runs on JAX's TPU interpreter
(`interpret=pltpu.InterpretParams()`); none has run on a TPU yet, so "auto" keeps TPU on the
blocked path.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kernels import _common, _grid_steps, _loop_steps, _skeleton, launch
from kernels._common import BlockSizes, positions
from kernels.launch import LENGTHS, OTHER, ROW
from kernels.targets import AUTO

_F32 = jnp.float32


# ----------------------------------------------------------------------------------------------
# Tiles: one [bq, bk] step of each kernel, shared by the GPU bodies (a loop over the other
# sequence) and the TPU bodies (one step of the grid's reduction axis). pos: the tile's (q_pos
# [bq], k_pos [bk]) for a masked tile, None for a whole one (every row sees every key: tiles left
# of the causal diagonal, below both lengths), which skips the mask and its `where`s
# (FlashAttention-3's split, as in kernels/flash_attention_mgpu.py).


def _valid(pos, lengths, causal):
  return None if pos is None else _common.valid_mask(*pos, *lengths, causal)


def _fwd_tile(carry, q, k, v, pos, lengths, *, scale, causal):
  """Folds key tile k [bk, d], v [bk, dv] into the online softmax of q [bq, d]."""
  s = _common.dot_nt(q, k) * scale  # [bq, bk] f32
  # Algorithm 1, lines 8-10.
  return _common.online_softmax_update(carry, s, _valid(pos, lengths, causal), v)


def _grad_tile(q, k, v, do, lse, delta, pos, lengths, *, scale, causal):
  """(P, dS) of one tile (Algorithm 2): q, do [bq, ·], k, v [bk, ·], lse, delta [bq]."""
  return _common.softmax_grad_tile(_common.dot_nt(q, k) * scale, _valid(pos, lengths, causal),
                                   lse, do, v, delta)


def _tile_positions(i, block_q, j, block_k, masked):
  return (positions(i, block_q), positions(j, block_k)) if masked else None


# ----------------------------------------------------------------------------------------------
# GPU kernel bodies (grid (row block, b, h)). Refs: q/k/v blocks are 2-D [rows, d] (batch and
# head squeezed out); lse / delta are [rows, 1] columns; lengths are [1, 128] rows of repeated
# values, read at [0, 0]. Output refs come last (aliased poison inputs, if any, sit between the
# inputs and the outputs, never read). Each loop over the other sequence runs as consecutive
# fori_loops over masked and whole ranges of blocks (`kernels/_loop_steps.py`).


def _fwd_kernel(q_ref, k_ref, v_ref, kl_ref, ql_ref, *refs, scale, causal, block_k):
  o_ref, lse_ref = refs[-2:]
  block_q = q_ref.shape[0]
  i = pl.program_id(0)
  lengths = kl_ref[0, 0], ql_ref[0, 0]
  q = q_ref[...]  # [bq, d], stays on chip for the whole loop

  def body(j, carry, masked):
    keys = pl.ds(j * block_k, block_k)
    return _fwd_tile(carry, q, k_ref[keys, :], v_ref[keys, :],
                     _tile_positions(i, block_q, j, block_k, masked), lengths, scale=scale,
                     causal=causal)

  carry = _loop_steps.split_loops(
      body, _common.online_softmax_init(block_q, v_ref.shape[-1]),
      *_loop_steps.key_ranges(i, block_q, block_k, lengths, causal))
  out, lse = _common.finish_softmax(*carry)
  o_ref[...] = out.astype(o_ref.dtype)
  lse_ref[...] = lse[:, None]


def _dq_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, kl_ref, ql_ref, *refs, scale,
               causal, block_k):
  dq_ref = refs[-1]
  block_q = q_ref.shape[0]
  i = pl.program_id(0)
  lengths = kl_ref[0, 0], ql_ref[0, 0]
  q, do = q_ref[...], do_ref[...]  # [bq, d], [bq, dv]
  lse, delta = lse_ref[:, 0], delta_ref[:, 0]  # [bq]

  def body(j, dq, masked):
    keys = pl.ds(j * block_k, block_k)
    k = k_ref[keys, :]
    _, ds = _grad_tile(q, k, v_ref[keys, :], do, lse, delta,
                       _tile_positions(i, block_q, j, block_k, masked), lengths, scale=scale,
                       causal=causal)
    return dq + _common.dot(ds.astype(k.dtype), k)  # dQ += dS K (times scale, below)

  dq = _loop_steps.split_loops(body, jnp.zeros(q.shape, _F32),
                               *_loop_steps.key_ranges(i, block_q, block_k, lengths, causal))
  dq_ref[...] = (dq * scale).astype(dq_ref.dtype)


def _dkdv_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, kl_ref, ql_ref, *refs, scale,
                 causal, block_q):
  dk_ref, dv_ref = refs[-2:]
  block_k = k_ref.shape[0]
  j = pl.program_id(0)
  lengths = kl_ref[0, 0], ql_ref[0, 0]
  k, v = k_ref[...], v_ref[...]  # [bk, d], [bk, dv]

  def body(i, carry, masked):
    dk, dv = carry
    rows = pl.ds(i * block_q, block_q)
    q, do = q_ref[rows, :], do_ref[rows, :]
    p, ds = _grad_tile(q, k, v, do, lse_ref[rows, 0], delta_ref[rows, 0],
                       _tile_positions(i, block_q, j, block_k, masked), lengths, scale=scale,
                       causal=causal)  # [bq, bk]
    dv = dv + _common.dot_tn(p.astype(do.dtype), do)  # dV += P^T dO
    dk = dk + _common.dot_tn(ds.astype(q.dtype), q)  # dK += dS^T Q (times scale, below)
    return dk, dv

  dk, dv = _loop_steps.split_loops(
      body, (jnp.zeros(k.shape, _F32), jnp.zeros(v.shape, _F32)),
      *_loop_steps.query_ranges(j, block_q, block_k, lengths, causal))
  dk_ref[...] = (dk * scale).astype(dk_ref.dtype)
  dv_ref[...] = dv.astype(dv_ref.dtype)


# ----------------------------------------------------------------------------------------------
# TPU kernel bodies (grid (b, h, r, c), see kernels/_grid_steps.py): one [bq, bk] tile per step,
# the reduction over c accumulating in VMEM scratch refs (after the outputs), zeroed at c = 0 and
# written out at the last c. Steps that masking leaves empty compute nothing (`pl.when`); whole
# tiles take the unmasked branch, the visible rest the masked one (`_grid_steps.by_mask`).


def _fwd_tpu_kernel(q_ref, k_ref, v_ref, kl_ref, ql_ref, *refs, scale, causal):
  block_q, block_k = q_ref.shape[0], k_ref.shape[0]
  i, j = pl.program_id(2), pl.program_id(3)
  lengths = kl_ref[0, 0], ql_ref[0, 0]

  def update(carry, masked):
    return _fwd_tile(carry, q_ref[...], k_ref[...], v_ref[...],
                     _tile_positions(i, block_q, j, block_k, masked), lengths, scale=scale,
                     causal=causal)

  # The online-softmax state is a value here (read from and stored to scratch around `update`),
  # so the whole/masked choice is a `lax.cond` with results: `pl.when` is one without.
  whole = j < _common.whole_key_blocks(i, block_q, block_k, *lengths, causal)
  _grid_steps.online_softmax_steps(
      *refs[-5:], visible=j < _common.num_key_blocks(i, block_q, block_k, *lengths, causal),
      update=lambda carry: lax.cond(whole, functools.partial(update, masked=False),
                                    functools.partial(update, masked=True), carry))


def _dq_tpu_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, kl_ref, ql_ref, *refs, scale,
                   causal):
  dq_ref, acc_ref = refs[-2:]
  block_q, block_k = q_ref.shape[0], k_ref.shape[0]
  i, j = pl.program_id(2), pl.program_id(3)
  lengths = kl_ref[0, 0], ql_ref[0, 0]

  def accumulate(masked):
    k = k_ref[...]
    _, ds = _grad_tile(q_ref[...], k, v_ref[...], do_ref[...], lse_ref[:, 0], delta_ref[:, 0],
                       _tile_positions(i, block_q, j, block_k, masked), lengths, scale=scale,
                       causal=causal)
    acc_ref[...] += _common.dot(ds.astype(k.dtype), k)  # dQ += dS K (times scale, below)

  def write():
    dq_ref[...] = (acc_ref[...] * scale).astype(dq_ref.dtype)

  whole = j < _common.whole_key_blocks(i, block_q, block_k, *lengths, causal)
  _grid_steps.reduce_steps(
      [acc_ref], visible=j < _common.num_key_blocks(i, block_q, block_k, *lengths, causal),
      accumulate=_grid_steps.by_mask(whole, accumulate), write=write)


def _dkdv_tpu_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, kl_ref, ql_ref, *refs,
                     scale, causal):
  dk_ref, dv_ref, dk_acc, dv_acc = refs[-4:]
  block_q, block_k = q_ref.shape[0], k_ref.shape[0]
  j, i = pl.program_id(2), pl.program_id(3)  # key block written, query block read
  lengths = kl_ref[0, 0], ql_ref[0, 0]

  def accumulate(masked):
    q, do = q_ref[...], do_ref[...]
    p, ds = _grad_tile(q, k_ref[...], v_ref[...], do, lse_ref[:, 0], delta_ref[:, 0],
                       _tile_positions(i, block_q, j, block_k, masked), lengths, scale=scale,
                       causal=causal)  # [bq, bk]
    dv_acc[...] += _common.dot_tn(p.astype(do.dtype), do)  # dV += P^T dO
    dk_acc[...] += _common.dot_tn(ds.astype(q.dtype), q)  # dK += dS^T Q (times scale, below)

  def write():
    dk_ref[...] = (dk_acc[...] * scale).astype(dk_ref.dtype)
    dv_ref[...] = dv_acc[...].astype(dv_ref.dtype)

  lo, hi = _common.query_block_range(j, block_q, block_k, *lengths, causal)
  wlo, whi = _common.whole_query_blocks(j, block_q, block_k, *lengths, causal)  # within [lo, hi)
  whole = (wlo <= i) & (i < whi)
  _grid_steps.reduce_steps([dk_acc, dv_acc], visible=(lo <= i) & (i < hi),
                           accumulate=_grid_steps.by_mask(whole, accumulate), write=write)


# ----------------------------------------------------------------------------------------------
# The pallas_calls, described for the target's launch (`kernels/launch.py`: roles, not BlockSpecs).
# Operands arrive in the launch's layout (`cfg.layout`), padded where needed by
# `_skeleton.pallas_padded` (T to block multiples, d to powers of two >= 16); theta is None
# (the score has no parameters).


def _forward(q, k, v, theta, kl, ql, cfg: _skeleton.Config):
  del theta
  B, H, Tq, d = cfg.layout.dims(q)
  Tk, dv = cfg.layout.dims(k)[2], v.shape[-1]
  bq, bk = cfg.blocks.block_q, cfg.blocks.block_k
  kw = dict(causal=cfg.causal, **dict(cfg.score_kw))
  flops = 4 * B * H * Tq * Tk * d // (2 if cfg.causal else 1)
  nbytes = sum(x.size * x.dtype.itemsize for x in (q, k, v)) * 2
  call = launch.Call(
      "flash_attention_fwd", writes="q", block_q=bq, block_k=bk, causal=cfg.causal,
      inputs=(ROW, OTHER, OTHER, LENGTHS, LENGTHS), outputs=(ROW, ROW),
      out_shapes=_common.forward_outputs(q, v),
      loop_body=lambda br: functools.partial(_fwd_kernel, block_k=br, **kw),
      grid_body=functools.partial(_fwd_tpu_kernel, **kw), head_dim=d,
      grid_scratch=((bq, _common.LANES), (bq, _common.LANES), (bq, dv)),
      cost_estimate=pl.CostEstimate(flops=flops, transcendentals=B * H * Tq * Tk,
                                    bytes_accessed=nbytes))
  out, lse = cfg.target.launch(
      call, (q, k, v, _common.length_rows(kl), _common.length_rows(ql)), cfg)
  return out, lse[..., 0]


def _backward(q, k, v, theta, do, lse, delta, kl, ql, cfg: _skeleton.Config):
  d, dv = q.shape[-1], v.shape[-1]
  bq, bk = cfg.blocks.bwd_q, cfg.blocks.bwd_k
  kw = dict(causal=cfg.causal, **dict(cfg.score_kw))
  inputs = (q, k, v, do, lse[..., None], delta[..., None], _common.length_rows(kl),
            _common.length_rows(ql))
  (dq,) = cfg.target.launch(launch.Call(
      "flash_attention_dq", writes="q", block_q=bq, block_k=bk, causal=cfg.causal,
      inputs=(ROW, OTHER, OTHER, ROW, ROW, ROW, LENGTHS, LENGTHS), outputs=(ROW,),
      out_shapes=(jax.ShapeDtypeStruct(q.shape, q.dtype),),
      loop_body=lambda br: functools.partial(_dq_kernel, block_k=br, **kw),
      grid_body=functools.partial(_dq_tpu_kernel, **kw), head_dim=d,
      grid_scratch=((bq, d),)), inputs, cfg)
  dk, dv_ = cfg.target.launch(launch.Call(
      "flash_attention_dkdv", writes="k", block_q=bq, block_k=bk, causal=cfg.causal,
      inputs=(OTHER, ROW, ROW, OTHER, OTHER, OTHER, LENGTHS, LENGTHS), outputs=(ROW, ROW),
      out_shapes=(jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)),
      loop_body=lambda br: functools.partial(_dkdv_kernel, block_q=br, **kw),
      grid_body=functools.partial(_dkdv_tpu_kernel, **kw), head_dim=d,
      grid_scratch=((bk, d), (bk, dv))), inputs, cfg)
  return dq, dk, dv_, theta


def _dot_score(theta, q_blk, k_blk, *, scale):
  """scale · q_blk k_blkᵀ: [tq, d] x [tk, d] -> [tq, tk] float32 (blocked and naive paths)."""
  del theta
  return _common.dot_nt(q_blk, k_blk) * scale


def _check_inputs(q, k, v, theta):
  del theta
  for name, x in (("q", q), ("k", k), ("v", v)):
    if x.ndim != 4:
      raise ValueError(f"{name} must be [B, T, H, d], got shape {x.shape}")
    _common.check_dtype(name, x)
  if not q.dtype == k.dtype == v.dtype:
    raise ValueError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
  if not (q.shape[0] == k.shape[0] == v.shape[0] and q.shape[2] == k.shape[2] == v.shape[2]):
    raise ValueError(f"q, k and v disagree on batch or heads [B, T, H, d]: q {q.shape}, "
                     f"k {k.shape}, v {v.shape}")
  if k.shape[1] != v.shape[1]:
    raise ValueError(f"k and v disagree on Tk: k {k.shape}, v {v.shape}")
  if q.shape[-1] != k.shape[-1]:
    raise ValueError(f"q and k must have the same head dim, got {q.shape[-1]} and {k.shape[-1]}")
  if q.shape[-1] == 0 or v.shape[-1] == 0 or q.shape[1] == 0 or k.shape[1] == 0:
    raise ValueError(f"empty head dim or sequence: q {q.shape}, k {k.shape}, v {v.shape}")


KERNEL = _skeleton.FusedKernel(
    name="flash_attention", forward=_forward, backward=_backward, score=_dot_score,
    check_inputs=_check_inputs)


# ----------------------------------------------------------------------------------------------
# Public wrappers.


def _scale(q, scale):
  return 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)


@functools.partial(jax.jit, static_argnames=("causal", "scale", "implementation", "block_q",
                                             "block_k", "block_sizes", "interpret", "target"))
def attention_with_lse(q, k, v, *, key_lengths=None, query_lengths=None, causal: bool = False,
                       scale: float | None = None, implementation: str = "auto",
                       block_q: int | None = None, block_k: int | None = None,
                       block_sizes: BlockSizes | None = None, interpret: bool | None = None,
                       target: str = AUTO):
  """Scaled dot-product attention and its log-sum-exp, without forming [Tq, Tk].

  q: [B, Tq, H, d], k: [B, Tk, H, d], v: [B, Tk, H, dv]; float32, bfloat16 or float16, one dtype.
  key_lengths, query_lengths: [B] int or None (all valid); clipped to [0, T].
  causal: query i sees keys j <= i (top-left aligned). scale: Python float, default 1/sqrt(d).
  implementation: "pallas" (Triton on GPU, Mosaic on TPU; interpret mode on CPU), "blocked" (pure
    JAX, exact, O(T·block) memory), "xla" (dense reference), "auto" (pallas on GPU, blocked
    elsewhere; a named target's own implementation).
  target: a registered kernel target (`kernels.targets`: "triton", "mosaic_gpu", "tpu",
    "cpu_blocked", the interpreters "interpret", "tpu_interpret", "mosaic_gpu_interpret") or
    "auto" (the target of the platform lowered for: Triton on CUDA/ROCm, Mosaic TPU on TPU).
    The target supplies the launch and the default tiles. "mosaic_gpu" runs the Mosaic GPU
    forward for Hopper (bfloat16/float16, d <= 256; float32 keeps the Triton forward), backward
    Triton. A target that cannot run the call raises ValueError.
  block_q, block_k: tile sizes (powers of two >= 16), or block_sizes=BlockSizes(...) for the
    backward tiles and Triton launch parameters too. interpret: force Pallas interpret mode
    (True: the target's interpreter; `pltpu.InterpretParams()`: the TPU launch on JAX's TPU
    interpreter); None interprets on a CPU host. False on a platform no target compiles for (a
    CPU) raises ValueError when the call is lowered for it.
  Returns (out [B, Tq, H, dv] in the input dtype, lse [B, Tq, H] float32). A query row with no
  visible key gets out = 0 and lse = -inf, and zero gradients; no examples or no heads (B or H
  of 0) give the empty result. Differentiable (custom_vjp).
  """
  kl, ql = _skeleton.check(KERNEL, q, k, v, None, key_lengths, query_lengths)
  return _skeleton.dispatch(KERNEL, q, k, v, None, kl, ql, causal=causal,
                            implementation=implementation, block_q=block_q, block_k=block_k,
                            block_sizes=block_sizes, interpret=interpret, target=target,
                            scale=_scale(q, scale))


def attention(q, k, v, *, key_lengths=None, query_lengths=None, causal: bool = False,
              scale: float | None = None, implementation: str = "auto", block_q: int | None = None,
              block_k: int | None = None, block_sizes: BlockSizes | None = None,
              interpret: bool | None = None, target: str = AUTO):
  """Scaled dot-product attention: out [B, Tq, H, dv]. See `attention_with_lse` for arguments.

  A query row with no visible key returns zeros (value and gradient), never NaN.
  """
  return attention_with_lse(q, k, v, key_lengths=key_lengths, query_lengths=query_lengths,
                            causal=causal, scale=scale, implementation=implementation,
                            block_q=block_q, block_k=block_k, block_sizes=block_sizes,
                            interpret=interpret, target=target)[0]


def pallas_attention_padded(q, k, v, *, key_lengths=None, query_lengths=None, causal: bool = False,
                            scale: float | None = None, block_sizes: BlockSizes | None = None,
                            interpret: bool | None = None, poison: bool = False,
                            target: str = AUTO):
  """The Pallas kernels on padded shapes, for tests and benchmarks (not jitted; differentiable).

  Arguments as in `attention_with_lse` (target "auto" compiled: the host's platform's target);
  block_sizes default to the target's tiles. poison=True starts every output buffer of the
  forward and backward kernels as NaN, so an element a kernel fails to write shows as NaN (the
  Mosaic GPU forward of target="mosaic_gpu" writes whole tiles and takes no poison).
  Returns the padded (out [B, Tq_p, H, dv_p] in the input dtype, lse [B, H, Tq_p] float32):
  Tq_p a multiple of the query tiles, dv_p a power of two >= 16.
  """
  kl, ql = _skeleton.check(KERNEL, q, k, v, None, key_lengths, query_lengths)
  return _skeleton.pallas_padded(KERNEL, q, k, v, None, kl, ql, causal=causal, blocks=block_sizes,
                                 target=target, interpret=interpret, poison=poison,
                                 scale=_scale(q, scale))


# ----------------------------------------------------------------------------------------------
# Reference.


def attention_reference(q, k, v, *, key_lengths=None, query_lengths=None, causal: bool = False,
                        scale: float | None = None):
  """The dense reference, same semantics as `attention` (materializes [B, H, Tq, Tk] scores)."""
  return attention(q, k, v, key_lengths=key_lengths, query_lengths=query_lengths, causal=causal,
                   scale=scale, implementation="xla")
