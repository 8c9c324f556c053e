"""kernels.additive_attention against a float64 NumPy reference of the naive form.

Same tolerance rule as tests/test_kernels_attention.py (see tests/kernel_cases.py): in a dtype,
an implementation's error against float64 is at most twice the naive ("xla") implementation's
error plus a small floor. The Pallas suite runs compiled on a GPU and in interpret mode on CPU:
the GPU launch on the generic interpreter (INTERPRET = True) and the TPU launch on JAX's TPU
interpreter (INTERPRET = pltpu.InterpretParams(), a subset of the suite).
"""

from __future__ import annotations

import math

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

import kernel_cases as kc
import kernels
import test_kernels_tpu
from kernel_cases import Case
from kernels import _additive_tpu
from kernels import additive as aa

# d is d_attn here.
CASES = [
    # Odd lengths, Tq < Tk, a batch row without keys, padded queries, d_attn not a power of 2.
    Case("cross_padded", B=2, Tq=19, Tk=41, H=3, d=24, dv=20, causal=False,
         key_lengths=(41, 0), query_lengths=(15, 19)),
    # Causal, Tq > Tk (top-left aligned), short keys.
    Case("causal_tall", B=3, Tq=35, Tk=22, H=1, d=16, dv=40, causal=True, key_lengths=(22, 5, 0)),
    # Encoder self-attention shape with a larger d_attn and several heads.
    Case("self_d64", B=1, Tq=27, Tk=27, H=2, d=64, dv=16, causal=False, query_lengths=(20,)),
]
# Half precision on the two masked cases; every case in float32.
FWD_CASES = [(c, dt) for c in CASES for dt in kc.DTYPES
             if dt == jnp.float32 or c.name != "self_d64"]
GRAD_CASES = [(c, jnp.float32) for c in CASES] + [(CASES[0], jnp.bfloat16)]


