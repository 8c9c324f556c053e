"""Mixed precision (`train.compute_dtype=bfloat16`) and the matmul FLOP count bench_train uses.

bfloat16 rounds only the operands of the model's matmuls (attn.models.layers): parameters,
optimizer state, activations, logits and the loss stay float32; float32 compute runs the same
products as flax's layers. The analytic FLOP count (attn.models.cost) is checked against the
dot_generals of the traced train step.
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from attn import precision
from attn.models import build_model, cost, sequence_loss
from model_configs import model_config
from attn.training import get_task, train_step

BF16, F32 = jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32)
DECODERS = ("none", "bahdanau", "luong")
# Sizes all different so that a transposed matmul fails loudly.
SIZES = dict(src_vocab=23, tgt_vocab=19, emb_dim=8, enc_hidden=12, dec_hidden=10, d_attn=9,
             dropout=0.0)


def _cfg(**kw):
  """The RNN at SIZES; a Transformer (arch="transformer") keeps the vocabularies and dropout."""
  sizes = SIZES if kw.get("arch", "rnn") == "rnn" else dict(src_vocab=23, tgt_vocab=19, dropout=0.0)
  return model_config(**{**sizes, **kw})


def _batch(B=3, Ts=7, Tt=6, src_lengths=(7, 5, 2), tgt_lengths=(6, 4, 3), seed=0):
  rng = np.random.default_rng(seed)
  return {"src": jnp.asarray(rng.integers(3, SIZES["src_vocab"], (B, Ts)), jnp.int32),
          "src_lengths": jnp.asarray(src_lengths, jnp.int32),
          "tgt": jnp.asarray(rng.integers(3, SIZES["tgt_vocab"], (B, Tt)), jnp.int32),
          "tgt_lengths": jnp.asarray(tgt_lengths, jnp.int32)}


def _step(model, tx=None):
  """(the train step to jit, its state) for `model`, label smoothing 0.1."""
  tx = tx or optax.adam(1e-2)
  graphdef, state = nnx.split((model, nnx.Optimizer(model, tx, wrt=nnx.Param)))
  return functools.partial(train_step, get_task("translate"), graphdef, label_smoothing=0.1), state


def _loss(model, batch):
  logits, _ = model(batch)
  total, ntok, _ = sequence_loss(logits, batch["tgt"], batch["tgt_lengths"])
  return total / ntok, logits


_jit_loss = nnx.jit(_loss)


def test_matmul_rounds_operands_and_accumulates_float32_forward_and_backward():
  kx, kw, kg = jax.random.split(jax.random.PRNGKey(0), 3)
  x = jax.random.normal(kx, (2, 5, 24))
  w = jax.random.normal(kw, (24, 7))
  g = jax.random.normal(kg, (2, 5, 7))
  r = lambda a: np.asarray(a.astype(jnp.bfloat16).astype(jnp.float32), np.float64)
  y, vjp = jax.vjp(lambda x, w: precision.matmul(x, w, jnp.bfloat16), x, w)
  dx, dw = vjp(g)
  assert y.dtype == dx.dtype == dw.dtype == F32
  # Exact products of the rounded operands, summed in float32: float32-level agreement.
  np.testing.assert_allclose(y, r(x) @ r(w), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(dx, r(g) @ r(w).T, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(dw, r(x).reshape(-1, 24).T @ r(g).reshape(-1, 7), rtol=1e-5,
                             atol=1e-5)
  # Every product, forward and backward, is bfloat16 x bfloat16 -> float32.
  dots = cost.jaxpr_matmuls(jax.make_jaxpr(jax.grad(
      lambda x, w: jnp.sum(precision.matmul(x, w, jnp.bfloat16) * g), (0, 1)))(x, w))
  assert len(dots) == 3
  assert all((m.lhs.dtype, m.rhs.dtype, m.out.dtype) == (BF16, BF16, F32) for m in dots)


def _compiled_dots(fn, *args):
  """(lhs dtype, lhs contracting dims) of every dot XLA compiled for fn(*args), fusions included."""
  text = jax.jit(fn).lower(*args).compile().as_text()
  dtypes = dict(re.findall(r"%([\w.\-]+) = (\w+)\[", text))
  dtypes.update(re.findall(r"([\w.\-]+): (\w+)\[", text))  # fused computations' parameters
  return [(dtypes.get(lhs), tuple(int(d) for d in dims.split(",")))
          for lhs, dims in re.findall(r" dot\(%([\w.\-]+), .*?lhs_contracting_dims=\{([\d,]*)\}",
                                      text)]


@pytest.mark.parametrize("tied", [False, True])
def test_bfloat16_weight_gradient_reads_a_row_major_input(tied):
  """The weight gradient x^T g is compiled with x^T laid out row-major: no bfloat16 dot contracts
  its left operand's leading axis (XLA:CPU runs that form at about half the rate), also when the
  weight is a transposed embedding (a tied output layer), whose gradient XLA would otherwise
  fold back into a dot reading g column-wise. Values as NumPy's products of rounded operands."""
  kx, kw, kg = jax.random.split(jax.random.PRNGKey(1), 3)
  x, g = jax.random.normal(kx, (4, 6, 24)), jax.random.normal(kg, (4, 6, 10))
  w = jax.random.normal(kw, (10, 24) if tied else (24, 10))
  weight = (lambda w: w.T) if tied else (lambda w: w)
  fn = jax.grad(lambda x, w: jnp.sum(precision.matmul(x, weight(w), jnp.bfloat16) * g), (0, 1))
  dots = _compiled_dots(fn, x, w)
  assert len(dots) == 2 and all(dt == "bf16" for dt, _ in dots), dots  # dx, dw
  assert [dims for _, dims in dots if dims == (0,)] == [], dots
  dx, dw = fn(x, w)
  r = lambda a: np.asarray(a.astype(jnp.bfloat16).astype(jnp.float32), np.float64)
  dw_ref = r(x).reshape(-1, 24).T @ r(g).reshape(-1, 10)
  np.testing.assert_allclose(dw, dw_ref.T if tied else dw_ref, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(dx, r(g) @ r(weight(w)).T, rtol=1e-5, atol=1e-5)


def test_row_major_pins_the_layout_on_cpu_only():
  """The copy is XLA:CPU's fix: lowered for a GPU the backward has no barrier, only the dots."""
  x, w = jnp.ones((6, 24)), jnp.ones((24, 10))
  fn = jax.jit(jax.grad(lambda x, w: jnp.sum(precision.matmul(x, w, jnp.bfloat16)), (0, 1)))
  text = {p: jax.export.export(fn, platforms=[p])(x, w).mlir_module() for p in ("cpu", "cuda")}
  assert "optimization_barrier" in text["cpu"]
  assert "optimization_barrier" not in text["cuda"] and "dot_general" in text["cuda"]


def test_row_major_keeps_values_and_gradients():
  a = jax.random.normal(jax.random.PRNGKey(2), (5, 3, 4))
  np.testing.assert_array_equal(jax.jit(precision.row_major)(a.transpose(2, 0, 1)),
                                a.transpose(2, 0, 1))
  np.testing.assert_array_equal(jax.grad(lambda a: jnp.sum(precision.row_major(a.T) * a.T))(a),
                                2 * a)


def test_float32_compute_matches_flax_linear_forward_and_backward():
  """compute_dtype="float32" builds the model of before (the same parameters, float32 only) with
  every Linear's product through attn.precision.matmul: its logits are bitwise those of flax's
  own dot_general, its gradients equal to float32 rounding."""
  cfg, batch = _cfg(decoder="bahdanau"), _batch()
  ours, theirs = build_model(cfg, seed=3), build_model(cfg, seed=3, compute_dtype="float32")
  linears = [m for _, m in nnx.iter_graph(theirs) if isinstance(m, nnx.Linear)]
  assert len(linears) >= 5 and all(m.dot_general is not jax.lax.dot_general for m in linears)
  for m in linears:
    m.dot_general = jax.lax.dot_general
  jax.tree.map(np.testing.assert_array_equal, nnx.state(ours, nnx.Param),
               nnx.state(theirs, nnx.Param))
  (_, z_ours), (_, z_theirs) = _jit_loss(ours, batch), _jit_loss(theirs, batch)
  np.testing.assert_array_equal(z_ours, z_theirs)
  grad = nnx.jit(nnx.grad(lambda m, b: _loss(m, b)[0]))
  g_ours, g_theirs = grad(ours, batch), grad(theirs, batch)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
               g_ours, g_theirs)
  step, state = _step(ours)
  assert "bf16" not in str(jax.make_jaxpr(step)(state, batch, jax.random.PRNGKey(0)))


