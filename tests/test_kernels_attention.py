"""kernels.attention against a float64 NumPy reference, for every implementation.

Tolerances: see tests/kernel_cases.py (at most twice the naive implementation's error plus a
floor; the naive implementation itself against an absolute table).
The Pallas suite runs compiled on a GPU (`TestPallasAttention`) and in interpret mode on CPU:
`TestPallasAttentionInterpret` (INTERPRET = True) runs the GPU launch on the generic interpreter,
`TestPallasAttentionTpuInterpret` (INTERPRET = pltpu.InterpretParams()) the TPU launch (grid over
the other sequence, VMEM scratch) on JAX's TPU interpreter, which reads unset scratch as NaN.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

import kernel_cases as kc
import kernels
from kernel_cases import Case
from kernels import flash_attention as fa

# Sizes differ within each case so that a swapped axis changes the shapes and fails.
CASES = [
    # Odd lengths, Tq < Tk, a batch row with no keys at all, padded query rows, d not a power of 2.
    Case("cross_padded", B=2, Tq=37, Tk=53, H=3, d=40, dv=24, causal=False,
         key_lengths=(53, 0), query_lengths=(30, 37)),
    # Causal with Tq > Tk (top-left aligned: rows past Tk see every valid key), short keys.
    Case("causal_tall", B=2, Tq=45, Tk=29, H=1, d=32, dv=48, causal=True, key_lengths=(29, 7)),
    # Causal with Tq < Tk and padded queries.
    Case("causal_wide", B=1, Tq=21, Tk=70, H=2, d=64, dv=16, causal=True, query_lengths=(13,)),
    # Self attention with a head dim of 128 and a key length of 1.
    Case("self_causal_d128", B=3, Tq=33, Tk=33, H=2, d=128, dv=80, causal=True,
         key_lengths=(33, 1, 17), query_lengths=(33, 33, 9)),
    # One query (decoding), no masks.
    Case("single_query", B=2, Tq=1, Tk=50, H=4, d=48, dv=16, causal=False),
]
# Every case in float32; the half-precision dtypes on the three cases that carry the masks.
FWD_CASES = [(c, dt) for c in CASES for dt in kc.DTYPES
             if dt == jnp.float32 or c.name in ("cross_padded", "causal_tall", "self_causal_d128")]
GRAD_CASES = [(c, jnp.float32) for c in CASES] + [(CASES[0], jnp.bfloat16),
                                                    (CASES[1], jnp.float16)]


def reference(case: Case, q, k, v, kl, ql, scale=None):
  """np_attention at the case's causality with its cotangents: (out, lse, dq, dk, dv)."""
  scale = case.d ** -0.5 if scale is None else scale
  return kc.np_attention(q, k, v, kl, ql, case.causal, scale, *kc.cotangents(case))


