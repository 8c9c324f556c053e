"""Pieces shared by the fused attention kernels: block sizes, masks, the online softmax, Pallas
helpers (dots, loop bounds, the lengths operand), and the two non-Pallas implementations every
kernel also offers. `kernels/_skeleton.py` wires them into the custom_vjp, padding and dispatch
that every kernel runs through; launches, grids and BlockSpecs are the targets'
(`kernels/targets/`).

- `blocked_attention`: the exact, memory-efficient pure-JAX path for CPU. A `lax.map` over query
  blocks of a `lax.scan` over key blocks with the online softmax (FlashAttention-2, Dao 2023,
  Algorithm 1), and a hand-written blocked backward under `jax.custom_vjp` that recomputes the
  probabilities of each tile from the saved log-sum-exp. Memory is O(T·d + block_q·block_k·c),
  where c is what one score tile needs (1 for dot products, d_attn for additive scores).
- `naive_attention`: the dense reference (the "xla" implementation), differentiated by autodiff.

Both take a per-head *score function* `score_fn(theta, q_blk, k_blk) -> [tq, tk] float32`, so the
dot-product and additive kernels share them. Layout inside this module is head-major,
q: [B, H, Tq, dq], k: [B, H, Tk, dk], v: [B, H, Tk, dv]; the public wrappers transpose from the
`[B, T, H, d]` layout of `jax.nn.dot_product_attention`.

Masking conventions are those of `attn/masks.py`: a key j is valid for query i when
j < key_length, i < query_length and, if causal, j <= i (top-left aligned, also when Tq != Tk).
A query row with no valid key gets an all-zero output row, log-sum-exp -inf, and zero gradients.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

_F32 = jnp.float32
# Finite stand-in for -inf inside the online softmax: exp(MASK_VALUE - m) underflows to 0 while
# MASK_VALUE - MASK_VALUE stays 0, so a row that has seen no valid key yet never produces NaN.
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)
SUPPORTED_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
MIN_BLOCK = 16  # Triton's dot needs M, N, K >= 16; Pallas Triton needs power-of-two shapes.
MAX_HEAD_DIM = 256  # a [block, d] tile of q, k and v must fit the GPU's shared memory
# The shared memory one thread block may use (CUDA's opt-in maximum per block), by GPU class:
# class -> (bytes per thread block, the compute capabilities of the class).
SMEM_BUDGETS = {
    "hopper": (232_448, ("9.0",)),  # 227 KiB: H100, H200
    "ampere": (166_912, ("8.0", "8.7")),  # 163 KiB: A100, A30 (sm80), Jetson Orin (sm87)
    "sm86": (101_376, ("8.6", "8.9")),  # 99 KiB: A10, A40, RTX 30xx (sm86); L4, L40 (sm89)
}


def _is_pow2(n: int) -> bool:
  return n > 0 and (n & (n - 1)) == 0


def next_pow2(n: int) -> int:
  return 1 << max(0, int(n) - 1).bit_length()


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  """Tile sizes of the kernels. Powers of two, at least 16 (block_d: at least 1).

  block_q, block_k: forward tile ([block_q, block_k] scores in on-chip memory).
  block_q_bwd, block_k_bwd: tiles of the dq and dk/dv backward kernels (default: the forward ones).
  block_d: additive kernels only, the slice of d_attn whose tanh tile [block_q, block_k, block_d]
    is formed at once (default: chosen by the kernel).
  num_warps, num_stages: Triton launch parameters (None: a heuristic on the head dim).
  The blocked CPU path uses block_q / block_k as its query chunk and key step.
  """
  block_q: int = 128
  block_k: int = 64
  block_q_bwd: int | None = None
  block_k_bwd: int | None = None
  block_d: int | None = None
  num_warps: int | None = None
  num_stages: int = 2

  def __post_init__(self):
    for name in ("block_q", "block_k", "block_q_bwd", "block_k_bwd"):
      value = getattr(self, name)
      if value is None and name.endswith("_bwd"):
        continue
      if not isinstance(value, (int, np.integer)) or not _is_pow2(value) or value < MIN_BLOCK:
        raise ValueError(f"BlockSizes.{name} must be a power of two >= {MIN_BLOCK}, got {value!r}")
    if self.block_d is not None and (not isinstance(self.block_d, (int, np.integer))
                                     or not _is_pow2(self.block_d)):
      raise ValueError(f"BlockSizes.block_d must be a power of two, got {self.block_d!r}")
    if self.num_warps is not None and not _is_pow2(self.num_warps):
      raise ValueError(f"BlockSizes.num_warps must be a power of two, got {self.num_warps!r}")
    if self.num_stages < 1:
      raise ValueError(f"BlockSizes.num_stages must be >= 1, got {self.num_stages!r}")

  @property
  def bwd_q(self) -> int:
    return self.block_q_bwd or self.block_q

  @property
  def bwd_k(self) -> int:
    return self.block_k_bwd or self.block_k

  def clamp(self, Tq: int, Tk: int) -> BlockSizes:
    """Shrinks blocks that exceed the (power-of-two rounded) sequence lengths."""
    cq, ck = max(MIN_BLOCK, next_pow2(Tq)), max(MIN_BLOCK, next_pow2(Tk))
    return dataclasses.replace(self, block_q=min(self.block_q, cq), block_k=min(self.block_k, ck),
                               block_q_bwd=min(self.bwd_q, cq), block_k_bwd=min(self.bwd_k, ck))


def check_dtype(name: str, x) -> None:
  if jnp.dtype(x.dtype) not in SUPPORTED_DTYPES:
    raise ValueError(f"{name} must be float32, bfloat16 or float16, got {x.dtype}")


def pad_axis(x, axis: int, size: int):
  """Zero-pads axis `axis` of x up to `size`."""
  if x.shape[axis] == size:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, size - x.shape[axis])
  return jnp.pad(x, widths)


def positions(block_index, block: int):
  """[block] int32 sequence positions of tile `block_index` (int32 also under jax_enable_x64)."""
  return block_index * block + jnp.arange(block, dtype=jnp.int32)


def valid_mask(q_pos, k_pos, key_length, query_length, causal: bool):
  """[tq, tk] bool: key j is visible to query i (see the module docstring)."""
  valid = (k_pos[None, :] < key_length) & (q_pos[:, None] < query_length)
  if causal:
    valid &= k_pos[None, :] <= q_pos[:, None]
  return valid


# ----------------------------------------------------------------------------------------------
# The online softmax (FlashAttention-2, Dao 2023): one home for the Pallas kernels and the blocked
# path. Shapes per (batch, head) tile: m, l [tq]; acc [tq, dv]; scores s [tq, tk]; all float32.


def online_softmax_init(block_q: int, dv: int):
  """(m, l, acc) before the first key block: m = MASK_VALUE (finite, see above), l = acc = 0."""
  return (jnp.full((block_q,), MASK_VALUE, _F32), jnp.zeros((block_q,), _F32),
          jnp.zeros((block_q, dv), _F32))


def online_softmax_update(carry, s, valid, v):
  """Folds one key block into (m, l, acc): Algorithm 1, lines 8-10.

  s: [tq, tk] float32 scores (masked entries may hold anything); valid: [tq, tk] bool, or None
  when every entry is visible (a whole tile: no mask, no `where`);
  v: [tk, dv] values (P is cast to their dtype for the dot; it accumulates in float32).
  Masked entries get p = 0 exactly, so a row that has seen no valid key keeps l = 0.
  """
  m_prev, l_prev, acc_prev = carry
  if valid is not None:
    s = jnp.where(valid, s, MASK_VALUE)
  m_new = jnp.maximum(m_prev, jnp.max(s, axis=-1))  # running max m_i
  alpha = jnp.exp(m_prev - m_new)  # rescales what was summed under the old max
  p = jnp.exp(s - m_new[:, None])
  if valid is not None:
    p = jnp.where(valid, p, 0.0)
  l_new = alpha * l_prev + jnp.sum(p, axis=-1)
  acc_new = alpha[:, None] * acc_prev + dot(p.astype(v.dtype), v)
  return m_new, l_new, acc_new


def finish_softmax(m, l, acc):
  """Online-softmax state -> (out = acc / l, lse = m + log l) (Algorithm 1, lines 12-13); empty
  rows -> (0, -inf)."""
  nonempty = l > 0
  l_safe = jnp.where(nonempty, l, 1.0)
  out = acc / l_safe[..., None]
  lse = jnp.where(nonempty, m + jnp.log(l_safe), -jnp.inf)
  return out, lse


# ----------------------------------------------------------------------------------------------
# Pallas helpers shared by the kernels.


# The kernels' dots accumulate in float32. Their operands' precision: float32 operands ask for
# HIGHEST, because the default rounds them to TF32 (10 mantissa bits) on NVIDIA GPUs: Pallas'
# Triton lowering emits `tt.dot ... inputPrecision = tf32` for DEFAULT and `ieee` for HIGHEST,
# and XLA's GPU dots (the blocked path on a GPU) do the same. Triton runs IEEE dots on CUDA
# cores, not tensor cores: float32 is the exact path, 16-bit inputs the fast one. 16-bit operands
# keep the default: their products are exact in the float32 accumulator, and HIGHEST would only
# change the IR. On CPU (interpret mode, the blocked path) both give the same bits.


def dot_precision(a, b):
  """The `precision` of a kernel dot on operands a, b: HIGHEST for float32, else None."""
  return lax.Precision.HIGHEST if _F32 in (a.dtype, b.dtype) else None


def _dot(a, b, contract):
  return lax.dot_general(a, b, (contract, ((), ())), precision=dot_precision(a, b),
                         preferred_element_type=_F32)


def dot(a, b):  # [m, k] @ [k, n]
  return _dot(a, b, ((1,), (0,)))


def dot_nt(a, b):  # [m, k] @ [n, k]^T
  return _dot(a, b, ((1,), (1,)))


def dot_tn(a, b):  # [k, m]^T @ [k, n]
  return _dot(a, b, ((0,), (0,)))


def softmax_grad_tile(s, valid, lse, do, v, delta):
  """Algorithm 2: P recomputed from the saved lse, and dS = P ∘ (dP − δ) with dP = dO Vᵀ.

  s: [tq, tk] float32 scores; valid: [tq, tk], or None when every entry is visible (then no row
  is empty); lse, delta: [tq]; do: [tq, dv]; v: [tk, dv].
  Returns (p, ds), both [tq, tk] float32; lse = -inf only on empty rows, where p = 0.
  """
  p = jnp.exp(s - lse[:, None])
  if valid is not None:
    p = jnp.where(valid, p, 0.0)
  return p, p * (dot_nt(do, v) - delta[:, None])


# Loop bounds of the kernels. The block sizes are Python ints: cast them to the int32 of program
# ids and lengths, or `lax.div` sees int32 / int64 under jax_enable_x64 and refuses.


def num_key_blocks(i, block_q, block_k, key_length, query_length, causal):
  """Key blocks that query block i visits (none when all its rows are padding)."""
  hi = key_length
  if causal:
    hi = jnp.minimum(hi, (i + 1) * block_q)
  hi = jnp.where(i * block_q < query_length, hi, 0)
  return pl.cdiv(hi, np.int32(block_k))


def query_block_range(j, block_q, block_k, key_length, query_length, causal):
  """(lo, hi): query blocks that can see key block j. Causal rows start at the block's first key;
  none when the whole key block lies past the key length."""
  lo = lax.div(j * block_k, np.int32(block_q)) if causal else np.int32(0)
  hi = jnp.where(j * block_k < key_length, pl.cdiv(query_length, np.int32(block_q)), lo)
  return lo, hi


# Tiles visible whole (every query row sees every key of the tile) need neither the mask nor its
# `where`s: FlashAttention-3 splits each loop into these and the masked rest. The masked
# remainder is the diagonal band under causal masking and the last tiles of a length.


def whole_key_blocks(i, block_q, block_k, key_length, query_length, causal):
  """How many key blocks from the first query block i sees whole: below the key length, left of
  (or on) its first row's causal diagonal, and none of its rows padding (else 0). The first
  `whole_key_blocks` of `num_key_blocks` need no mask."""
  q0 = i * np.int32(block_q)
  whole = lax.div(key_length, np.int32(block_k))
  if causal:  # key block j is left of row q0's diagonal when (j + 1) * block_k - 1 <= q0
    whole = jnp.minimum(whole, lax.div(q0 + 1, np.int32(block_k)))
  return jnp.where(q0 + block_q <= query_length, whole, 0)


def whole_query_blocks(j, block_q, block_k, key_length, query_length, causal):
  """(lo, hi): the query blocks that see key block j whole (empty when hi <= lo): the block lies
  below the key length, every row of the query block is at or past its last key (causal) and
  below the query length. Within `query_block_range`, the blocks outside [lo, hi) need the mask."""
  k_end = (j + 1) * np.int32(block_k)
  lo = pl.cdiv(k_end - 1, np.int32(block_q)) if causal else np.int32(0)
  hi = jnp.where(k_end <= key_length, lax.div(query_length, np.int32(block_q)), lo)
  return lo, jnp.maximum(hi, lo)


# Lengths travel as [B, 1, LANES] int32 rows (`length_rows`), read as `ref[0, 0]`: a (1, LANES)
# block is Mosaic-TPU-legal (a (1,) block of [B] is not); Triton and interpret read it the same.
# Row statistics (lse, delta) travel as [B, H, T, 1] columns: a (block, 1) block is Mosaic-legal
# for blocks that are multiples of 8 (a (block,) slice of [B, H, T] needs 128), rows-oriented.
LANES = 128


def length_rows(lengths):
  """[B] int32 -> [B, 1, LANES] int32 (each length repeated), the kernels' lengths operand."""
  return jnp.broadcast_to(lengths[:, None, None], (lengths.shape[0], 1, LANES))


