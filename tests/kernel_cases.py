"""Test cases, inputs, float64 NumPy references and tolerances shared by the kernel tests.

Tolerance rule (as in FlashAttention's suites): in a given dtype, an implementation's error
against float64 is at most twice the error of the naive implementation ("xla") in that same
dtype, plus a small floor. The naive implementation itself is held to an absolute table.
Layout `[B, T, H, ·]` as in `kernels`; the references are written from the definitions
(softmax over valid keys; rows without a valid key give 0 and lse -inf), with hand-derived
gradients, so they share no code with the kernels.
"""

from __future__ import annotations

import contextlib
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)
# Floor added to 2x the naive error, relative to max(1, max|reference|).
FLOOR = {jnp.float32: 1e-6, jnp.bfloat16: 2e-3, jnp.float16: 2.5e-4}
# The naive implementation's own error bound (same scale).
NAIVE_TOL = {jnp.float32: 1e-5, jnp.bfloat16: 3e-2, jnp.float16: 4e-3}


@dataclasses.dataclass(frozen=True)
class Case:
  """One test shape. d: the q/k feature dim (head dim, or d_attn for additive attention)."""
  name: str
  B: int
  Tq: int
  Tk: int
  H: int
  d: int
  dv: int
  causal: bool
  key_lengths: tuple | None = None
  query_lengths: tuple | None = None

  def __str__(self):
    return self.name


def ids(cases_and_dtypes):
  """pytest ids "case-dtype" for a list of (Case, dtype)."""
  return [f"{c}-{jnp.dtype(d).name}" for c, d in cases_and_dtypes]


def lengths(case: Case):
  """(key_lengths, query_lengths) as [B] int32 arrays, or None where the case has none."""
  kl = None if case.key_lengths is None else jnp.asarray(case.key_lengths, jnp.int32)
  ql = None if case.query_lengths is None else jnp.asarray(case.query_lengths, jnp.int32)
  return kl, ql


def dot_inputs(case: Case, dtype, seed=0):
  """(q [B, Tq, H, d], k [B, Tk, H, d], v [B, Tk, H, dv], kl, ql) for kernels.attention."""
  rng = np.random.default_rng(seed)
  q = rng.standard_normal((case.B, case.Tq, case.H, case.d))
  k = rng.standard_normal((case.B, case.Tk, case.H, case.d))
  v = rng.standard_normal((case.B, case.Tk, case.H, case.dv))
  return (*(jnp.asarray(x, dtype) for x in (q, k, v)), *lengths(case))


def additive_inputs(case: Case, dtype, seed=0):
  """(q_proj, k_proj, v_vec [H, d], values, kl, ql) for kernels.additive_attention."""
  rng = np.random.default_rng(seed)
  qp = rng.standard_normal((case.B, case.Tq, case.H, case.d))
  kp = rng.standard_normal((case.B, case.Tk, case.H, case.d))
  w = rng.standard_normal((case.H, case.d)) / np.sqrt(case.d) * 3
  val = rng.standard_normal((case.B, case.Tk, case.H, case.dv))
  qp, kp, val = (jnp.asarray(x, dtype) for x in (qp, kp, val))
  w = jnp.asarray(w, jnp.float32)  # parameters stay float32, as in attn.scores.init_additive
  return (qp, kp, w, val, *lengths(case))


def cotangents(case: Case, seed=1):
  """(g_out [B, Tq, H, dv], g_lse [B, Tq, H]) float32: the loss is <out, g_out> + <lse, g_lse>."""
  rng = np.random.default_rng(seed)
  g_out = rng.standard_normal((case.B, case.Tq, case.H, case.dv))
  g_lse = rng.standard_normal((case.B, case.Tq, case.H))
  return jnp.asarray(g_out, jnp.float32), jnp.asarray(g_lse, jnp.float32)


def loss_and_grads(fn, args, g_out, g_lse):
  """Gradients in every argument of <out, g_out> + <lse, g_lse>, fn(*args) -> (out, lse)
  (lse's -inf rows contribute nothing)."""
  def loss(*args):
    out, lse = fn(*args)
    lse = jnp.where(jnp.isfinite(lse), lse, 0.0)
    return jnp.sum(out.astype(jnp.float32) * g_out) + jnp.sum(lse * g_lse)
  return jax.jit(jax.grad(loss, argnums=tuple(range(len(args)))))(*args)


@contextlib.contextmanager
def x64_enabled():
  """jax_enable_x64 on for the block, restored after (Python ints become int64 inside)."""
  previous = bool(jax.config.read("jax_enable_x64"))
  jax.config.update("jax_enable_x64", True)
  try:
    yield
  finally:
    jax.config.update("jax_enable_x64", previous)


# ----------------------------------------------------------------------------------------------
# float64 NumPy references.