def reference(case: Case, qp, kp, w, val, kl, ql):
  """np_additive at the case's causality with its cotangents: (out, lse, dq_proj, dk_proj,
  dv_vec, dvalues)."""
  return kc.np_additive(qp, kp, w, val, kl, ql, case.causal, *kc.cotangents(case))


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

  @pytest.mark.parametrize("case,dtype", FWD_CASES, ids=kc.ids(FWD_CASES))
  def test_forward_matches_float64(self, case, dtype):
    qp, kp, w, val, kl, ql = kc.additive_inputs(case, dtype)
    ref_out, ref_lse, *_ = reference(case, qp, kp, w, val, kl, ql)
    out, lse = self.run(case, qp, kp, w, val, kl, ql)
    assert out.shape == (case.B, case.Tq, case.H, case.dv) and out.dtype == dtype
    naive_out, naive_lse = self.naive(case, qp, kp, w, val, kl, ql)
    kc.assert_as_close_as_naive(out, naive_out, ref_out, dtype, "out")
    kc.assert_as_close_as_naive(lse, naive_lse, ref_lse, dtype, "lse")
    empty = np.isneginf(ref_lse)
    assert empty.any()  # every case has rows without keys
    np.testing.assert_array_equal(np.asarray(out, np.float32)[empty], 0.0)

  @pytest.mark.parametrize("case,dtype", GRAD_CASES, ids=kc.ids(GRAD_CASES))
  def test_gradients_match_float64(self, case, dtype):
    qp, kp, w, val, kl, ql = kc.additive_inputs(case, dtype)
    cts = kc.cotangents(case)
    _, _, *ref = reference(case, qp, kp, w, val, kl, ql)
    got = kc.loss_and_grads(lambda *a: self.run(case, *a, kl, ql), (qp, kp, w, val), *cts)
    naive = kc.loss_and_grads(lambda *a: self.naive(case, *a, kl, ql), (qp, kp, w, val), *cts)
    for name, g, n, r, x in zip(("dq_proj", "dk_proj", "dv_vec", "dvalues"), got, naive, ref,
                                (qp, kp, w, val)):
      assert g.shape == x.shape and g.dtype == x.dtype, name
      assert np.all(np.isfinite(np.asarray(g, np.float32))), name
      kc.assert_as_close_as_naive(g, n, r, dtype, name)


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
    qp, kp, w, val, kl, ql = kc.additive_inputs(case, jnp.float32)
    ref = reference(case, qp, kp, w, val, kl, ql)
    run = lambda *a: aa.additive_attention_with_lse(
        *a, key_lengths=kl, query_lengths=ql, causal=case.causal, implementation="pallas",
        interpret=self.INTERPRET, block_sizes=blocks)
    out, lse = run(qp, kp, w, val)
    got = kc.loss_and_grads(run, (qp, kp, w, val), *kc.cotangents(case))
    for x, want in zip((out, lse, *got), ref):
      np.testing.assert_allclose(np.asarray(x), want, atol=5e-5, rtol=1e-5)

  def test_every_output_element_is_written(self):
    case = CASES[0]
    qp, kp, w, val, kl, ql = kc.additive_inputs(case, jnp.float32)
    g_out, _ = kc.cotangents(case)
    for causal in (False, True):
      def f(qp, kp, w, val, poison=True):
        return aa.pallas_additive_attention_padded(
            qp, kp, w, val, key_lengths=kl, query_lengths=ql, causal=causal,
            block_sizes=kernels.BlockSizes(block_q=16, block_k=16, block_d=8),
            interpret=self.INTERPRET, poison=poison)
      (out, lse), vjp = jax.vjp(f, qp, kp, w, val)
      assert out.shape[1] == 32 and out.shape[-1] == 32  # padded from 19 rows, 20 columns
      assert not np.any(np.isnan(np.asarray(out))) and not np.any(np.isnan(np.asarray(lse)))
      g = jnp.zeros_like(out).at[:, :case.Tq, :, :case.dv].set(g_out)
      for x in vjp((g, jnp.zeros_like(lse))):
        assert not np.any(np.isnan(np.asarray(x)))
      out_clean, _ = f(qp, kp, w, val, poison=False)
      np.testing.assert_array_equal(np.asarray(out), np.asarray(out_clean))

  def test_same_result_with_x64_enabled(self):
    """jax_enable_x64 makes Python ints int64: the kernels' int32 index arithmetic (loop bounds
    from lengths and block sizes) must not mix the two, forward or backward."""
    # Small (interpret mode is slow) but causal, masked and several tiles per axis: every loop
    # bound of the forward, dq and dk/dv kernels is computed.
    case = Case("x64", B=1, Tq=20, Tk=18, H=1, d=8, dv=16, causal=True, key_lengths=(13,))
    args = kc.additive_inputs(case, jnp.float32)
    arrays, (kl, ql) = args[:4], args[4:]
    cts = kc.cotangents(case)
    run = lambda *a: self.run(case, *a, kl, ql)
    want = (*run(*arrays), *kc.loss_and_grads(run, arrays, *cts))
    with kc.x64_enabled():
      got = (*run(*arrays), *kc.loss_and_grads(run, arrays, *cts))
    for name, g, x in zip(("out", "lse", "dq_proj", "dk_proj", "dv_vec", "dvalues"), got, want):
      assert g.dtype == x.dtype, name
      np.testing.assert_allclose(np.asarray(g), np.asarray(x), atol=1e-6, rtol=1e-6,
                                 err_msg=name)


class TestPallasAdditiveInterpret(TestPallasAdditive):
  INTERPRET = True


# The TPU launch (slower per call on the TPU interpreter): the masked cases, causal and not, and
# bfloat16 once; the tile variants cut d_attn into several scratch slices.
TPU_FWD_CASES = [(CASES[0], jnp.bfloat16), (CASES[1], jnp.float32)]
TPU_GRAD_CASES = [(CASES[0], jnp.float32), (CASES[1], jnp.float32)]


