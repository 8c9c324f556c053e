"""The Mosaic GPU forward of the dot-product kernel (targets "mosaic_gpu", pipelined, and
"mosaic_gpu_ws", warp-specialized): cross-lowered for CUDA on any host, and run in JAX's Mosaic
GPU interpreter against the float64 reference.

Lowering: `jax.export` for "cuda" runs the whole Mosaic GPU lowering (layouts, WGMMA operand
checks, the kernel's shared-memory total against the 227 KiB of an H100/H200) without a device.
Each case checks the module holds exactly one `mosaic_gpu_v2` call for the forward, named after
its schedule (not a silent fallback to Triton or XLA) and, with the backward, the two Triton
launches that consume its residuals. The shared-memory figure is the one the Mosaic GPU lowering
computes for the launch, and `fm.smem_bytes` must equal it. The GPU path's in-place accumulation
(`pl.run_state`), exp2 and approximate math are read from the kernel's jaxpr. The ptxas guard is
checked with the CUDA version patched in (`fm.cuda_runtime_version`).
Values: interpret mode runs each schedule's copies, barriers (three warpgroups as threads for
"mosaic_gpu_ws"), pipeline, masks and softmax in the Mosaic GPU interpreter (the matrix products
as dot_general: see kernels/flash_attention_mgpu.py), with the tolerance rule of
tests/kernel_cases.py; the backward is the Triton kernels' interpret mode. Each value case takes
~2-5 s on 2 cores: the interpreter runs every kernel operation through a host callback, and the
cases need four key tiles (pipeline refills, masked and unmasked tiles) to cover the kernel.
"""

import logging
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.mosaic.gpu import core as mosaic_gpu_core

import kernel_cases as kc
import kernels
from kernel_cases import Case
from kernels import flash_attention as fa
from kernels import flash_attention_mgpu as fm

MOSAIC_CALL = "mosaic_gpu_v2"
TRITON_CALL = "__gpu$xla.gpu.triton"
CALL_RE = re.compile(r"stablehlo\.custom_call @(\S+?)\(")
SMEM_LIMIT = fm.SMEM_LIMIT  # H100/H200: 227 KiB per thread block
B, H, T = 2, 2, 200  # odd length, several query tiles and key tiles
SCHEDULES = {"mosaic_gpu": "pipelined", "mosaic_gpu_ws": "warp_specialized"}  # target -> schedule

# target, dtype, head dim, causal and padded (both only change in-kernel masks and loop bounds).
CASES = [(t, dt, d, masked) for t in SCHEDULES for dt in (jnp.bfloat16, jnp.float16)
         for d in (64, 128) for masked in (True, False)]


def _attend(masked, target="mosaic_gpu", **kw):
  kw = dict(causal=masked, implementation="pallas", interpret=False, target=target, **kw)
  return lambda q, k, v, kl, ql: kernels.attention(q, k, v, key_lengths=kl, query_lengths=ql,
                                                   **kw)


def _export(dtype, d, masked, backward=False, **kw):
  x = lambda *shape, dt=dtype: jax.ShapeDtypeStruct(shape, dt)
  lens = x(B, dt=jnp.int32) if masked else None
  f = attend = _attend(masked, **kw)
  if backward:  # the Mosaic GPU forward, then the Triton dq and dk/dv kernels
    f = jax.grad(lambda *a: jnp.sum(attend(*a).astype(jnp.float32)), argnums=(0, 1, 2))
  checks = [jax.export.DisabledSafetyCheck.custom_call(c) for c in (TRITON_CALL, MOSAIC_CALL)]
  return jax.export.export(jax.jit(f), platforms=["cuda"], disabled_checks=checks)(
      x(B, T, H, d), x(B, T, H, d), x(B, T, H, d), lens, lens).mlir_module()


def _launches(text):
  """(custom calls, Mosaic GPU kernel names, Triton kernel names) of a lowered module."""
  return (CALL_RE.findall(text), re.findall(r"(flash_attention_fwd_mgpu\w*)_mosaic_gpu\b", text),
          sorted(re.findall(r'name = "(\w+)", num_stages', text)))


@pytest.fixture
def smem_figures(monkeypatch):
  """The shared-memory bytes the Mosaic GPU lowering computes for each launch, as it lowers."""
  figures, real = [], mosaic_gpu_core._smem_tree_size
  monkeypatch.setattr(mosaic_gpu_core, "_smem_tree_size",
                      lambda tree: figures.append(real(tree)) or figures[-1])
  return figures