def forward_outputs(q, v):
  """Output shapes of every forward kernel: out [B, H, Tq, dv] in v's dtype and lse
  [B, H, Tq, 1] float32 (q: [B, H, Tq, ·], v: [B, H, Tk, dv], both padded), in q's layout
  (token-major [B, Tq, H, ·] gives [B, Tq, H, dv] and [B, Tq, H, 1])."""
  return (jax.ShapeDtypeStruct((*q.shape[:3], v.shape[-1]), v.dtype),
          jax.ShapeDtypeStruct((*q.shape[:3], 1), _F32))


# ----------------------------------------------------------------------------------------------
# Blocked pure-JAX path.


def _blocked_fwd_single(score_fn, causal, bq, bk, q, k, v, theta, kl, ql):
  """One (batch, head): q [Tq_p, dq], k [Tk_p, dk], v [Tk_p, dv] -> (out [Tq_p, dv], lse [Tq_p])."""
  nq, nk = q.shape[0] // bq, k.shape[0] // bk
  kb = k.reshape(nk, bk, k.shape[-1])
  vb = v.reshape(nk, bk, v.shape[-1]).astype(_F32)

  def one_query_block(args):
    i, q_blk = args
    q_pos = positions(i, bq)

    def step(carry, xs):
      j, k_blk, v_blk = xs
      s = score_fn(theta, q_blk, k_blk)  # [bq, bk] f32
      valid = valid_mask(q_pos, positions(j, bk), kl, ql, causal)
      return online_softmax_update(carry, s, valid, v_blk), None

    (m, l, acc), _ = lax.scan(step, online_softmax_init(bq, v.shape[-1]), (jnp.arange(nk), kb, vb))
    return finish_softmax(m, l, acc)

  out, lse = lax.map(one_query_block, (jnp.arange(nq), q.reshape(nq, bq, q.shape[-1])))
  return out.reshape(nq * bq, v.shape[-1]), lse.reshape(nq * bq)