class TestPallasAdditiveTpuInterpret(TestPallasAdditive):
  INTERPRET = pltpu.InterpretParams()
  test_same_result_with_x64_enabled = None  # the TPU index maps are the dot kernel's, tested there

  @pytest.mark.parametrize("case,dtype", TPU_FWD_CASES, ids=kc.ids(TPU_FWD_CASES))
  def test_forward_matches_float64(self, case, dtype):
    super().test_forward_matches_float64(case, dtype)

  @pytest.mark.parametrize("case,dtype", TPU_GRAD_CASES, ids=kc.ids(TPU_GRAD_CASES))
  def test_gradients_match_float64(self, case, dtype):
    super().test_gradients_match_float64(case, dtype)


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


# ----------------------------------------------------------------------------------------------
# The TPU bodies' paths on JAX's TPU interpreter: whole tiles (no mask) and masked ones, with the
# backward's stash of tanh slabs and without it (formed twice), several d_attn slices.


@pytest.fixture
def no_stash(monkeypatch):
  """The TPU backward bodies without their stash (traces cached either way are dropped)."""
  monkeypatch.setattr(_additive_tpu, "STASH_BYTES", 0)
  jax.clear_caches()
  yield
  monkeypatch.undo()
  jax.clear_caches()


@pytest.mark.parametrize("stash", [True, False], ids=["stash", "no_stash"])
def test_tpu_whole_and_masked_tiles(stash, request):
  if not stash:
    request.getfixturevalue("no_stash")
  # 3 x 3 tiles of 16, causal: batch 0 (full lengths) has whole tiles below the diagonal.
  case = Case("whole", B=2, Tq=48, Tk=48, H=1, d=32, dv=16, causal=True, key_lengths=(48, 30),
              query_lengths=(48, 41))
  qp, kp, w, val, kl, ql = kc.additive_inputs(case, jnp.float32)
  run = lambda *a: aa.additive_attention_with_lse(
      *a, key_lengths=kl, query_lengths=ql, causal=True, implementation="pallas",
      interpret=pltpu.InterpretParams(),
      block_sizes=kernels.BlockSizes(block_q=16, block_k=16, block_d=8))
  ref = reference(case, qp, kp, w, val, kl, ql)
  got = (*run(qp, kp, w, val), *kc.loss_and_grads(run, (qp, kp, w, val), *kc.cotangents(case)))
  for name, x, want in zip(("out", "lse", "dq_proj", "dk_proj", "dv_vec", "dvalues"), got, ref):
    np.testing.assert_allclose(np.asarray(x), want, atol=5e-5, rtol=1e-5, err_msg=name)


# ----------------------------------------------------------------------------------------------
# tanh passes: the tanh elements each kernel body forms per tile, from its jaxpr, in units of a
# tile's bq·bk·d_attn (see the module docstring of kernels/additive.py: 5 passes before).


def _path_tanh(jaxpr):
  """tanh elements one run of `jaxpr` forms (a cond: its largest branch; a scan: length times)."""
  n = 0
  for e in jaxpr.eqns:
    if e.primitive.name == "tanh":
      n += math.prod(e.outvars[0].aval.shape)
    elif e.primitive.name == "cond":
      n += max(_path_tanh(b.jaxpr) for b in e.params["branches"])
    elif e.primitive.name == "scan":
      n += e.params["length"] * _path_tanh(e.params["jaxpr"].jaxpr)
    else:
      n += sum(_path_tanh(getattr(s, "jaxpr", s)) for s in jax.extend.core.jaxprs_in_params(
          e.params))
  return n


def _tile_loops(jaxpr):
  """The bodies of the `while` loops (a loop body's fori_loops over tiles) in `jaxpr`."""
  for e in jaxpr.eqns:
    if e.primitive.name == "while":
      yield e.params["body_jaxpr"].jaxpr
    else:
      for s in jax.extend.core.jaxprs_in_params(e.params):
        yield from _tile_loops(getattr(s, "jaxpr", s))