@pytest.mark.parametrize("target,dtype,d,masked", CASES, ids=[
    f"{t}-{jnp.dtype(dt).name}-d{d}-{'causal_padded' if m else 'full'}" for t, dt, d, m in CASES])
def test_forward_lowers_to_mosaic_gpu(target, dtype, d, masked, smem_figures):
  """The default key tile (128) fits at d <= 128; the figure is the lowering's own."""
  calls, mosaic, triton = _launches(_export(dtype, d, masked, target=target))
  name = "flash_attention_fwd_mgpu" + ("_ws" if target == "mosaic_gpu_ws" else "")
  assert (calls, mosaic, triton) == ([MOSAIC_CALL], [name], [])
  assert smem_figures == [fm.smem_bytes(d, d, 128, dtype, SCHEDULES[target])]
  assert smem_figures[0] <= SMEM_LIMIT


# schedule, head dim -> the key tiles that fit 227 KiB (two slots of k and v, q per warpgroup).
LEGAL = {("pipelined", 64): (64, 128, 256), ("pipelined", 128): (64, 128),
         ("pipelined", 256): (64,), ("warp_specialized", 64): (64, 128, 256),
         ("warp_specialized", 128): (64, 128), ("warp_specialized", 256): (64,)}


@pytest.mark.parametrize("schedule,d", list(LEGAL), ids=[f"{s}-d{d}" for s, d in LEGAL])
def test_each_legal_key_tile_lowers_and_the_next_one_does_not_fit(schedule, d, smem_figures):
  """The legal key tiles come from the shared-memory figure; each lowers with exactly that
  figure, and asking for 256 where it does not fit gets the largest tile that does."""
  legal = fm.legal_block_ks(d, d, jnp.bfloat16, schedule)
  assert legal == LEGAL[schedule, d]
  if legal[-1] < fm.BLOCK_KS[-1]:
    assert fm.smem_bytes(d, d, 2 * legal[-1], jnp.bfloat16, schedule) > SMEM_LIMIT
  target = {v: k for k, v in SCHEDULES.items()}[schedule]
  for block_k in sorted({*legal, 256}):
    assert _launches(_export(jnp.bfloat16, d, True, target=target, block_k=block_k))[0] == [
        MOSAIC_CALL]
  want = [fm.smem_bytes(d, d, bk, jnp.bfloat16, schedule) for bk in legal]
  assert smem_figures == want + ([want[-1]] if 256 not in legal else [])
  assert max(smem_figures) <= SMEM_LIMIT


def test_smem_figures_pinned():
  """The largest programs the defaults make, pinned so a layout change shows up here: q is the
  output tile when dv_p = d_p; buffers are 1 KiB-aligned (the lse row takes a whole KiB)."""
  assert fm.smem_bytes(128, 128, 128, jnp.bfloat16) == 150568  # 147 KiB
  assert fm.smem_bytes(128, 128, 128, jnp.bfloat16, "warp_specialized") == 167000  # 163 KiB
  assert fm.smem_bytes(256, 256, 64, jnp.bfloat16, "warp_specialized") == 199768  # 195 KiB
  assert fm.smem_bytes(64, 96, 128, jnp.float16) - fm.smem_bytes(64, 64, 128, jnp.float16) == (
      64 * 128 * 2 + 2 * 128 * 64 * 2)  # a separate [64, 128] output tile and wider v slots


@pytest.mark.parametrize("target", list(SCHEDULES))
def test_forward_and_backward_lower_mosaic_then_triton(target):
  calls, mosaic, triton = _launches(_export(jnp.bfloat16, 128, True, backward=True,
                                            target=target))
  assert sorted(calls) == sorted([MOSAIC_CALL] + [TRITON_CALL] * 2)
  assert triton == ["flash_attention_dkdv", "flash_attention_dq"]


def test_float32_keeps_the_triton_forward():
  """WGMMA would take float32 as tf32 (10 mantissa bits): float32 stays on Triton."""
  assert _launches(_export(jnp.float32, 64, True)) == ([TRITON_CALL], [], ["flash_attention_fwd"])


