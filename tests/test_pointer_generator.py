"""The pointer-generator's mixed distribution and the coverage mechanism (See et al. 2017): against
float64 NumPy, hand-computed cases, and the model's own step-by-step decoding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attn.models import build_model, copying
from model_configs import model_config
from attn.apps.summarize.task import SummarizationTask, repeated_ngram_rate

V = 11


def _np_extended(logits, z, weights, src_ext):
  """float64 reference: p_gen softmax(logits) on [0, V), plus (1 - p_gen) attention per id."""
  logits, weights = np.asarray(logits, np.float64), np.asarray(weights, np.float64)
  B, Vv = logits.shape
  p = 1 / (1 + np.exp(-np.asarray(z, np.float64)))
  soft = np.exp(logits - logits.max(-1, keepdims=True))
  soft /= soft.sum(-1, keepdims=True)
  out = np.zeros((B, Vv + weights.shape[-1]))
  out[:, :Vv] = p[:, None] * soft
  for b in range(B):
    for i, w in zip(np.asarray(src_ext[b]), weights[b]):
      out[b, i] += (1 - p[b]) * w
  return out


def _inputs(B=4, Ts=6, seed=0):
  rng = np.random.default_rng(seed)
  logits = rng.normal(size=(B, V)).astype(np.float32) * 3
  z = rng.normal(size=(B,)).astype(np.float32) * 2
  w = rng.random((B, Ts)).astype(np.float32)
  w[:, -1] = 0.0  # a padded position
  w /= w.sum(-1, keepdims=True)
  # In-vocabulary ids (some repeated), and source OOVs V, V + 1 (V repeated).
  src_ext = np.array([[4, 5, V, 4, V + 1, 0]] * B, np.int32)
  return logits, z, w, src_ext


def test_extended_distribution_sums_to_one_and_matches_numpy():
  logits, z, w, src_ext = _inputs()
  logp = copying.extended_log_probs(jnp.asarray(logits), jnp.asarray(z), jnp.asarray(w),
                                    jnp.asarray(src_ext))
  assert logp.shape == (4, V + 6)
  p = np.exp(np.asarray(logp, np.float64))
  np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-6)
  np.testing.assert_allclose(p, _np_extended(logits, z, w, src_ext), atol=1e-6)
  assert np.isneginf(np.asarray(logp)[:, V + 2:]).all()  # ids no source word holds


def test_gold_log_prob_is_the_extended_distribution_at_the_target():
  logits, z, w, src_ext = _inputs(B=4)
  # One example, four target steps: the rows of _inputs become the steps.
  tgt_ext = np.array([[4, V, V + 1, 7]], np.int32)  # vocab+copy, copy only, copy only, vocab only
  got = copying.gold_log_prob(jnp.asarray(logits)[None], jnp.asarray(z)[None],
                              jnp.asarray(w)[None], jnp.asarray(src_ext[:1]), jnp.asarray(tgt_ext))
  ref = _np_extended(logits, z, w, src_ext)
  want = np.log([ref[t, y] for t, y in enumerate(tgt_ext[0])])
  np.testing.assert_allclose(np.asarray(got)[0], want, rtol=1e-5)


def test_gold_log_prob_gradient_is_finite_without_copy_mass():
  logits, z, w, src_ext = _inputs(B=2)
  tgt_ext = np.array([[7, 8]], np.int32)  # in no source position: the copy term is log 0

  def loss(logits, z, w):
    return -jnp.sum(copying.gold_log_prob(logits[None], z[None], w[None],
                                          jnp.asarray(src_ext[:1]), jnp.asarray(tgt_ext)))
  grads = jax.grad(loss, argnums=(0, 1, 2))(jnp.asarray(logits), jnp.asarray(z), jnp.asarray(w))
  assert all(np.isfinite(np.asarray(g)).all() for g in grads)


def test_coverage_loss_hand_computed():
  a = jnp.asarray([[[0.5, 0.5, 0.0], [0.25, 0.5, 0.25], [0.0, 0.0, 1.0]]])
  # c^0 = 0 -> 0; c^1 = (.5, .5, 0) -> .25 + .5 + 0; c^2 = (.75, 1, .25) -> 0 + 0 + .25
  np.testing.assert_allclose(copying.coverage(a)[0, 2], [0.75, 1.0, 0.25])
  np.testing.assert_allclose(copying.coverage_loss(a, jnp.ones((1, 3))), 1.0)
  np.testing.assert_allclose(copying.coverage_loss(a, jnp.asarray([[1.0, 1.0, 0.0]])), 0.75)


def _model(pointer=False, coverage=False, seed=0):
  cfg = model_config(src_vocab=V, tgt_vocab=V, emb_dim=8, enc_hidden=6, dec_hidden=10, d_attn=7,
                     dropout=0.0, pointer=pointer, coverage=coverage)
  model = build_model(cfg, seed=seed)
  if coverage:  # zero at initialization (a switch-on changes nothing); make it matter here
    model.decoder.w_cov[...] = jax.random.normal(jax.random.PRNGKey(seed + 7), (7,)) * 3
  return model


def _batch():
  src = np.array([[4, 5, 6, 3, 5, 2], [7, 3, 8, 2, 0, 0]], np.int32)  # 3 = UNK, 2 = EOS
  src_ext = np.array([[4, 5, 6, V, 5, 2], [7, V, 8, 2, 0, 0]], np.int32)
  tgt_ext = np.array([[V, 5, 2, 0], [9, V, 7, 2]], np.int32)
  tgt = np.where(tgt_ext >= V, 3, tgt_ext).astype(np.int32)
  return {k: jnp.asarray(v) for k, v in dict(
      src=src, src_lengths=np.array([6, 4], np.int32), tgt=tgt, tgt_lengths=np.array([3, 4]),
      src_ext=src_ext, tgt_ext=tgt_ext).items()}


def _stepped(model, batch):
  """Teacher forcing along tgt_ext through the decoding step: log P of each gold token and the
  attention of each step."""
  state = model.initial_decode_state(batch["src"], batch["src_lengths"], batch.get("src_ext"))
  step = model.step_fn()
  y = jnp.ones((2,), jnp.int32)  # BOS
  gold = batch["tgt_ext"] if model.cfg.rnn.pointer else batch["tgt"]
  logps, ws = [], []
  for t in range(gold.shape[1]):
    state, logp, w, *_ = step(state, y)
    logps.append(jnp.take_along_axis(logp, gold[:, t:t + 1], -1)[:, 0])
    ws.append(w)
    y = gold[:, t]
  return jnp.stack(logps, 1), jnp.stack(ws, 1)


@pytest.mark.parametrize("pointer,coverage", [(True, False), (False, True), (True, True)])
def test_training_loss_equals_stepwise_decoding(pointer, coverage):
  """The loss of teacher forcing is the search's own distribution at the gold tokens (pointer:
  on the extended vocabulary, with the source OOV fed back as UNK; coverage: the state's
  coverage vector is the sum the loss computes)."""
  model = _model(pointer, coverage)
  batch = _batch()
  logp, w = _stepped(model, batch)
  _, att = model.attention(batch)
  np.testing.assert_allclose(att.weights, w, atol=1e-5)
  mask = np.arange(4)[None, :] < np.asarray(batch["tgt_lengths"])[:, None]
  total, ntok, nll = SummarizationTask().loss(model, batch)
  np.testing.assert_allclose(nll, -np.sum(np.where(mask, logp, 0.0)), rtol=1e-5)
  assert ntok == mask.sum()
  cov = copying.coverage_loss(att.weights, jnp.asarray(mask, jnp.float32)) if coverage else 0.0
  np.testing.assert_allclose(total, nll + cov, rtol=1e-5)


def test_pointer_step_sums_to_one_and_reports_p_gen():
  model = _model(pointer=True)
  batch = _batch()
  state = model.initial_decode_state(batch["src"], batch["src_lengths"], batch["src_ext"])
  _, logp, w, extras = model.step_fn()(state, jnp.array([1, V], jnp.int32))  # an OOV fed back
  assert logp.shape == (2, V + 6)
  np.testing.assert_allclose(np.exp(np.asarray(logp, np.float64)).sum(-1), 1.0, atol=1e-5)
  assert ((extras["p_gen"] > 0) & (extras["p_gen"] < 1)).all()


def test_coverage_enters_the_score():
  """With w_c != 0 the attention of later steps depends on earlier ones; at w_c = 0 (a fresh
  switch-on) the model is the one without coverage."""
  batch = _batch()
  plain = _model()
  covered = _model(coverage=True)
  _, w_cov = covered.attention(batch)
  assert np.abs(np.asarray(w_cov.weights[:, 1:] - plain.attention(batch)[1].weights[:, 1:])).max() > 1e-3
  covered.decoder.w_cov[...] = jnp.zeros((7,))
  np.testing.assert_allclose(covered.attention(batch)[1].weights, plain.attention(batch)[1].weights,
                             atol=1e-6)


def test_copying_needs_an_attention_decoder():
  from attn.errors import ConfigError
  with pytest.raises(ConfigError, match="model.rnn.pointer=True needs an attention decoder"):
    model_config(src_vocab=V, tgt_vocab=V, decoder="none", pointer=True)
  with pytest.raises(ConfigError, match="model.rnn.coverage=True: .*score='additive'"):
    model_config(src_vocab=V, tgt_vocab=V, score="general", coverage=True)
  with pytest.raises(ConfigError, match="model.rnn.coverage=True: decoder 'luong'"):
    model_config(src_vocab=V, tgt_vocab=V, decoder="luong", score="additive", coverage=True)


def test_repeated_trigram_rate():
  assert repeated_ngram_rate([list("abcabc")], 3) == pytest.approx(1 / 4)  # abc again of 4
  assert repeated_ngram_rate([list("ab"), list("abcd")], 3) == 0.0
  assert repeated_ngram_rate([], 3) == 0.0