@pytest.mark.parametrize("decoder,kw", [("none", {}), ("bahdanau", {}),
                                        ("luong", dict(cell="lstm", dec_layers=2))])
def test_bfloat16_model_has_float32_parameters_and_a_loss_close_to_float32s(decoder, kw):
  cfg, batch = _cfg(decoder=decoder, **kw), _batch()
  m32, m16 = build_model(cfg, seed=1), build_model(cfg, seed=1, compute_dtype="bfloat16")
  p32, p16 = nnx.state(m32, nnx.Param), nnx.state(m16, nnx.Param)
  assert all(p.dtype == F32 for p in jax.tree.leaves(p16))
  jax.tree.map(np.testing.assert_array_equal, p32, p16)  # same draws: the same parameters
  (l32, _), (l16, logits16) = _jit_loss(m32, batch), _jit_loss(m16, batch)
  assert logits16.dtype == F32 and l16.dtype == F32
  np.testing.assert_allclose(l16, l32, rtol=2e-2)


def test_bfloat16_train_step_runs_its_matmuls_in_bfloat16():
  cfg, batch = _cfg(decoder="bahdanau"), _batch()
  step, state = _step(build_model(cfg, seed=0, compute_dtype="bfloat16"))
  dots = cost.jaxpr_matmuls(jax.make_jaxpr(step)(state, batch, jax.random.PRNGKey(0)))
  low = [m for m in dots if (m.lhs.dtype, m.rhs.dtype, m.out.dtype) == (BF16, BF16, F32)]
  assert not [m for m in dots if m.out.dtype == BF16]  # every product accumulates in float32

  def has(K, N, in_scan):  # a forward x [.., K] @ W [K, N] in bfloat16
    return any(m.lhs.shape[-1] == K and m.rhs.shape == (K, N) and bool(m.in_scan) == in_scan
               for m in low)

  D, V, E, He = cfg.rnn.dec_hidden, cfg.tgt_vocab, cfg.rnn.emb_dim, cfg.rnn.enc_out_dim
  assert has(D, V, in_scan=False)  # the output layer, all steps at once
  assert has(D + He + E, D, in_scan=False)  # the deep-output readout
  assert has(E + He, 3 * D, in_scan=True) and has(D, 3 * D, in_scan=True)  # decoder GRU
  # encoder GRU: the input projection over all positions, the recurrent one a step
  H = cfg.rnn.enc_hidden
  assert has(E, 3 * H, in_scan=False) and has(H, 3 * H, in_scan=True)
  # Forward and both backward products of the layers: all but the attention primitives'
  # own small projections (attn.scores) run in bfloat16.
  assert sum(m.flops for m in low) > 0.8 * sum(m.flops for m in dots)