def _tanh_passes(target, blocks, d_attn=32):
  """{kernel: tanh elements per tile / (bq·bk·d_attn)} of the forward and backward kernels."""
  T = 64
  x = lambda w: jax.ShapeDtypeStruct((1, T, 1, w), jnp.float32)
  f = lambda qp, kp, w, val: aa.additive_attention(
      qp, kp, w, val, causal=True, implementation="pallas", target=target,
      block_sizes=blocks).sum()
  jaxpr = jax.make_jaxpr(jax.grad(f, argnums=(0, 1, 2, 3)))(
      x(d_attn), x(d_attn), jax.ShapeDtypeStruct((1, d_attn), jnp.float32), x(16))
  passes = {}
  for e in test_kernels_tpu.pallas_calls(jaxpr.jaxpr, "cpu"):
    body = e.params["jaxpr"]
    loops = list(_tile_loops(body))  # loop launch: one tile per iteration; grid: per step
    per_tile = max(map(_path_tanh, loops)) if loops else _path_tanh(body)
    bq, bk = (blocks.block_q, blocks.block_k) if e.params["name"].endswith("fwd") else (
        blocks.bwd_q, blocks.bwd_k)
    passes[str(e.params["name"]).rsplit("_", 1)[1]] = per_tile / (bq * bk * d_attn)
  return passes


def test_tanh_passes_per_tile(request):
  slices = kernels.BlockSizes(block_q=16, block_k=32, block_d=8)  # 4 slices of d_attn = 32
  one = kernels.BlockSizes(block_q=16, block_k=32, block_d=32)
  # TPU bodies: each slab formed once per kernel (stashed); 2 where the stash does not fit.
  assert _tanh_passes("tpu_interpret", slices) == {"fwd": 1, "dq": 1, "dkv": 1}
  request.getfixturevalue("no_stash")
  assert _tanh_passes("tpu_interpret", slices) == {"fwd": 1, "dq": 2, "dkv": 2}
  # GPU bodies: one slice held in registers (block_d = d_attn); several formed twice.
  assert _tanh_passes("interpret", one) == {"fwd": 1, "dq": 1, "dkv": 1}
  assert _tanh_passes("interpret", slices) == {"fwd": 1, "dq": 2, "dkv": 2}


def _selects(jaxpr):
  """select_n equations (a mask's `where`) in `jaxpr`, nested ones included."""
  return sum(e.primitive.name == "select_n" or
             sum(_selects(getattr(s, "jaxpr", s)) for s in jax.extend.core.jaxprs_in_params(
                 e.params)) for e in jaxpr.eqns)


@pytest.mark.parametrize("target", ["interpret", "tpu_interpret"])
def test_whole_tiles_skip_the_mask(target):
  """Each kernel has a tile path without the mask's `where`s: a loop over whole tiles (GPU
  bodies: forward and dq 1 of 2 loops, dk/dv 1 of 3) or a cond branch (TPU bodies)."""
  blocks = kernels.BlockSizes(block_q=16, block_k=16, block_d=8)
  x = lambda w: jax.ShapeDtypeStruct((1, 48, 1, w), jnp.float32)
  f = lambda qp, kp, w, val: aa.additive_attention(
      qp, kp, w, val, causal=True, implementation="pallas", target=target,
      block_sizes=blocks).sum()
  jaxpr = jax.make_jaxpr(jax.grad(f, argnums=(0, 1, 2, 3)))(
      x(16), x(16), jax.ShapeDtypeStruct((1, 16), jnp.float32), x(16))
  for e in test_kernels_tpu.pallas_calls(jaxpr.jaxpr, "cpu"):
    body = e.params["jaxpr"]
    loops = list(_tile_loops(body))
    if target == "interpret":
      paths = loops
      assert len(loops) == (3 if e.params["name"].endswith("dkv") else 2)
    else:
      paths = [b.jaxpr for c in body.eqns if c.primitive.name == "cond"
               for b in c.params["branches"]]
      paths += [b.jaxpr for p in list(paths) for c in p.eqns if c.primitive.name == "cond"
                for b in c.params["branches"]]
    assert sum(_selects(p) == 0 and _path_tanh(p) > 0 for p in paths) >= 1, e.params["name"]
    assert any(_selects(p) > 0 and _path_tanh(p) > 0 for p in paths), e.params["name"]