class _AttentionSuite:
  """Tests shared by the implementations; subclasses set IMPLEMENTATION (and INTERPRET)."""
  IMPLEMENTATION = "pallas"
  INTERPRET: bool | None = None
  BLOCKS: dict = {}

  def run(self, q, k, v, kl, ql, causal, **kw):
    kw = {**self.BLOCKS, **kw}
    return fa.attention_with_lse(q, k, v, key_lengths=kl, query_lengths=ql, causal=causal,
                                 implementation=self.IMPLEMENTATION, interpret=self.INTERPRET, **kw)

  def naive(self, q, k, v, kl, ql, causal):
    return fa.attention_with_lse(q, k, v, key_lengths=kl, query_lengths=ql, causal=causal,
                                 implementation="xla")

  @pytest.mark.parametrize("case,dtype", FWD_CASES, ids=kc.ids(FWD_CASES))
  def test_forward_matches_float64(self, case, dtype):
    q, k, v, kl, ql = kc.dot_inputs(case, dtype)
    ref_out, ref_lse, *_ = reference(case, q, k, v, kl, ql)
    out, lse = self.run(q, k, v, kl, ql, case.causal)
    assert out.shape == (case.B, case.Tq, case.H, case.dv) and out.dtype == dtype
    assert lse.shape == (case.B, case.Tq, case.H) and lse.dtype == jnp.float32
    naive_out, naive_lse = self.naive(q, k, v, kl, ql, case.causal)
    kc.assert_as_close_as_naive(out, naive_out, ref_out, dtype, "out")
    kc.assert_as_close_as_naive(lse, naive_lse, ref_lse, dtype, "lse")
    # Rows with no visible key: exactly zero output and lse = -inf, never NaN or the mean of v.
    empty = np.isneginf(ref_lse)
    np.testing.assert_array_equal(np.asarray(out, np.float32)[empty], 0.0)
    assert np.all(np.isneginf(np.asarray(lse)[empty]))

  @pytest.mark.parametrize("case,dtype", GRAD_CASES, ids=kc.ids(GRAD_CASES))
  def test_gradients_match_float64(self, case, dtype):
    q, k, v, kl, ql = kc.dot_inputs(case, dtype)
    cts = kc.cotangents(case)
    _, _, *ref = reference(case, q, k, v, kl, ql)
    got = kc.loss_and_grads(lambda q, k, v: self.run(q, k, v, kl, ql, case.causal), (q, k, v),
                            *cts)
    naive = kc.loss_and_grads(lambda q, k, v: self.naive(q, k, v, kl, ql, case.causal),
                              (q, k, v), *cts)
    for name, g, n, r, x in zip(("dq", "dk", "dv"), got, naive, ref, (q, k, v)):
      assert g.shape == x.shape and g.dtype == x.dtype, name
      kc.assert_as_close_as_naive(g, n, r, dtype, name)

  def test_empty_rows_have_zero_finite_gradients(self):
    case = CASES[0]  # batch 1 has no keys; rows 30.. of batch 0 are padding
    q, k, v, kl, ql = kc.dot_inputs(case, jnp.float32)
    dq, dk, dv = kc.loss_and_grads(lambda q, k, v: self.run(q, k, v, kl, ql, case.causal),
                                   (q, k, v), *kc.cotangents(case))
    for g in (dq, dk, dv):
      assert np.all(np.isfinite(np.asarray(g)))
    np.testing.assert_array_equal(np.asarray(dq)[1], 0.0)  # no keys: nothing to move
    np.testing.assert_array_equal(np.asarray(dq)[0, 30:], 0.0)  # padded query rows
    np.testing.assert_array_equal(np.asarray(dk)[1], 0.0)
    np.testing.assert_array_equal(np.asarray(dv)[1], 0.0)

  def test_default_scale_and_custom_scale(self):
    case = CASES[2]
    q, k, v, kl, ql = kc.dot_inputs(case, jnp.float32)
    ref_out, *_ = reference(case, q, k, v, kl, ql, scale=0.3)
    out, _ = self.run(q, k, v, kl, ql, case.causal, scale=0.3)
    np.testing.assert_allclose(np.asarray(out), ref_out, atol=2e-5)