def test_tiny_model_learns_with_bfloat16_and_its_state_stays_float32():
  """Copying a fixed batch: 50 bfloat16 Adam steps take the loss to a fifth of where it began;
  the parameters and the optimizer's moments are float32 throughout."""
  cfg = _cfg(decoder="bahdanau", emb_dim=16, enc_hidden=16, dec_hidden=24, d_attn=16)
  batch = _batch(B=8, Ts=6, Tt=6, src_lengths=[6] * 8, tgt_lengths=[6] * 8, seed=2)
  batch["tgt"] = batch["src"] % SIZES["tgt_vocab"]
  step, state = _step(build_model(cfg, seed=0, compute_dtype="bfloat16"), optax.adam(3e-2))
  # 50 steps in one compiled scan (a scan carry must keep its dtypes: a first check of them).
  state, m = jax.jit(lambda state, b, keys: jax.lax.scan(lambda s, k: step(s, b, k), state, keys))(
      state, batch, jax.random.split(jax.random.PRNGKey(0), 50))
  floats = [x for x in jax.tree.leaves(state) if jnp.issubdtype(x.dtype, jnp.floating)]
  assert floats and all(x.dtype == F32 for x in floats)
  assert m["loss"].dtype == F32
  assert float(m["nll"][-1]) < 0.2 * float(m["nll"][0]), m["nll"]


@pytest.mark.parametrize("decoder", DECODERS)
def test_analytic_flop_count_matches_the_traced_train_step(decoder):
  """attn.models.cost.train_step_flops (backward = 2x forward) against the dot_generals of the
  traced step, scan bodies times their length: within 2% at this small size, ~1% at the
  multi30k preset's (the traced step also recomputes the attention in its backward pass and
  runs the bridge; the analytic count has neither)."""
  cfg = _cfg(decoder=decoder)
  B, Ts, Tt = 4, 9, 7
  batch = _batch(B, Ts, Tt, src_lengths=[Ts] * B, tgt_lengths=[Tt] * B)
  step, state = _step(build_model(cfg))
  counted = cost.jaxpr_flops(step, state, batch, jax.random.PRNGKey(0))
  assert cost.train_step_flops(cfg, B, Ts, Tt) == pytest.approx(counted, rel=0.02)