def _blocked_bwd_single(score_fn, causal, bq, bk, q, k, v, theta, kl, ql, out, lse, do, g_lse):
  """Gradients for one (batch, head), recomputing each [bq, bk] tile from lse.

  dS = P ∘ (dP − δ), δ_i = Σ_d dO_id O_id − ∂L/∂lse_i (FlashAttention-2, Algorithm 2); the tile's
  score function is differentiated locally with `jax.vjp`, so any score works.
  """
  nq, nk = q.shape[0] // bq, k.shape[0] // bk
  q32, k32 = q.astype(_F32), k.astype(_F32)  # accumulate the tile vjps in float32
  theta32 = jax.tree.map(lambda t: t.astype(_F32), theta)
  do = do.astype(_F32)
  delta = jnp.sum(do * out.astype(_F32), axis=-1) - g_lse  # [Tq_p]
  qb = q32.reshape(nq, bq, -1)
  dob = do.reshape(nq, bq, -1)
  lseb, deltab = lse.reshape(nq, bq), delta.reshape(nq, bq)

  def key_step(carry, xs):
    dq_acc, dtheta_acc = carry
    j, k_blk, v_blk = xs
    k_pos = positions(j, bk)

    def query_step(inner, ys):
      dk_blk, dv_blk, dtheta = inner
      i, q_blk, do_blk, lse_blk, delta_blk = ys
      s, vjp = jax.vjp(lambda qq, kk, th: score_fn(th, qq, kk), q_blk, k_blk, theta32)
      valid = valid_mask(positions(i, bq), k_pos, kl, ql, causal)
      p, ds = softmax_grad_tile(s, valid, lse_blk, do_blk, v_blk, delta_blk)
      dv_blk = dv_blk + dot_tn(p, do_blk)
      dq_blk, dk_part, dth = vjp(ds)
      dtheta = jax.tree.map(jnp.add, dtheta, dth)
      return (dk_blk + dk_part, dv_blk, dtheta), dq_blk

    init = (jnp.zeros_like(k_blk), jnp.zeros((bk, v.shape[-1]), _F32), dtheta_acc)
    (dk_blk, dv_blk, dtheta_acc), dq_parts = lax.scan(
        query_step, init, (jnp.arange(nq), qb, dob, lseb, deltab))
    return (dq_acc + dq_parts, dtheta_acc), (dk_blk, dv_blk)

  init = (jnp.zeros_like(qb), jax.tree.map(jnp.zeros_like, theta32))
  (dq, dtheta), (dk, dv) = lax.scan(
      key_step, init,
      (jnp.arange(nk), k32.reshape(nk, bk, -1), v.astype(_F32).reshape(nk, bk, -1)))
  return dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape), dtheta