class TestPallasAttention(_AttentionSuite):
  """Compiled Pallas kernels; needs a GPU. The interpret subclass runs the same tests on CPU."""
  IMPLEMENTATION = "pallas"
  INTERPRET = False
  BLOCKS = {"block_q": 16, "block_k": 32}  # several blocks per sequence at these small shapes

  @pytest.fixture(autouse=True)
  def _needs_device(self):
    if not self.INTERPRET and jax.default_backend() == "cpu":
      pytest.skip("compiled Pallas needs a GPU; TestPallasAttentionInterpret covers it on CPU")

  @pytest.mark.parametrize("blocks", [
      kernels.BlockSizes(block_q=16, block_k=16),
      kernels.BlockSizes(block_q=32, block_k=16, block_q_bwd=16, block_k_bwd=32),
      kernels.BlockSizes(block_q=64, block_k=64),  # one block covers everything
  ], ids=["16x16", "32x16_bwd16x32", "64x64"])
  def test_block_sizes(self, blocks):
    case = CASES[1]
    q, k, v, kl, ql = kc.dot_inputs(case, jnp.float32)
    ref = reference(case, q, k, v, kl, ql)
    run = lambda q, k, v: fa.attention_with_lse(
        q, k, v, key_lengths=kl, query_lengths=ql, causal=case.causal, implementation="pallas",
        interpret=self.INTERPRET, block_sizes=blocks)
    out, lse = run(q, k, v)
    grads = kc.loss_and_grads(run, (q, k, v), *kc.cotangents(case))
    for got, want in zip((out, lse, *grads), ref):
      np.testing.assert_allclose(np.asarray(got), want, atol=3e-5, rtol=1e-5)

  def test_every_output_element_is_written(self):
    """Outputs start as NaN (aliased poison buffers); every element, padding included, must be
    overwritten by the forward, dq and dk/dv kernels."""
    case = CASES[0]
    q, k, v, kl, ql = kc.dot_inputs(case, jnp.float32)
    g_out, _ = kc.cotangents(case)

    for causal in (False, True):
      def f(q, k, v, poison=True):
        return fa.pallas_attention_padded(
            q, k, v, key_lengths=kl, query_lengths=ql, causal=causal, scale=0.25,
            block_sizes=kernels.BlockSizes(block_q=16, block_k=32), interpret=self.INTERPRET,
            poison=poison)
      (out, lse), vjp = jax.vjp(f, q, k, v)
      assert out.shape[1] == 48 and out.shape[-1] == 32  # padded from 37 rows, 24 columns
      assert not np.any(np.isnan(np.asarray(out))) and not np.any(np.isnan(np.asarray(lse)))
      g = jnp.zeros_like(out).at[:, :case.Tq, :, :case.dv].set(g_out)
      grads = vjp((g, jnp.zeros_like(lse)))
      for x in grads:
        assert not np.any(np.isnan(np.asarray(x)))
      # Poisoning changes nothing else.
      out_clean, lse_clean = f(q, k, v, poison=False)
      np.testing.assert_array_equal(np.asarray(out), np.asarray(out_clean))
      np.testing.assert_array_equal(np.asarray(lse), np.asarray(lse_clean))

  def test_same_result_with_x64_enabled(self):
    """jax_enable_x64 makes Python ints int64: the kernels' int32 index arithmetic (loop bounds
    from lengths and block sizes) must not mix the two, forward or backward."""
    # Small (interpret mode is slow) but causal, masked and several tiles per axis: every loop
    # bound of the forward, dq and dk/dv kernels is computed.
    case = Case("x64", B=1, Tq=20, Tk=18, H=1, d=16, dv=16, causal=True, key_lengths=(13,))
    q, k, v, kl, ql = kc.dot_inputs(case, jnp.float32)
    cts = kc.cotangents(case)
    run = lambda q, k, v: self.run(q, k, v, kl, ql, case.causal)
    want = (*run(q, k, v), *kc.loss_and_grads(run, (q, k, v), *cts))
    with kc.x64_enabled():
      got = (*run(q, k, v), *kc.loss_and_grads(run, (q, k, v), *cts))
    for name, g, w in zip(("out", "lse", "dq", "dk", "dv"), got, want):
      assert g.dtype == w.dtype, name
      np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=1e-6, rtol=1e-6,
                                 err_msg=name)

  def test_head_dim_above_256_is_refused(self):
    q = jnp.zeros((1, 16, 1, 320), jnp.float32)
    with pytest.raises(ValueError, match="head dims up to 256"):
      fa.attention(q, q, q, implementation="pallas", interpret=self.INTERPRET)


