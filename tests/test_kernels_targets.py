"""The registry of kernel targets (`kernels.targets`): tiles and launch come from the same target,
the one of the platform lowered for (not the host's backend); a target added from one place runs;
what a target cannot run is a one-line ValueError.
"""

from __future__ import annotations

import collections
import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernels
from kernels import additive as aa
from kernels import flash_attention as fa
from kernels.targets import TARGETS, Target
from tests import kernel_cases as kc
from tests.test_kernels_tpu import pallas_calls

TRITON_CALL = "__gpu$xla.gpu.triton"
B, T, H, D = 2, 600, 2, 64  # T padded to 640 by the Triton tiles (128), to 1024 by the TPU's (512)


def _export(f, platform, *args):
  checks = [jax.export.DisabledSafetyCheck.custom_call(TRITON_CALL)]
  return jax.export.export(jax.jit(f), platforms=[platform], disabled_checks=checks)(*args)


def _padded_lengths(text):
  """{T: count} of the [B, H, T, D] and [B, T, H, D] bfloat16 arrays in a lowered module (the
  kernels' operands, head-major on the TPU, token-major on the GPU)."""
  return collections.Counter(int(t) for pattern in (rf"{B}x{H}x(\d+)x{D}", rf"{B}x(\d+)x{H}x{D}")
                             for t in re.findall(rf"tensor<{pattern}xbf16>", text))