def test_the_triton_forward_gets_the_triton_tiles():
  """The Mosaic targets' forward tiles (128/128) are the Mosaic forward's; where the Triton
  forward runs instead it gets at most the Triton target's (128/64; float32 at d = 256 would
  not fit 128-key tiles), and the backward tiles stay as they were."""
  from kernels import _skeleton
  from kernels.targets import TARGETS, mosaic_gpu
  target = TARGETS.get("mosaic_gpu")
  seen = []
  run = mosaic_gpu._triton_tiles(lambda *a: seen.append(a[-1].blocks))
  run(*[None] * 6, _skeleton.Config(causal=False, blocks=target.tiles("flash_attention"),
                                    target=target))
  assert target.tiles("flash_attention").block_k == 128
  assert [(b.block_q, b.block_k, b.bwd_q, b.bwd_k) for b in seen] == [(128, 64, 64, 64)]


def test_the_gpu_path_accumulates_in_place_in_base_2():
  """PV accumulates into the rescaled accumulator (`pl.run_state` over a WGMMA accumulator),
  exponentials are exp2 (no natural exp) and the launch allows approximate math."""
  x = jax.ShapeDtypeStruct((1, 1, 128, 256), jnp.bfloat16)
  n = jax.ShapeDtypeStruct((1,), jnp.int32)
  for schedule in ("pipelined", "warp_specialized"):
    jaxpr = str(jax.make_jaxpr(lambda q, k, v, kl, ql: fm.mosaic_forward(
        q, k, v, kl, ql, scale=0.1, causal=True, block_k=64, schedule=schedule))(x, x, x, n, n))
    assert jaxpr.count("run_state") == 2, schedule  # unmasked and masked tiles
    ops = re.findall(r"= (exp2?|log)\b", jaxpr)
    assert "exp" not in ops and ops.count("exp2") == 4 and ops.count("log") == 1, ops
    assert "approx_math=True" in jaxpr


# ----------------------------------------------------------------------------------------------
# CUDA 12.8.0-12.9.0: ptxas miscompiles the causal mask (JAX's attention_mgpu refuses causal).


def test_the_ptxas_range_is_jaxs():
  bad = fm.ptxas_miscompiles_causal
  assert [bad(v) for v in (12080, 12090)] == [True, True]
  assert [bad(v) for v in (None, 12060, 12091, 13000)] == [False] * 4


@pytest.mark.parametrize("version,causal,runs", [
    (12080, True, "triton"), (12090, True, "triton"), (12080, False, "mosaic"),
    (13000, True, "mosaic"), (None, True, "mosaic")])
def test_causal_under_a_bad_ptxas_runs_the_triton_forward(monkeypatch, caplog, version, causal,
                                                          runs):
  monkeypatch.setattr(fm, "cuda_runtime_version", lambda: version)
  fm._log_causal_fallback.cache_clear()
  jax.clear_caches()  # the guard runs when the forward is traced; kernels' jits cache traces
  with caplog.at_level(logging.WARNING, logger=fm.__name__):
    texts = [_export(jnp.bfloat16, 64, causal, target=t) for t in SCHEDULES]
  for text, target in zip(texts, SCHEDULES):
    calls, mosaic, triton = _launches(text)
    if runs == "triton":
      assert (calls, mosaic, triton) == ([TRITON_CALL], [], ["flash_attention_fwd"])
    else:
      assert calls == [MOSAIC_CALL] and len(mosaic) == 1, (target, calls)
  lines = [r.getMessage() for r in caplog.records]
  if runs == "triton":  # once per process, not once per trace
    assert lines == [f"Mosaic GPU attention: causal masking runs the Triton forward under CUDA "
                     f"12.{version % 1000 // 10} (runtime {version}): ptxas 12.8.0-12.9.0 "
                     f"miscompiles the causal mask"]
  else:
    assert lines == []
  jax.clear_caches()  # leave no trace made under a patched version to the other tests


def test_the_interpreter_ignores_the_ptxas_guard(monkeypatch):
  """There is no ptxas in interpret mode: the Mosaic kernel runs whatever the CUDA."""
  monkeypatch.setattr(fm, "cuda_runtime_version", lambda: 12080)
  calls = []
  real = fm.mosaic_forward
  monkeypatch.setattr(fm, "mosaic_forward", lambda *a, **kw: calls.append(kw) or real(*a, **kw))
  q = jnp.ones((1, 20, 1, 64), jnp.bfloat16)
  fa.attention(q, q, q, causal=True, implementation="pallas", interpret=True, target="mosaic_gpu")
  assert len(calls) == 1