class TestBlockedAttention(_AttentionSuite):
  IMPLEMENTATION = "blocked"
  BLOCKS = {"block_q": 16, "block_k": 32}

  def test_auto_is_blocked_on_cpu(self):
    if jax.default_backend() != "cpu":
      pytest.skip("checks the CPU choice of 'auto'")
    case = CASES[0]
    q, k, v, kl, ql = kc.dot_inputs(case, jnp.float32)
    auto = fa.attention(q, k, v, key_lengths=kl, query_lengths=ql)
    blocked = fa.attention(q, k, v, key_lengths=kl, query_lengths=ql, implementation="blocked")
    np.testing.assert_array_equal(np.asarray(auto), np.asarray(blocked))


class TestNaiveAttention:
  """The "xla" yardstick itself, held to an absolute per-dtype table against float64."""

  @pytest.mark.parametrize("dtype", kc.DTYPES, ids=lambda d: jnp.dtype(d).name)
  @pytest.mark.parametrize("case", CASES[:2], ids=str)
  def test_naive_matches_float64(self, case, dtype):
    q, k, v, kl, ql = kc.dot_inputs(case, dtype)
    ref = reference(case, q, k, v, kl, ql)
    run = lambda q, k, v: fa.attention_with_lse(q, k, v, key_lengths=kl, query_lengths=ql,
                                                causal=case.causal, implementation="xla")
    out, lse = run(q, k, v)
    grads = kc.loss_and_grads(run, (q, k, v), *kc.cotangents(case))
    for name, got, want in zip(("out", "lse", "dq", "dk", "dv"), (out, lse, *grads), ref):
      assert kc.max_err(got, want) <= kc.NAIVE_TOL[dtype] * kc.magnitude(want), name


def test_agrees_with_attn_attend_scaled_dot():
  """Models switch between attn.attend(score="scaled_dot") and the kernel by a flag."""
  attend = pytest.importorskip("attn.core").attend
  case = CASES[3]
  q, k, v, kl, ql = kc.dot_inputs(case, jnp.float32)
  from attn import masks
  mask = masks.padding_mask(kl, case.Tk, query_lengths=ql, Tq=case.Tq)[:, None]  # [B, 1, Tq, Tk]
  heads = lambda x: jnp.swapaxes(x, 1, 2)  # [B, T, H, d] -> [B, H, T, d]
  ctx, _ = attend(None, heads(q), heads(k), heads(v), score="scaled_dot", mask=mask, causal=True)
  for impl in ("pallas", "blocked", "xla"):
    out = fa.attention(q, k, v, key_lengths=kl, query_lengths=ql, causal=True,
                       implementation=impl, block_q=16, block_k=16)
    np.testing.assert_allclose(np.asarray(heads(out)), np.asarray(ctx), atol=2e-5, err_msg=impl)


@pytest.mark.parametrize("kwargs,match", [
    (dict(k=jnp.zeros((2, 9, 3, 8))), "batch or heads"),
    (dict(k=jnp.zeros((1, 9, 2, 8))), "batch or heads"),
    (dict(v=jnp.zeros((1, 7, 3, 8))), "disagree on Tk"),
    (dict(k=jnp.zeros((1, 9, 3, 4)), v=jnp.zeros((1, 9, 3, 4))), "same head dim"),
    (dict(q=jnp.zeros((5, 3, 8))), r"must be \[B, T, H, d\]"),
    (dict(q=jnp.zeros((1, 5, 3, 8), jnp.int32)), "float32, bfloat16 or float16"),
    (dict(v=jnp.zeros((1, 9, 3, 8), jnp.bfloat16)), "share a dtype"),
    (dict(implementation="cuda"), "unknown implementation 'cuda'"),
    (dict(block_q=24), "power of two"),
    (dict(block_q=16, block_sizes=kernels.BlockSizes()), "either block_sizes"),
    (dict(key_lengths=jnp.array([3, 4])), r"key_lengths must have shape \[B\]"),
    (dict(query_lengths=jnp.array([2.0])), "query_lengths must be integer"),
])
def test_bad_input_is_refused(kwargs, match):
  args = dict(q=jnp.zeros((1, 5, 3, 8)), k=jnp.zeros((1, 9, 3, 8)), v=jnp.zeros((1, 9, 3, 8)))
  args.update(kwargs)
  q, k, v = args.pop("q"), args.pop("k"), args.pop("v")
  with pytest.raises(ValueError, match=match):
    fa.attention(q, k, v, **args)


