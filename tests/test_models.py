"""Seq2seq models: every decoder's shapes and masks, padding invariance, teacher forcing = stepping."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attn.models import ModelConfig, build_model, count_params, match_param_count
from model_configs import model_config, random_batch

V_SRC, V_TGT = 23, 19
VARIANTS = {
    "none": dict(decoder="none"),
    "bahdanau": dict(decoder="bahdanau"),
    "bahdanau_lstm_2layer_sparsemax": dict(decoder="bahdanau", cell="lstm", enc_layers=2,
                                           dec_layers=2, score="general", normalizer="sparsemax"),
    "luong_feed": dict(decoder="luong", score="general"),
    "luong_nofeed": dict(decoder="luong", score="dot", input_feeding=False),
    "luong_local_m": dict(decoder="luong", score="scaled_dot", scope="local_m", half_width=2,
                          input_feeding=False),
    "luong_local_p": dict(decoder="luong", score="additive", scope="local_p", half_width=2),
    "luong_location_entmax": dict(decoder="luong", score="location", normalizer="entmax15",
                                  bidirectional=False),
}


def _cfg(**kw):
  """A ModelConfig of the RNN; `kw` names shared and model.rnn fields alike."""
  base = dict(src_vocab=V_SRC, tgt_vocab=V_TGT, emb_dim=8, enc_hidden=6, dec_hidden=10, d_attn=7,
              max_src_len=16, dropout=0.0)
  return model_config(**(base | kw))


def _batch(B=3, Ts=9, Tt=6, src_lengths=(9, 5, 1), tgt_lengths=(6, 3, 2), seed=0):
  assert len(src_lengths) == len(tgt_lengths) == B
  return random_batch(src_lengths, tgt_lengths, Ts, Tt, V_SRC, V_TGT, seed)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_shapes_and_attention_masks(name):
  model = build_model(_cfg(**VARIANTS[name]))
  batch = _batch()
  logits, w = model(batch)
  assert logits.shape == (3, 6, V_TGT) and np.isfinite(logits).all()
  assert w.shape == (3, 6, 9)
  src_mask = np.arange(9)[None, :] < np.asarray(batch["src_lengths"])[:, None]
  w = np.asarray(w)
  assert (w * ~src_mask[:, None, :] == 0).all()  # no weight on source padding
  if name == "none":
    assert (w == 0).all()
  elif "local" not in name:  # local-p weights carry a Gaussian gain; the rest sum to one
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_source_padding_does_not_change_outputs(name):
  model = build_model(_cfg(**VARIANTS[name]))
  batch = _batch()
  logits, _ = model(batch)
  wider = dict(batch, src=jnp.pad(batch["src"], ((0, 0), (0, 4)), constant_values=7))  # junk past lengths
  logits2, w2 = model(wider)
  np.testing.assert_allclose(logits2, logits, rtol=1e-5, atol=1e-5)
  assert (np.asarray(w2)[:, :, 9:] == 0).all()


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_teacher_forcing_equals_step_by_step_decoding(name):
  model = build_model(_cfg(**VARIANTS[name]))
  batch = _batch()
  logits, w = model(batch)
  state = model.initial_decode_state(batch["src"], batch["src_lengths"])
  step = model.step_fn()
  y = jnp.ones((3,), jnp.int32)  # BOS
  for t in range(6):
    state, logp, w_t = step(state, y)
    np.testing.assert_allclose(logp, jax.nn.log_softmax(logits[:, t]), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(w_t, w[:, t], rtol=1e-4, atol=1e-6)
    y = batch["tgt"][:, t]


def test_dropout_is_active_only_with_a_key():
  model = build_model(_cfg(decoder="bahdanau", dropout=0.5))
  batch = _batch()
  a, _ = model(batch)
  b, _ = model(batch)
  c, _ = model(batch, dropout_key=jax.random.PRNGKey(1))
  np.testing.assert_array_equal(a, b)
  assert np.abs(np.asarray(a) - np.asarray(c)).max() > 1e-3


def test_no_attention_model_can_be_sized_to_an_attention_models_budget():
  ref = _cfg(decoder="bahdanau", d_attn=32)
  matched = match_param_count(_cfg(decoder="none"), ref)
  n, n_ref = count_params(matched), count_params(ref)
  step = count_params(matched.replace_paths({"rnn.dec_hidden": matched.rnn.dec_hidden + 1})) - n
  assert abs(n - n_ref) <= step  # as close as one hidden unit allows
  assert count_params(build_model(matched)) == n


@pytest.mark.parametrize("kw,match", [
    (dict(decoder="transformer"), "known: bahdanau, luong, none"),
    (dict(score="cosine"), "unknown model.rnn.score .cosine.; known: additive"),
    (dict(fused=True, decoder="bahdanau"), "fused=True"),
    (dict(dropout=1.0), "dropout"),
])
def test_bad_config_errors(kw, match):
  with pytest.raises((ValueError, KeyError), match=match):
    _cfg(**kw)


@pytest.mark.parametrize("score", ["scaled_dot", "additive"])
def test_fused_and_unfused_luong_paths_agree_in_value_and_gradient(score):
  cfg = _cfg(decoder="luong", input_feeding=False, score=score, dec_hidden=32, enc_hidden=24)
  unfused, fused = build_model(cfg), build_model(cfg.replace(fused=True))
  batch = _batch()
  a, w = unfused(batch)
  b, w_fused = fused(batch)
  assert w_fused is None  # the kernel never forms the weights
  np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)

  from flax import nnx
  grads = lambda m: nnx.grad(lambda m: jnp.sum(m(batch)[0] ** 2))(m)
  for ga, gb in zip(jax.tree.leaves(grads(unfused)), jax.tree.leaves(grads(fused))):
    np.testing.assert_allclose(gb, ga, rtol=1e-3, atol=1e-4)


# ----------------------------------------------------------------------------- label smoothing

def _np_losses(logits, tgt, lengths, a):
  """(smoothed token-loss sum, tokens, NLL sum) in float64 NumPy, with uniform smoothing over the
  V classes as optax.smooth_labels: targets (1 - a) onehot + a / V; padded positions left out."""
  logits = np.asarray(logits, np.float64)
  B, T, V = logits.shape
  smoothed = ntok = nll = 0.0
  for b in range(B):
    for t in range(int(lengths[b])):
      z = logits[b, t] - logits[b, t].max()
      logp = z - np.log(np.exp(z).sum())
      y = np.full(V, a / V)
      y[int(tgt[b, t])] += 1.0 - a
      smoothed += -(y * logp).sum()
      nll += -logp[int(tgt[b, t])]
      ntok += 1
  return smoothed, ntok, nll


@pytest.mark.parametrize("a", [0.1, 0.3])
def test_sequence_loss_label_smoothing_matches_numpy(a):
  from attn.models import sequence_loss
  batch = _batch(B=3, Tt=5, tgt_lengths=(5, 2, 1))
  logits = 3.0 * jax.random.normal(jax.random.PRNGKey(0), (3, 5, V_TGT))
  total, ntok, nll = sequence_loss(logits, batch["tgt"], batch["tgt_lengths"], a)
  total_ref, ntok_ref, nll_ref = _np_losses(logits, batch["tgt"], batch["tgt_lengths"], a)
  assert float(ntok) == ntok_ref == 8
  np.testing.assert_allclose(total, total_ref, rtol=1e-5)
  np.testing.assert_allclose(nll, nll_ref, rtol=1e-5)
  total0, _, nll0 = sequence_loss(logits, batch["tgt"], batch["tgt_lengths"], 0.0)
  np.testing.assert_allclose(total0, nll_ref, rtol=1e-5)  # no smoothing: the NLL itself
  np.testing.assert_allclose(nll0, nll, rtol=1e-6)
  assert abs(float(total) - float(total0)) > 1e-3 * float(total0)


def test_train_step_applies_label_smoothing():
  """The reported `loss` of one train step is the smoothed loss of the model's logits (as NumPy
  computes it) and `nll` the unsmoothed one; smoothing 0 and 0.3 differ."""
  import optax
  from flax import nnx
  from attn import training
  model = build_model(_cfg(decoder="none"))  # smoothing is decoder-independent; this one is cheap
  batch = _batch(B=3, Tt=6, tgt_lengths=(6, 3, 2))
  logits, _ = model(batch)
  graphdef, state = nnx.split((model, nnx.Optimizer(model, optax.sgd(0.0), wrt=nnx.Param)))
  task = training.get_task("translate")
  reported = {}
  for a in (0.0, 0.3):
    step = jax.jit(functools.partial(training.train_step, task, graphdef, label_smoothing=a))
    _, metrics = step(state, batch, jax.random.PRNGKey(0))
    total_ref, ntok_ref, nll_ref = _np_losses(logits, batch["tgt"], batch["tgt_lengths"], a)
    np.testing.assert_allclose(metrics["loss"], total_ref / ntok_ref, rtol=1e-5, err_msg=f"a={a}")
    np.testing.assert_allclose(metrics["nll"], nll_ref / ntok_ref, rtol=1e-5, err_msg=f"a={a}")
    assert float(metrics["tokens"]) == ntok_ref
    reported[a] = float(metrics["loss"])
  assert abs(reported[0.3] - reported[0.0]) > 1e-2


@pytest.mark.parametrize("name", ["bahdanau", "luong_feed", "luong_nofeed",
                                  "luong_location_entmax"])
@pytest.mark.parametrize("beam_size", [1, 3])
def test_teacher_forcing_along_the_search_output_replays_its_attention(name, beam_size):
  """The run viewer's raw scores come from teacher forcing along the decoded output: that must
  replay the steps the search took (same weights), and the scores must renormalize to them."""
  from attn import core
  from attn.apps.translate.task import TranslationTask
  from attn.training.task import Search
  cfg = _cfg(**VARIANTS[name])
  model = build_model(cfg)
  batch = _batch()
  out = TranslationTask().decode(model, batch, max_len=7,
                                 search=Search(beam_size=beam_size, length_penalty=0.6))
  _, att = model.attention({**batch, "tgt": out.tokens, "tgt_lengths": out.lengths})
  valid = np.arange(7)[None, :, None] < np.asarray(out.lengths)[:, None, None]
  np.testing.assert_allclose(np.where(valid, att.weights, 0), out.weights, atol=1e-5)
  e = np.asarray(att.scores)
  again = core.normalize(jnp.where(np.isfinite(e), e, 0.0), jnp.asarray(np.isfinite(e)),
                         kind=cfg.rnn.normalizer, temperature=cfg.rnn.temperature)
  np.testing.assert_allclose(again, att.weights, atol=1e-5)


@pytest.mark.parametrize("name", ["bahdanau", "luong_feed", "luong_nofeed"])
def test_counterfactual_identity_is_teacher_forcing_and_uniform_changes_the_output(name):
  model = build_model(_cfg(**VARIANTS[name]))
  batch = _batch()
  logits_tf, _ = model(batch)
  logits, same, att = model.counterfactual(batch, lambda w, mask, t: w)
  np.testing.assert_allclose(logits, logits_tf, atol=1e-5)
  np.testing.assert_allclose(same, logits, atol=1e-5)
  uniform = lambda w, mask, t: mask / jnp.maximum(mask.sum(-1, keepdims=True), 1)
  _, cf, _ = model.counterfactual(batch, uniform)
  # Only the step's own context changes: the rows with a single source token cannot change.
  assert not np.allclose(np.asarray(cf)[0], np.asarray(logits)[0], atol=1e-4)
  np.testing.assert_allclose(np.asarray(cf)[2], np.asarray(logits)[2], atol=1e-5)
  np.testing.assert_allclose(att.weights, model(batch)[1], atol=1e-6)