def test_other_platforms_get_their_own_target():
  """The target names what runs: "mosaic_gpu" is compiled for CUDA only, so lowering it for a
  TPU is refused, while target "auto" lowers the Mosaic TPU kernels there."""
  x = jax.ShapeDtypeStruct((1, 64, 1, 64), jnp.bfloat16)
  with pytest.raises(Exception, match="tpu"):
    jax.export.export(jax.jit(_attend(False)), platforms=["tpu"])(x, x, x, None, None)
  auto = lambda q, k, v: kernels.attention(q, k, v, implementation="pallas", interpret=False)
  text = jax.export.export(jax.jit(auto), platforms=["tpu"])(x, x, x)
  assert CALL_RE.findall(text.mlir_module()) == ["tpu_custom_call"]


def test_unknown_target_is_refused():
  q = jnp.zeros((1, 8, 1, 16), jnp.bfloat16)
  with pytest.raises(ValueError, match=r"^unknown target 'cutlass'; known: auto, triton, "):
    kernels.attention(q, q, q, implementation="pallas", target="cutlass")


def test_the_additive_kernel_has_no_mosaic_gpu_target():
  q, w = jnp.zeros((1, 8, 1, 16), jnp.bfloat16), jnp.zeros((1, 16), jnp.bfloat16)
  with pytest.raises(ValueError, match=r"^target 'mosaic_gpu' does not run the additive_attention"):
    kernels.additive_attention(q, q, w, q, target="mosaic_gpu", interpret=False)


# ----------------------------------------------------------------------------------------------
# Values in the Mosaic GPU interpreter.

VALUE_CASES = [
    # Odd lengths over one 64-row tile, Tq < Tk, a batch row with no keys; four key tiles, so
    # both pipeline slots are refilled, three of them unmasked for the first query tile; a value
    # dim whose padded width (128) is not d's, so the output tile is not q's.
    (Case("cross_padded", B=2, Tq=70, Tk=201, H=1, d=64, dv=96, causal=False,
          key_lengths=(201, 0)), jnp.bfloat16),
    # Causal, padded queries, head dim 128 and a value dim that is not (padded to 64 multiples
    # inside); the second query tile sees its first key tile whole (unmasked). Warp-specialized:
    # the two compute warpgroups need different numbers of key tiles (the one with fewer passes
    # through the rest), and one has only padding rows.
    (Case("causal_d128", B=1, Tq=150, Tk=150, H=1, d=128, dv=80, causal=True,
          key_lengths=(150,), query_lengths=(140,)), jnp.float16),
]
VALUE_PARAMS = [(t, c, dt) for t in SCHEDULES for c, dt in VALUE_CASES]


def _run(case, q, k, v, kl, ql, target, implementation="pallas", **kw):
  return fa.attention_with_lse(q, k, v, key_lengths=kl, query_lengths=ql, causal=case.causal,
                               implementation=implementation, interpret=True,
                               target=target, **kw)


# JAX's Mosaic GPU interpreter runs each warpgroup's program from its own thread, but XLA:CPU may
# run a program on its pool (one thread per CPU), and a warpgroup waiting at a barrier holds the
# thread it runs on. The three warpgroups of "mosaic_gpu_ws" and the launch's own callback can so
# hold four pool threads at once: with fewer CPUs the interpreter can deadlock (it hung the suite
# once on 2 cores; on 1 core it always does). Those cases run where XLA has four threads or more.
_POOL_THREADS_FOR_WARPGROUPS = 4


def _skip_where_the_interpreter_can_deadlock(target):
  cpus = len(os.sched_getaffinity(0))
  if SCHEDULES[target] == "warp_specialized" and cpus < _POOL_THREADS_FOR_WARPGROUPS:
    pytest.skip(f"the Mosaic GPU interpreter can deadlock running three warpgroups on {cpus} "
                f"CPU(s); it needs {_POOL_THREADS_FOR_WARPGROUPS} (tests/test_kernels_mgpu.py)")