def _vmap_bh(fn, theta_axis):
  """vmap a single-(batch, head) function over H then B. theta is per head (axis 0) or None."""
  over_h = jax.vmap(fn, in_axes=(0, 0, 0, theta_axis, None, None))
  return jax.vmap(over_h, in_axes=(0, 0, 0, None, 0, 0))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def _blocked_core(score_fn, causal, bq, bk, q, k, v, theta, kl, ql):
  fn = functools.partial(_blocked_fwd_single, score_fn, causal, bq, bk)
  theta_axis = None if theta is None else 0
  return _vmap_bh(fn, theta_axis)(q, k, v, theta, kl, ql)


def _blocked_core_fwd(score_fn, causal, bq, bk, q, k, v, theta, kl, ql):
  out, lse = _blocked_core(score_fn, causal, bq, bk, q, k, v, theta, kl, ql)
  return (out, lse), (q, k, v, theta, kl, ql, out, lse)


def _blocked_core_bwd(score_fn, causal, bq, bk, res, cts):
  q, k, v, theta, kl, ql, out, lse = res
  g_out, g_lse = cts
  fn = functools.partial(_blocked_bwd_single, score_fn, causal, bq, bk)
  theta_axis = None if theta is None else 0
  over_h = jax.vmap(fn, in_axes=(0, 0, 0, theta_axis, None, None, 0, 0, 0, 0),
                    out_axes=(0, 0, 0, theta_axis))
  # theta is shared across the batch: its per-example gradients come back stacked, summed below.
  over_b = jax.vmap(over_h, in_axes=(0, 0, 0, None, 0, 0, 0, 0, 0, 0), out_axes=0)
  dq, dk, dv, dtheta = over_b(q, k, v, theta, kl, ql, out, lse, g_out, g_lse)
  dtheta = jax.tree.map(lambda g, t: jnp.sum(g, axis=0).astype(t.dtype), dtheta, theta)
  return (dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), dtheta, None, None)