@pytest.mark.parametrize("platform,target", [("cuda", "triton"), ("tpu", "tpu")])
def test_lowering_for_a_platform_from_this_host_uses_its_targets_tiles(platform, target):
  """A CPU host exporting for CUDA / TPU: the kernels' operands are padded to that target's tiles
  and each pallas_call's blocks are its tiles (the host's backend used to choose the tiles)."""
  x = jax.ShapeDtypeStruct((B, T, H, D), jnp.bfloat16)
  f = lambda q, k, v: fa.attention(q, k, v, implementation="pallas", interpret=False)
  tiles = TARGETS.get(target).tiles("flash_attention")
  T_p = -(-T // max(tiles.block_q, tiles.bwd_q)) * max(tiles.block_q, tiles.bwd_q)
  lengths = _padded_lengths(_export(f, platform, x, x, x).mlir_module())
  assert set(lengths) == {T, T_p}, lengths
  (fwd,) = pallas_calls(jax.make_jaxpr(f)(x, x, x).jaxpr, platform)
  q_block = fwd.params["grid_mapping"].block_mappings[0].transformed_block_aval.shape
  assert q_block[-2] == tiles.block_q, (platform, q_block)


@pytest.mark.parametrize("platform,target", [("cuda", "triton"), ("tpu", "tpu")])
def test_additive_tiles_follow_the_platform(platform, target):
  """The additive kernel's d_attn slice follows too: the forward's static block_d is the
  target's, in the target's tanh tile layout ([bq, bk, block_d] on Triton, [block_d, bq, bk]
  with the keys on the lanes on TPU)."""
  q = jax.ShapeDtypeStruct((B, 64, H, 256), jnp.float32)
  w = jax.ShapeDtypeStruct((H, 256), jnp.float32)
  f = lambda q, w: aa.additive_attention(q, q, w, q, implementation="pallas", interpret=False)
  (fwd,) = pallas_calls(jax.make_jaxpr(f)(q, w).jaxpr, platform)
  text = str(fwd.params["jaxpr"])
  block_d = TARGETS.get(target).tiles("additive_attention").block_d
  tile = (rf"f32\[\d+,\d+,{block_d}\]" if platform == "cuda" else rf"f32\[{block_d},\d+,\d+\]")
  assert re.search(tile, text), (platform, block_d)
  _export(f, platform, q, w)  # and it lowers


# ----------------------------------------------------------------------------------------------
# A target added from this file alone.


@pytest.fixture
def toy_targets():
  """Two throwaway targets: the blocked path with other tiles, the interpreter with other tiles."""
  small = kernels.BlockSizes(block_q=16, block_k=32)
  blocked = dataclasses.replace(TARGETS.get("cpu_blocked"), name="toy_blocked",
                                blocks={"flash_attention": small, "additive_attention": small})
  interp = dataclasses.replace(TARGETS.get("interpret"), name="toy_interpret",
                               blocks={"flash_attention": small})
  for t in (blocked, interp):
    TARGETS.add(t)
  yield blocked, interp
  for t in (blocked, interp):
    TARGETS.remove(t.name)


CASE = kc.Case("toy", B=2, Tq=37, Tk=45, H=2, d=16, dv=24, causal=True, key_lengths=(45, 20),
               query_lengths=(37, 30))


@pytest.mark.parametrize("name", ["toy_blocked", "toy_interpret"])
def test_a_target_registered_in_one_place_runs_attention(toy_targets, name):
  del toy_targets
  q, k, v, kl, ql = kc.dot_inputs(CASE, jnp.float32)
  cts = kc.cotangents(CASE)
  ref = kc.np_attention(q, k, v, kl, ql, CASE.causal, CASE.d ** -0.5, *cts)
  run = lambda q, k, v: fa.attention_with_lse(q, k, v, key_lengths=kl, query_lengths=ql,
                                              causal=CASE.causal, target=name)
  naive = lambda q, k, v: fa.attention_with_lse(q, k, v, key_lengths=kl, query_lengths=ql,
                                                causal=CASE.causal, implementation="xla")
  got = (*run(q, k, v), *kc.loss_and_grads(run, (q, k, v), *cts))
  dense = (*naive(q, k, v), *kc.loss_and_grads(naive, (q, k, v), *cts))
  for what, g, n, r in zip(("out", "lse", "dq", "dk", "dv"), got, dense, ref):
    kc.assert_as_close_as_naive(g, n, r, jnp.float32, what)


def test_a_registered_targets_tiles_are_the_ones_used(toy_targets, monkeypatch):
  """The toy blocked target's 16 x 32 tiles reach the blocked path."""
  del toy_targets
  seen = []
  real = kernels._common.blocked_attention
  monkeypatch.setattr(kernels._common, "blocked_attention",
                      lambda *a, **kw: seen.append((kw["block_q"], kw["block_k"])) or real(*a, **kw))
  q = jnp.ones((1, 40, 1, 16))
  fa.attention(q, q, q, target="toy_blocked")
  assert seen == [(16, 32)]


# ----------------------------------------------------------------------------------------------
# The registry's refusals.


def test_duplicate_and_unknown_targets_are_refused():
  with pytest.raises(ValueError, match="^target 'triton' is already registered"):
    TARGETS.add(Target(name="triton", implementation="pallas", blocks={}))
  with pytest.raises(ValueError, match=r"^unknown target 'cuda'; known: auto, triton, interpret"):
    TARGETS.get("cuda")


@pytest.mark.parametrize("kwargs,match", [
    (dict(target="cpu_blocked", implementation="pallas"),
     r"^target 'cpu_blocked' runs implementation='blocked', not 'pallas'\n"),
    (dict(target="triton", implementation="xla"), r"^implementation='xla' is the dense reference"),
    (dict(target="interpret", block_sizes=None, d=512),
     r"^the flash_attention Pallas kernel supports head dims up to 256, got d=512"),
])
def test_what_a_target_cannot_run_is_one_line(kwargs, match):
  d = kwargs.pop("d", 16)
  q = jnp.zeros((1, 8, 1, d))
  with pytest.raises(ValueError, match=match):
    fa.attention(q, q, q, **kwargs)


def test_every_target_names_its_tiles_for_the_kernels_it_runs():
  for t in TARGETS.values():
    assert t.blocks and all(isinstance(b, kernels.BlockSizes) for b in t.blocks.values()), t.name
    assert t.summary, t.name
    assert t.interpreted is None or t.interpreted in TARGETS.names(), t.name
  assert set(TARGETS.auto("pallas")) == {"cuda", "rocm", "tpu"}
  np.testing.assert_equal(TARGETS.get("tpu").tiles("flash_attention").block_q, 512)


# ----------------------------------------------------------------------------------------------
# A model selects a target through `fused` (True = "auto").


def test_attend_and_multihead_run_the_named_target(toy_targets, monkeypatch):
  import attn  # pylint: disable=import-outside-toplevel
  del toy_targets
  seen = []
  real = kernels._common.blocked_attention
  monkeypatch.setattr(kernels._common, "blocked_attention",
                      lambda *a, **kw: seen.append(kw["block_q"]) or real(*a, **kw))
  q = jax.random.normal(jax.random.PRNGKey(0), (2, 40, 16))
  ref, _ = attn.attend(None, q, q, q, score="scaled_dot")
  got, w = attn.attend(None, q, q, q, score="scaled_dot", fused="toy_blocked")
  assert w is None and seen == [16]
  np.testing.assert_allclose(got, ref, atol=1e-5)
  params = attn.init_multihead(jax.random.PRNGKey(1), 16, num_heads=2)
  a, _ = attn.multihead(params, q, num_heads=2, fused=True)
  b, _ = attn.multihead(params, q, num_heads=2, fused="toy_blocked")
  np.testing.assert_allclose(a, b, atol=1e-5)
  assert seen == [16, 512, 16]  # True: "auto", here cpu_blocked's tiles


def test_model_fused_takes_true_false_or_a_target_name():
  from attn.errors import ConfigError  # pylint: disable=import-outside-toplevel
  from attn.models.config import ModelConfig  # pylint: disable=import-outside-toplevel
  for fused in (True, False, "auto", "triton", "cpu_blocked"):
    assert ModelConfig(src_vocab=5, tgt_vocab=5, arch="transformer", fused=fused).fused == fused
  with pytest.raises(ConfigError, match=r"^unknown model.fused 'cuda'; known: auto, "):
    ModelConfig(src_vocab=5, tgt_vocab=5, arch="transformer", fused="cuda")