class TestPallasAttentionInterpret(TestPallasAttention):
  INTERPRET = True


# The TPU launch on the TPU interpreter (a few times slower per call than the generic one): the
# cases that carry masks, causal Tq > Tk and Tq < Tk, d = 128, each half-precision dtype once.
TPU_FWD_CASES = [(CASES[0], jnp.float32), (CASES[1], jnp.bfloat16), (CASES[3], jnp.float16)]
TPU_GRAD_CASES = [(CASES[0], jnp.bfloat16), (CASES[1], jnp.float32), (CASES[2], jnp.float32),
                  (CASES[3], jnp.float32)]


class TestPallasAttentionTpuInterpret(TestPallasAttention):
  INTERPRET = pltpu.InterpretParams()
  test_block_sizes = None  # the tiles' bookkeeping is shared with the GPU launch, tested above
  test_default_scale_and_custom_scale = None
  test_head_dim_above_256_is_refused = None

  @pytest.mark.parametrize("case,dtype", TPU_FWD_CASES, ids=kc.ids(TPU_FWD_CASES))
  def test_forward_matches_float64(self, case, dtype):
    super().test_forward_matches_float64(case, dtype)

  @pytest.mark.parametrize("case,dtype", TPU_GRAD_CASES, ids=kc.ids(TPU_GRAD_CASES))
  def test_gradients_match_float64(self, case, dtype):
    super().test_gradients_match_float64(case, dtype)


@pytest.mark.parametrize("implementation", ["pallas", "blocked", "xla"])
def test_an_empty_batch_gives_the_empty_result_on_every_implementation(implementation):
  """A batch of 0 examples attends to nothing: every implementation returns out [0, Tq, H, dv]
  and lse [0, Tq, H], and its gradient, empty; an empty sequence is refused by all alike."""
  q, k, v = jnp.zeros((0, 5, 2, 8)), jnp.ones((0, 7, 2, 8)), jnp.ones((0, 7, 2, 6))
  out, lse = kernels.attention_with_lse(q, k, v, implementation=implementation)
  assert out.shape == (0, 5, 2, 6) and lse.shape == (0, 5, 2)
  assert out.dtype == v.dtype and lse.dtype == jnp.float32
  grad = jax.grad(lambda q: kernels.attention(q, k, v, implementation=implementation).sum())(q)
  assert grad.shape == q.shape
  out = kernels.additive_attention(q, k, jnp.ones((2, 8)), v, implementation=implementation)
  assert out.shape == (0, 5, 2, 6)
  with pytest.raises(ValueError, match="empty head dim or sequence"):
    kernels.attention(jnp.zeros((3, 0, 2, 8)), jnp.ones((3, 7, 2, 8)),
                      jnp.ones((3, 7, 2, 6)), implementation=implementation)


def _no_head_calls():
  """Both kernels' public forms on inputs with no heads: {name: f(q, k, v, w) -> out}."""
  return {
      "dot": lambda q, k, v, w, **kw: kernels.attention(q, k, v, **kw),
      "additive": lambda q, k, v, w, **kw: kernels.additive_attention(q, k, w, v, **kw),
  }


@pytest.mark.parametrize("kernel", ["dot", "additive"])
@pytest.mark.parametrize("implementation, interpret", [
    ("pallas", None), ("pallas", pltpu.InterpretParams()), ("blocked", None)])