_blocked_core.defvjp(_blocked_core_fwd, _blocked_core_bwd)


def blocked_attention(score_fn: Callable, q, k, v, theta, kl, ql, *, causal: bool, block_q: int,
                      block_k: int):
  """Exact attention in O(T·d + block_q·block_k) memory, differentiable.

  q: [B, H, Tq, dq], k: [B, H, Tk, dk], v: [B, H, Tk, dv]; theta: per-head score parameters with
  a leading H axis, or None; kl, ql: [B] int32 already clipped to [0, Tk], [0, Tq].
  Returns (out [B, H, Tq, dv] float32, lse [B, H, Tq] float32; -inf on rows with no valid key).
  """
  Tq, Tk = q.shape[2], k.shape[2]
  bq, bk = min(block_q, next_pow2(Tq)), min(block_k, next_pow2(Tk))
  Tq_p, Tk_p = pl.cdiv(Tq, bq) * bq, pl.cdiv(Tk, bk) * bk
  qp, kp, vp = pad_axis(q, 2, Tq_p), pad_axis(k, 2, Tk_p), pad_axis(v, 2, Tk_p)
  out, lse = _blocked_core(score_fn, causal, bq, bk, qp, kp, vp, theta, kl, ql)
  return out[:, :, :Tq], lse[:, :, :Tq]