def _check_values(case, dtype, target, **kw):
  """out, lse and every gradient against float64 (rule of kernel_cases); empty rows exact."""
  _skip_where_the_interpreter_can_deadlock(target)
  q, k, v, kl, ql = kc.dot_inputs(case, dtype)
  cts = kc.cotangents(case)
  ref = kc.np_attention(q, k, v, kl, ql, case.causal, case.d ** -0.5, *cts)
  got_fn = lambda q, k, v: _run(case, q, k, v, kl, ql, target, **kw)
  naive_fn = lambda q, k, v: _run(case, q, k, v, kl, ql, "auto", implementation="xla")
  got = (*got_fn(q, k, v), *kc.loss_and_grads(got_fn, (q, k, v), *cts))
  naive = (*naive_fn(q, k, v), *kc.loss_and_grads(naive_fn, (q, k, v), *cts))
  for name, g, n, r in zip(("out", "lse", "dq", "dk", "dv"), got, naive, ref):
    kc.assert_as_close_as_naive(g, n, r, dtype, name)
  empty = np.isneginf(ref[1])  # rows with no visible key: exactly zero, lse -inf
  assert empty.any()
  np.testing.assert_array_equal(np.asarray(got[0], np.float32)[empty], 0.0)
  assert np.all(np.isneginf(np.asarray(got[1])[empty]))


@pytest.mark.parametrize("target,case,dtype", VALUE_PARAMS,
                         ids=[f"{t}-{c}-{jnp.dtype(d).name}" for t, c, d in VALUE_PARAMS])
def test_interpreted_forward_and_gradients_match_float64(target, case, dtype):
  """out, lse and every gradient (Triton backward on the Mosaic forward's residuals)."""
  _check_values(case, dtype, target)


def test_interpreted_warp_specialized_128_key_tiles(monkeypatch):
  """block_k = 128 (the compiled default): fewer, wider tiles through the same barriers."""
  tiles = []
  real = fm.mosaic_forward
  monkeypatch.setattr(fm, "mosaic_forward",
                      lambda *a, **kw: tiles.append(kw["block_k"]) or real(*a, **kw))
  case = Case("causal_two_programs", B=1, Tq=200, Tk=260, H=1, d=64, dv=64, causal=True,
              key_lengths=(250,), query_lengths=(190,))
  _check_values(case, jnp.bfloat16, "mosaic_gpu_ws", block_k=128)
  assert set(tiles) == {128}


@pytest.mark.parametrize("target", list(SCHEDULES))
def test_interpreted_kernel_is_the_mosaic_one(monkeypatch, target):
  """The "mosaic_gpu" targets in interpret mode run the Mosaic GPU kernel of their schedule,
  not the Triton one. Traced only (the values are the tests above)."""
  calls = []
  real = fm.mosaic_forward
  monkeypatch.setattr(fm, "mosaic_forward", lambda *a, **kw: calls.append(kw) or real(*a, **kw))
  q = jnp.ones((1, 20, 1, 64), jnp.bfloat16)
  jax.eval_shape(lambda q: fa.attention(q, q, q, implementation="pallas", interpret=True,
                                        target=target), q)
  assert [(c["interpret"], c["schedule"]) for c in calls] == [(True, SCHEDULES[target])]


def test_gpu_check_times_and_checks_every_mosaic_variant(monkeypatch):
  """experiments/gpu_check.py's Hopper runs name registered targets and legal key tiles, and
  its speed table has a peer per schedule: the day a GPU is lent they run side by side."""
  from attn.benchmarks import kernel_impls
  from experiments import gpu_check
  from kernels.targets import TARGETS
  monkeypatch.setattr(gpu_check, "_hopper", lambda: True)
  runs = {name for name, _, _ in gpu_check._cases(dry_run=False)}
  assert {"dot_mosaic", *gpu_check.MOSAIC_VARIANTS} <= runs
  targets = {opts["target"] for _, opts in gpu_check.MOSAIC_VARIANTS.values()}
  assert targets == {"mosaic_gpu_ws"} and all(TARGETS.get(t) for t in targets)
  assert {opts.get("block_k", 128) for _, opts in gpu_check.MOSAIC_VARIANTS.values()} == set(
      fm.BLOCK_KS)
  peers = set(kernel_impls.KERNELS.get("dot").impls)
  assert {"pallas_mosaic", *gpu_check.HOPPER_PEERS} <= peers