def test_no_heads_give_the_empty_result_and_gradients_of_the_dense_path(kernel, implementation,
                                                                        interpret):
  """H = 0 attends to nothing: the Pallas path (the GPU launch's interpreter and the TPU
  launch's, head-major) returns what the dense path does, out [B, Tq, 0, dv] and lse [B, Tq, 0],
  and empty gradients of every input, instead of slicing a head out of an empty axis."""
  q, k, v = jnp.zeros((2, 5, 0, 8)), jnp.ones((2, 7, 0, 8)), jnp.ones((2, 7, 0, 6))
  w = jnp.ones((0, 8))
  f = _no_head_calls()[kernel]
  kw = {} if interpret is None else {"interpret": interpret}

  def result(**kw):
    out = f(q, k, v, w, **kw)
    grads = jax.grad(lambda *a: f(*a, **kw).sum(), argnums=(0, 1, 2, 3))(q, k, v, w)
    return [(x.shape, x.dtype) for x in (out, *grads)]

  dense = result(implementation="xla")
  assert dense[0] == ((2, 5, 0, 6), v.dtype)
  assert result(implementation=implementation, **kw) == dense
  if kernel == "dot":
    out, lse = kernels.attention_with_lse(q, k, v, implementation=implementation, **kw)
    assert (lse.shape, lse.dtype) == ((2, 5, 0), jnp.float32) and out.shape == (2, 5, 0, 6)
    out, lse = kernels.pallas_attention_padded(q, k, v, interpret=True)
    assert out.shape[0::2] == (2, 0) and lse.shape[:2] == (2, 0)


def test_no_heads_lower_for_a_gpu_with_nothing_to_launch():
  """The compiled targets take the same way out: a call with no heads lowers for CUDA (from
  this host) with no kernel in it."""
  x = jax.ShapeDtypeStruct((2, 64, 0, 32), jnp.float32)
  f = lambda q: kernels.attention(q, q, q, implementation="pallas", interpret=False)
  text = jax.export.export(jax.jit(f), platforms=["cuda"])(x).mlir_module()
  assert "triton" not in text


_ENTRY_POINTS = {
    "attention": lambda q, w, **kw: kernels.attention(q, q, q, **kw),
    "attention_with_lse": lambda q, w, **kw: kernels.attention_with_lse(q, q, q, **kw),
    "additive_attention": lambda q, w, **kw: kernels.additive_attention(q, q, w, q, **kw),
    "additive_attention_with_lse":
        lambda q, w, **kw: kernels.additive_attention_with_lse(q, q, w, q, **kw),
    "attention_grad": lambda q, w, **kw: jax.grad(
        lambda q: kernels.attention(q, q, q, **kw).sum())(q),
    "additive_under_jit": lambda q, w, **kw: jax.jit(
        lambda q: kernels.additive_attention(q, q, w, q, **kw))(q),
    "pallas_attention_padded":
        lambda q, w, **kw: kernels.pallas_attention_padded(q, q, q, interpret=False),
    "pallas_additive_attention_padded": lambda q, w, **kw: (
        kernels.pallas_additive_attention_padded(q, q, w, q, interpret=False)),
}


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="a compiled target exists here")
@pytest.mark.parametrize("target", ["auto", "triton"])
@pytest.mark.parametrize("entry", list(_ENTRY_POINTS))
def test_compiled_pallas_on_a_cpu_is_one_clear_error_from_every_entry_point(entry, target):
  """interpret=False on a CPU host asks for a compiled kernel no target has: every public entry
  point says so in the same words (raised when the call is lowered for the CPU, so lowering for
  a GPU or TPU from this host still works: tests/test_kernels_lowering.py)."""
  q, w = jnp.ones((1, 8, 2, 16)), jnp.ones((2, 16))
  kw = dict(implementation="pallas", interpret=False, target=target)
  with pytest.raises(ValueError) as raised:
    _ENTRY_POINTS[entry](q, w, **kw)
  first = str(raised.value).splitlines()[0]  # (JAX adds a note on its filtered traceback)
  assert re.fullmatch(r"no compiled Pallas target for platform 'cpu' \(targets for: cuda, rocm"
                      r".*\); pass interpret=True or a target", first), first