@pytest.mark.parametrize("score", ["scaled_dot", "general", "additive"])
def test_analytic_transformer_flop_count_matches_the_traced_train_step(score):
  """The Transformer's count (every layer's projections, the scores and weighted sums over the
  padded grid, feed-forward, output layer) against the traced step's dot_generals."""
  from attn.models.config import AttentionRole
  role = AttentionRole(score=score)
  cfg = _cfg(arch="transformer", d_model=12, num_heads=3, d_ff=20, enc_layers=2, dec_layers=1,
             enc_self=role, dec_self=role, cross=role)
  B, Ts, Tt = 4, 9, 7
  batch = _batch(B, Ts, Tt, src_lengths=[Ts] * B, tgt_lengths=[Tt] * B)
  step, state = _step(build_model(cfg))
  counted = cost.jaxpr_flops(step, state, batch, jax.random.PRNGKey(0))
  if score == "additive":  # its per-pair add and tanh (2 d_attn) are counted, but are no matmul
    pairs = cfg.enc_layers * Ts * Ts + cfg.dec_layers * (Tt * Tt + Tt * Ts)
    counted += 3 * B * pairs * cfg.transformer.num_heads * 2 * cfg.transformer.d_head
  assert cost.train_step_flops(cfg, B, Ts, Tt) == counted
  # The output layer reads d_model (not the recurrent decoder's dec_hidden): fwd + 2x bwd.
  assert cost.output_layer_flops(cfg, B, Tt) == 3 * 2 * B * Tt * 12 * SIZES["tgt_vocab"]
  with pytest.raises(ValueError, match="enc_self.scope='window'"):
    windowed = cfg.replace_paths({"transformer.enc_self": AttentionRole(scope="window",
                                                                        half_width=2)})
    cost.train_step_flops(windowed, B, Ts, Tt)


@pytest.mark.parametrize("arch", ["rnn", "transformer"])
def test_work_per_target_token_with_and_without_padding(arch):
  """plan_flops_per_token and unpadded_flops_per_token against direct sums over the examples
  and batches (train_step_flops of each), and their known relations: equal when no slot is
  padding, the padded plan costlier otherwise, a filler row counting work but no tokens."""
  cfg = _cfg(arch=arch) if arch == "rnn" else _cfg(arch=arch, d_model=12, num_heads=3, d_ff=20)
  src, tgt = np.array([5, 5, 5, 5]), np.array([4, 4, 4, 4])
  full = [(5, 4, np.array([0, 1])), (5, 4, np.array([2, 3]))]
  per_token = cost.train_step_flops(cfg, 1, 5, 4) / 4
  assert cost.unpadded_flops_per_token(cfg, src, tgt) == pytest.approx(per_token, rel=1e-12)
  assert cost.plan_flops_per_token(cfg, full, tgt) == pytest.approx(per_token, rel=1e-12)

  src, tgt = np.array([3, 9, 4, 9, 2]), np.array([2, 7, 5, 7, 1])
  naive = sum(cost.train_step_flops(cfg, 1, int(a), int(b)) for a, b in zip(src, tgt)) / tgt.sum()
  assert cost.unpadded_flops_per_token(cfg, src, tgt) == pytest.approx(naive, rel=1e-12)
  plan = [(9, 7, np.array([1, 0, 2])), (9, 7, np.array([3, 4, -1]))]
  padded = 2 * cost.train_step_flops(cfg, 3, 9, 7) / tgt.sum()
  assert cost.plan_flops_per_token(cfg, plan, tgt) == pytest.approx(padded, rel=1e-12)
  assert padded > naive


def test_jaxpr_matmuls_multiplies_scan_bodies_and_refuses_while_loops():
  w = jnp.ones((4, 6))
  scanned = lambda x: jax.lax.scan(lambda c, xi: (c + xi @ w, None), jnp.zeros(6), x)[0]
  assert cost.jaxpr_flops(scanned, jnp.ones((5, 4))) == 5 * 2 * 4 * 6
  looped = lambda x: jax.lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] @ w @ w.T),
                                        (0, x))[1]
  with pytest.raises(ValueError, match="trip count"):
    cost.jaxpr_flops(looped, jnp.ones((4,)))


@pytest.mark.slow
def test_bench_train_runs_on_the_smoke_preset(tmp_path):
  """experiments/bench_train.py end to end on the tiny built-in task: both dtypes, one round."""
  import os
  import subprocess
  import sys
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.bench_train",
       "--config=experiments/configs/translate.py:smoke", "--steps=2", "--rounds=1",
       "--compute_dtypes=float32,bfloat16", "--ceiling_sizes=64", f"--workdir={tmp_path}"],
      cwd=root, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "| float32 |" in proc.stdout and "| bfloat16 |" in proc.stdout
  assert "counted on the traced step" in proc.stdout and "load average" in proc.stdout
  assert "with no padding" in proc.stdout and "tokens/s at the ceiling" in proc.stdout
