"""kernels.additive_attention (issue 6) against a float64 NumPy reference of the naive form.

Same tolerance rule as tests/test_kernels_attention.py: in a dtype, an implementation's error
against float64 is at most twice the naive ("xla") implementation's error plus a small floor.
The Pallas suite runs compiled on a GPU and in interpret mode on CPU (INTERPRET = True).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernels
from kernels import additive as aa

DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)
FLOOR = {jnp.float32: 1e-6, jnp.bfloat16: 2e-3, jnp.float16: 2.5e-4}


@dataclasses.dataclass(frozen=True)
class Case:
  name: str
  B: int
  Tq: int
  Tk: int
  H: int
  da: int
  dv: int
  causal: bool
  key_lengths: tuple | None = None
  query_lengths: tuple | None = None

  def __str__(self):
    return self.name


CASES = [
    # Odd lengths, Tq < Tk, a batch row without keys, padded queries, d_attn not a power of 2.
    Case("cross_padded", B=2, Tq=19, Tk=41, H=3, da=24, dv=20, causal=False,
         key_lengths=(41, 0), query_lengths=(15, 19)),
    # Causal, Tq > Tk (top-left aligned), short keys.
    Case("causal_tall", B=3, Tq=35, Tk=22, H=1, da=16, dv=40, causal=True, key_lengths=(22, 5, 0)),
    # Encoder self-attention shape with a larger d_attn and several heads.
    Case("self_d64", B=1, Tq=27, Tk=27, H=2, da=64, dv=16, causal=False, query_lengths=(20,)),
]
# Half precision on the two masked cases; every case in float32.
FWD_CASES = [(c, dt) for c in CASES for dt in DTYPES if dt == jnp.float32 or c.name != "self_d64"]
GRAD_CASES = [(c, jnp.float32) for c in CASES] + [(CASES[0], jnp.bfloat16)]


def make_inputs(case: Case, dtype, seed=0):
  rng = np.random.default_rng(seed)
  qp = rng.standard_normal((case.B, case.Tq, case.H, case.da))
  kp = rng.standard_normal((case.B, case.Tk, case.H, case.da))
  w = rng.standard_normal((case.H, case.da)) / np.sqrt(case.da) * 3
  val = rng.standard_normal((case.B, case.Tk, case.H, case.dv))
  qp, kp, val = (jnp.asarray(x, dtype) for x in (qp, kp, val))
  w = jnp.asarray(w, jnp.float32)  # parameters stay float32, as in attn.scores.init_additive
  kl = None if case.key_lengths is None else jnp.asarray(case.key_lengths, jnp.int32)
  ql = None if case.query_lengths is None else jnp.asarray(case.query_lengths, jnp.int32)
  return qp, kp, w, val, kl, ql


def cotangents(case: Case, seed=1):
  rng = np.random.default_rng(seed)
  return (jnp.asarray(rng.standard_normal((case.B, case.Tq, case.H, case.dv)), jnp.float32),
          jnp.asarray(rng.standard_normal((case.B, case.Tq, case.H)), jnp.float32))


def np_additive(qp, kp, w, val, kl, ql, causal, g_out, g_lse):
  """float64 naive additive attention and its hand-derived gradients.

  Returns (out, lse, dq_proj, dk_proj, dv_vec, dvalues) for loss = <out, g_out> + <lse, g_lse>.
  """
  qp, kp, w, val, g_out = (np.asarray(x, np.float64) for x in (qp, kp, w, val, g_out))
  B, Tq, H, _ = qp.shape
  Tk = kp.shape[1]
  kl = np.full(B, Tk) if kl is None else np.asarray(kl)
  ql = np.full(B, Tq) if ql is None else np.asarray(ql)
  i, j = np.arange(Tq)[:, None], np.arange(Tk)[None, :]
  valid = (j < kl[:, None, None]) & (i < ql[:, None, None])
  if causal:
    valid = valid & (j <= i)
  valid = valid[:, None]  # [B, 1, Tq, Tk]
  h = np.tanh(qp[:, :, None] + kp[:, None, :])  # [B, Tq, Tk, H, da]
  e = np.einsum("bqkha,ha->bhqk", h, w)
  m = np.max(np.where(valid, e, -np.inf), axis=-1, keepdims=True)
  m = np.where(np.isfinite(m), m, 0.0)
  x = np.where(valid, np.exp(e - m), 0.0)
  l = x.sum(-1, keepdims=True)
  p = x / np.where(l > 0, l, 1.0)
  out = np.einsum("bhqk,bkhd->bqhd", p, val)
  with np.errstate(divide="ignore"):
    lse = np.where(l[..., 0] > 0, m[..., 0] + np.log(l[..., 0]), -np.inf)
  g_lse_h = np.swapaxes(np.asarray(g_lse, np.float64), 1, 2)
  dp = np.einsum("bqhd,bkhd->bhqk", g_out, val)
  ds = p * (dp - np.sum(p * dp, -1, keepdims=True)) + p * g_lse_h[..., None]  # [B, H, Tq, Tk]
  g = np.einsum("bhqk,bqkha->bqkha", ds, 1 - h * h) * w  # dS_ij w_a (1 - tanh²)
  dq = g.sum(2)
  dk = g.sum(1)
  dw = np.einsum("bhqk,bqkha->ha", ds, h)
  dval = np.einsum("bhqk,bqhd->bkhd", p, g_out)
  return out, np.swapaxes(lse, 1, 2), dq, dk, dw, dval


def _max_err(x, ref):
  x = np.asarray(jnp.asarray(x, jnp.float32), np.float64)
  both_inf = np.isneginf(x) & np.isneginf(ref)
  diff = np.abs(np.where(both_inf, 0.0, x) - np.where(both_inf, 0.0, ref))
  return float(np.max(diff, initial=0.0))  # NaN or a lone inf makes this NaN/inf: fails


def _magnitude(ref):
  return max(1.0, float(np.max(np.abs(np.where(np.isfinite(ref), ref, 0.0)), initial=0.0)))


def assert_as_close_as_naive(got, naive, ref, dtype, what):
  floor = FLOOR[dtype] * _magnitude(ref)
  err, err_naive = _max_err(got, ref), _max_err(naive, ref)
  assert err <= 2 * err_naive + floor, (
      f"{what}: error {err:.3g} > 2 x naive {err_naive:.3g} + floor {floor:.3g}")


def grads(fn, qp, kp, w, val, g_out, g_lse):
  def loss(qp, kp, w, val):
    out, lse = fn(qp, kp, w, val)
    lse = jnp.where(jnp.isfinite(lse), lse, 0.0)
    return jnp.sum(out.astype(jnp.float32) * g_out) + jnp.sum(lse * g_lse)
  return jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(qp, kp, w, val)


class _AdditiveSuite:
  IMPLEMENTATION = "pallas"
  INTERPRET: bool | None = None
  BLOCKS: dict = {}

  def run(self, case, qp, kp, w, val, kl, ql, **kw):
    kw = {**self.BLOCKS, **kw}
    return aa.additive_attention_with_lse(qp, kp, w, val, key_lengths=kl, query_lengths=ql,
                                          causal=case.causal, implementation=self.IMPLEMENTATION,
                                          interpret=self.INTERPRET, **kw)

  @staticmethod
  def naive(case, qp, kp, w, val, kl, ql):
    return aa.additive_attention_with_lse(qp, kp, w, val, key_lengths=kl, query_lengths=ql,
                                          causal=case.causal, implementation="xla")

  @pytest.mark.parametrize("case,dtype", FWD_CASES,
                           ids=[f"{c}-{jnp.dtype(d).name}" for c, d in FWD_CASES])
  def test_forward_matches_float64(self, case, dtype):
    qp, kp, w, val, kl, ql = make_inputs(case, dtype)
    g_out, g_lse = cotangents(case)
    ref_out, ref_lse, *_ = np_additive(qp, kp, w, val, kl, ql, case.causal, g_out, g_lse)
    out, lse = self.run(case, qp, kp, w, val, kl, ql)
    assert out.shape == (case.B, case.Tq, case.H, case.dv) and out.dtype == dtype
    naive_out, naive_lse = self.naive(case, qp, kp, w, val, kl, ql)
    assert_as_close_as_naive(out, naive_out, ref_out, dtype, "out")
    assert_as_close_as_naive(lse, naive_lse, ref_lse, dtype, "lse")
    empty = np.isneginf(ref_lse)
    assert empty.any()  # every case has rows without keys
    np.testing.assert_array_equal(np.asarray(out, np.float32)[empty], 0.0)

  @pytest.mark.parametrize("case,dtype", GRAD_CASES,
                           ids=[f"{c}-{jnp.dtype(d).name}" for c, d in GRAD_CASES])
  def test_gradients_match_float64(self, case, dtype):
    qp, kp, w, val, kl, ql = make_inputs(case, dtype)
    g_out, g_lse = cotangents(case)
    _, _, *ref = np_additive(qp, kp, w, val, kl, ql, case.causal, g_out, g_lse)
    got = grads(lambda *a: self.run(case, *a, kl, ql), qp, kp, w, val, g_out, g_lse)
    naive = grads(lambda *a: self.naive(case, *a, kl, ql), qp, kp, w, val, g_out, g_lse)
    for name, g, n, r, x in zip(("dq_proj", "dk_proj", "dv_vec", "dvalues"), got, naive, ref,
                                (qp, kp, w, val)):
      assert g.shape == x.shape and g.dtype == x.dtype, name
      assert np.all(np.isfinite(np.asarray(g, np.float32))), name
      assert_as_close_as_naive(g, n, r, dtype, name)


class TestPallasAdditive(_AdditiveSuite):
  """Compiled kernels need a GPU; the interpret subclass runs the same tests on CPU."""
  IMPLEMENTATION = "pallas"
  INTERPRET = False
  BLOCKS = {"block_q": 16, "block_k": 16, "block_d": 8}

  @pytest.fixture(autouse=True)
  def _needs_device(self):
    if not self.INTERPRET and jax.default_backend() == "cpu":
      pytest.skip("compiled Pallas needs a GPU; TestPallasAdditiveInterpret covers it on CPU")

  @pytest.mark.parametrize("blocks", [
      kernels.BlockSizes(block_q=32, block_k=16, block_d=4),
      kernels.BlockSizes(block_q=16, block_k=32, block_q_bwd=32, block_k_bwd=16, block_d=16),
  ], ids=["32x16x4", "16x32_bwd32x16x16"])
  def test_tile_sizes(self, blocks):
    case = CASES[1]
    qp, kp, w, val, kl, ql = make_inputs(case, jnp.float32)
    g_out, g_lse = cotangents(case)
    ref = np_additive(qp, kp, w, val, kl, ql, case.causal, g_out, g_lse)
    run = lambda *a: aa.additive_attention_with_lse(
        *a, key_lengths=kl, query_lengths=ql, causal=case.causal, implementation="pallas",
        interpret=self.INTERPRET, block_sizes=blocks)
    out, lse = run(qp, kp, w, val)
    got = grads(run, qp, kp, w, val, g_out, g_lse)
    for x, want in zip((out, lse, *got), ref):
      np.testing.assert_allclose(np.asarray(x), want, atol=5e-5, rtol=1e-5)

  def test_every_output_element_is_written(self):
    case = CASES[0]
    qp, kp, w, val, kl, ql = make_inputs(case, jnp.float32)
    g_out, _ = cotangents(case)
    kl_, ql_ = jnp.clip(kl, 0, case.Tk), jnp.clip(ql, 0, case.Tq)
    for causal in (False, True):
      def f(qp, kp, w, val, poison=True):
        return aa._pallas_padded(qp, kp, w, val, kl_, ql_, causal=causal,
                                 blocks=kernels.BlockSizes(block_q=16, block_k=16, block_d=8),
                                 interpret=self.INTERPRET, poison=poison)
      (out, lse), vjp = jax.vjp(f, qp, kp, w, val)
      assert out.shape[1] == 32 and out.shape[-1] == 32  # padded from 19 rows, 20 columns
      assert not np.any(np.isnan(np.asarray(out))) and not np.any(np.isnan(np.asarray(lse)))
      g = jnp.zeros_like(out).at[:, :case.Tq, :, :case.dv].set(g_out)
      for x in vjp((g, jnp.zeros_like(lse))):
        assert not np.any(np.isnan(np.asarray(x)))
      out_clean, _ = f(qp, kp, w, val, poison=False)
      np.testing.assert_array_equal(np.asarray(out), np.asarray(out_clean))


class TestPallasAdditiveInterpret(TestPallasAdditive):
  INTERPRET = True


class TestBlockedAdditive(_AdditiveSuite):
  IMPLEMENTATION = "blocked"
  BLOCKS = {"block_q": 16, "block_k": 16}

  def test_memory_is_linear_in_length(self):
    """The compiled blocked forward+backward needs far less than one [Tq, Tk, da] tensor."""
    Tq, Tk, da = 384, 512, 64
    qs = jax.ShapeDtypeStruct((1, Tq, 1, da), jnp.float32)
    ks = jax.ShapeDtypeStruct((1, Tk, 1, da), jnp.float32)
    ws = jax.ShapeDtypeStruct((1, da), jnp.float32)

    def temp_bytes(impl):
      f = lambda qp, kp, w: jnp.sum(aa.additive_attention(qp, kp, w, kp, implementation=impl))
      compiled = jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2))).lower(qs, ks, ws).compile()
      return compiled.memory_analysis().temp_size_in_bytes

    one_tensor = Tq * Tk * da * 4
    assert temp_bytes("xla") >= one_tensor  # the naive form does materialize it
    assert temp_bytes("blocked") < one_tensor / 4


def test_agrees_with_attn_additive_score():
  """The kernel with q_proj = W q + b, k_proj = U k, v_vec = v[None] reproduces attn.attend."""
  core = pytest.importorskip("attn.core")
  rng = np.random.default_rng(3)
  B, Tq, Tk, dq, dk, da, dv = 2, 7, 11, 12, 10, 16, 5
  params = core.init_score("additive", jax.random.PRNGKey(0), dq, dk, d_attn=da)
  params = {**params, "b": jnp.asarray(rng.standard_normal(da), jnp.float32)}
  q = jnp.asarray(rng.standard_normal((B, Tq, dq)), jnp.float32)
  k = jnp.asarray(rng.standard_normal((B, Tk, dk)), jnp.float32)
  v = jnp.asarray(rng.standard_normal((B, Tk, dv)), jnp.float32)
  kl = jnp.array([11, 4])
  mask = jnp.arange(Tk)[None, None, :] < kl[:, None, None]  # [B, 1, Tk]
  ctx, _ = core.attend(params, q, k, v, score="additive", mask=mask)
  q_proj = (q @ params["W"] + params["b"])[:, :, None]  # [B, Tq, 1, da]
  k_proj = (k @ params["U"])[:, :, None]
  for impl in ("pallas", "blocked", "xla"):
    out = aa.additive_attention(q_proj, k_proj, params["v"][None], v[:, :, None], key_lengths=kl,
                                implementation=impl, block_q=16, block_k=16)
    np.testing.assert_allclose(np.asarray(out[:, :, 0]), np.asarray(ctx), atol=2e-5,
                               err_msg=impl)


@pytest.mark.parametrize("kwargs,match", [
    (dict(k_proj=jnp.zeros((2, 9, 2, 8))), "batch or heads"),
    (dict(v_vec=jnp.zeros((3, 8))), "batch or heads"),
    (dict(v_vec=jnp.zeros((2, 6))), "d_attn disagrees"),
    (dict(k_proj=jnp.zeros((1, 9, 2, 6))), "d_attn disagrees"),
    (dict(values=jnp.zeros((1, 8, 2, 4))), "disagree on Tk"),
    (dict(v_vec=jnp.zeros((8,))), r"v_vec must be \[H, d_attn\]"),
    (dict(q_proj=jnp.zeros((1, 5, 2, 8), jnp.int32)), "float32, bfloat16 or float16"),
    (dict(k_proj=jnp.zeros((1, 9, 2, 8), jnp.float16)), "share a dtype"),
    (dict(implementation="triton"), "unknown implementation 'triton'"),
    (dict(block_k=12), "power of two"),
    (dict(key_lengths=jnp.array([[3]])), r"key_lengths must have shape \[B\]"),
])
def test_bad_input_is_refused(kwargs, match):
  args = dict(q_proj=jnp.zeros((1, 5, 2, 8)), k_proj=jnp.zeros((1, 9, 2, 8)),
              v_vec=jnp.zeros((2, 8)), values=jnp.zeros((1, 9, 2, 4)))
  args.update(kwargs)
  arrays = [args.pop(n) for n in ("q_proj", "k_proj", "v_vec", "values")]
  with pytest.raises(ValueError, match=match):
    aa.additive_attention(*arrays, **args)