# ----------------------------------------------------------------------------------------------
# Naive dense reference ("xla").


def naive_attention(score_fn: Callable, q, k, v, theta, kl, ql, *, causal: bool):
  """Dense attention: materializes every score (and whatever score_fn forms for them).

  Same arguments and returns as `blocked_attention`. Differentiated by autodiff; NaN-free on
  rows with no valid key (the row max is a stop-gradient shift and the denominator is guarded).
  """
  theta_axis = None if theta is None else 0
  scores = jax.vmap(jax.vmap(score_fn, in_axes=(theta_axis, 0, 0)), in_axes=(None, 0, 0))
  s = scores(theta, q, k)  # [B, H, Tq, Tk] f32
  Tq, Tk = s.shape[-2:]
  valid = jax.vmap(lambda a, b: valid_mask(jnp.arange(Tq), jnp.arange(Tk), a, b, causal))(kl, ql)
  valid = valid[:, None]  # [B, 1, Tq, Tk]
  s = jnp.where(valid, s, MASK_VALUE)
  m = lax.stop_gradient(jnp.max(s, axis=-1))
  p = jnp.where(valid, jnp.exp(s - m[..., None]), 0.0)
  l = jnp.sum(p, axis=-1)
  acc = jnp.einsum("bhqk,bhkd->bhqd", p, v.astype(_F32))
  return finish_softmax(m, l, acc)