def np_softmax(s, kl, ql, causal):
  """Masked softmax of s [B, H, Tq, Tk] float64 -> (p [B, H, Tq, Tk], lse [B, H, Tq]).

  Key j is visible to query i when j < kl[b], i < ql[b] and (causal) j <= i; kl, ql: [B] or None
  (all valid). Rows without a visible key: p = 0, lse = -inf.
  """
  B, _, Tq, Tk = s.shape
  kl = np.full(B, Tk) if kl is None else np.asarray(kl)
  ql = np.full(B, Tq) if ql is None else np.asarray(ql)
  i, j = np.arange(Tq)[:, None], np.arange(Tk)[None, :]
  valid = (j < kl[:, None, None]) & (i < ql[:, None, None])  # [B, Tq, Tk]
  if causal:
    valid = valid & (j <= i)
  valid = valid[:, None]  # [B, 1, Tq, Tk]
  m = np.max(np.where(valid, s, -np.inf), axis=-1, keepdims=True)
  m = np.where(np.isfinite(m), m, 0.0)
  e = np.where(valid, np.exp(s - m), 0.0)
  l = e.sum(-1, keepdims=True)
  with np.errstate(divide="ignore"):
    lse = np.where(l[..., 0] > 0, m[..., 0] + np.log(l[..., 0]), -np.inf)
  return e / np.where(l > 0, l, 1.0), lse


def np_softmax_grad(p, dp, g_lse):
  """dS = P ∘ (dP − rowsum(P ∘ dP)) + P ∘ g_lse; p, dp: [B, H, Tq, Tk], g_lse: [B, Tq, H]."""
  g_lse_h = np.swapaxes(np.asarray(g_lse, np.float64), 1, 2)  # [B, H, Tq]
  return p * (dp - np.sum(p * dp, -1, keepdims=True)) + p * g_lse_h[..., None]


def np_attention(q, k, v, kl, ql, causal, scale, g_out, g_lse):
  """Scaled dot-product attention: (out, lse [B, Tq, H], dq, dk, dv)."""
  q, k, v, g_out = (np.asarray(x, np.float64) for x in (q, k, v, g_out))
  p, lse = np_softmax(np.einsum("bqhd,bkhd->bhqk", q, k) * scale, kl, ql, causal)
  out = np.einsum("bhqk,bkhd->bqhd", p, v)
  ds = np_softmax_grad(p, np.einsum("bqhd,bkhd->bhqk", g_out, v), g_lse)
  dq = np.einsum("bhqk,bkhd->bqhd", ds, k) * scale
  dk = np.einsum("bhqk,bqhd->bkhd", ds, q) * scale
  dv = np.einsum("bhqk,bqhd->bkhd", p, g_out)
  return out, np.swapaxes(lse, 1, 2), dq, dk, dv


def np_additive(qp, kp, w, val, kl, ql, causal, g_out, g_lse):
  """Naive additive attention e_ij = wᵀ tanh(qp_i + kp_j): (out, lse, dq_proj, dk_proj, dv_vec,
  dvalues)."""
  qp, kp, w, val, g_out = (np.asarray(x, np.float64) for x in (qp, kp, w, val, g_out))
  h = np.tanh(qp[:, :, None] + kp[:, None, :])  # [B, Tq, Tk, H, da]
  p, lse = np_softmax(np.einsum("bqkha,ha->bhqk", h, w), kl, ql, causal)
  out = np.einsum("bhqk,bkhd->bqhd", p, val)
  ds = np_softmax_grad(p, np.einsum("bqhd,bkhd->bhqk", g_out, val), g_lse)  # [B, H, Tq, Tk]
  g = np.einsum("bhqk,bqkha->bqkha", ds, 1 - h * h) * w  # dS_ij w_a (1 - tanh²)
  dw = np.einsum("bhqk,bqkha->ha", ds, h)
  dval = np.einsum("bhqk,bqhd->bkhd", p, g_out)
  return out, np.swapaxes(lse, 1, 2), g.sum(2), g.sum(1), dw, dval


# ----------------------------------------------------------------------------------------------
# Error measures.


def max_err(x, ref):
  x = np.asarray(jnp.asarray(x, jnp.float32), np.float64)
  both_inf = np.isneginf(x) & np.isneginf(ref)
  diff = np.abs(np.where(both_inf, 0.0, x) - np.where(both_inf, 0.0, ref))
  return float(np.max(diff, initial=0.0))  # NaN or a lone inf makes this NaN/inf: fails


def magnitude(ref):
  return max(1.0, float(np.max(np.abs(np.where(np.isfinite(ref), ref, 0.0)), initial=0.0)))


def assert_as_close_as_naive(got, naive, ref, dtype, what):
  """The tolerance rule of the module docstring; NaN or inf where ref is finite fails."""
  assert np.all(np.isfinite(np.asarray(got, np.float32)) | np.isneginf(ref)), f"{what}: NaN/inf"
  floor = FLOOR[dtype] * magnitude(ref)
  err, err_naive = max_err(got, ref), max_err(naive, ref)
  assert err <= 2 * err_naive + floor, (
      f"{what}: error {err:.3g} > 2 x naive {err_naive:.3g} + floor {floor:.3g}")
