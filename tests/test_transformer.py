"""The Transformer (model.arch=transformer): masks, KV-cache decoding = teacher forcing, fused =
unfused, positional encodings' properties, role variants, config errors and nested config."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import attn
from attn.config import configurable
from attn import decoding as decode_lib
from attn.errors import ConfigError
from attn.models import (ModelConfig, build_model, count_params, positions, sequence_loss,
                         transformer, transformer_attention)
from attn.models.config import AttentionRole
from attn.models.params import values
from attn.models.seq2seq import shift_right
from model_configs import model_config, random_batch

V_SRC, V_TGT = 23, 19
B, TS, TT = 3, 9, 6
SRC_LENGTHS, TGT_LENGTHS = (9, 5, 1), (6, 3, 2)


def _cfg(**kw):
  """A ModelConfig of the Transformer; `kw` names shared, model.transformer (a role as a dict)
  and model.rnn fields alike."""
  base = dict(src_vocab=V_SRC, tgt_vocab=V_TGT, arch="transformer", d_model=16, num_heads=2,
              d_ff=24, enc_layers=1, dec_layers=1, dropout=0.0, max_src_len=16, max_tgt_len=10)
  return model_config(**(base | kw))


def _batch(seed=0, Ts=TS, Tt=TT):
  return random_batch(SRC_LENGTHS, TGT_LENGTHS, Ts, Tt, V_SRC, V_TGT, seed)


def _perturbed(batch, t0=3):
  """The batch twice more: target tokens from t0 on replaced (the logits before t0 + 1 must not
  move), and junk written over the source padding (nothing may move)."""
  future = batch["tgt"].at[:, t0:].set((batch["tgt"][:, t0:] + 5) % (V_TGT - 4) + 4)
  src_mask = jnp.arange(TS)[None] < batch["src_lengths"][:, None]
  junk = jnp.where(src_mask, batch["src"], 7)
  cat = lambda *xs: jnp.concatenate(xs)
  return {"src": cat(batch["src"], batch["src"], junk),
          "src_lengths": cat(*[batch["src_lengths"]] * 3), "tgt": cat(batch["tgt"], future,
                                                                        batch["tgt"]),
          "tgt_lengths": cat(*[batch["tgt_lengths"]] * 3)}


def _loss_and_grad(model, batch):
  """The task's loss on `batch`, its gradient, and the teacher-forced (logits, attention)."""

  def loss(model):
    logits, att = model.attention(batch)
    total, ntok, _ = sequence_loss(logits, batch["tgt"], batch["tgt_lengths"])
    return total / ntok, (logits, att)

  (_, (logits, att)), grads = nnx.value_and_grad(loss, has_aux=True)(model)
  return logits, att, grads


@functools.partial(jax.jit, static_argnums=0)
def _everything(graphdef, state, batch):
  """One compiled program per model: teacher forcing (and its gradient) on the perturbed
  batches, and the KV-cache steps along batch["tgt"]."""
  model = nnx.merge(graphdef, state)
  logits, att, grads = _loss_and_grad(model, _perturbed(batch))
  step = model.step_fn()

  def body(s, y_prev):
    s, logp, w = step(s, y_prev)
    return s, (logp, w)

  init = model.initial_decode_state(batch["src"], batch["src_lengths"])
  _, (logp, w) = jax.lax.scan(body, init, shift_right(batch["tgt"]).T)  # [Tt, B, ...]
  return logits, att, (jnp.swapaxes(logp, 0, 1), jnp.swapaxes(w, 0, 1)), grads


# Every positional encoding and role variant, merged into few models (each costs a compilation).
# Sinusoidal positions (the default) are the train-step and greedy tests' model; RoPE with global
# softmax attention and an additive cross-attention is the fused test's, which runs these checks
# on its unfused twin.
VARIANTS = {
    "learned_tied_gelu_window_sparsemax_entmax_general": dict(
        pos_encoding="learned", tie_embeddings=True, ff_activation="gelu", dec_layers=2,
        enc_self=dict(scope="window", half_width=2),
        dec_self=dict(scope="window", half_width=1, normalizer="sparsemax"),
        cross=dict(score="general", normalizer="entmax15", temperature=0.5, scope="window",
                   half_width=3)),
    "none_linear_self_additive_cross": dict(
        pos_encoding="none", enc_self=dict(scope="linear"),
        dec_self=dict(scope="linear", score="dot"), cross=dict(score="additive")),
    "alibi_topk_linear_cross": dict(
        pos_encoding="alibi", enc_self=dict(scope="topk", top_k=3),
        dec_self=dict(scope="topk", top_k=2), cross=dict(scope="linear")),
}
FUSED_CASE = dict(pos_encoding="rope", cross=dict(score="additive"))


@pytest.mark.parametrize("name", sorted(VARIANTS) + ["rope_fused_case"])
def test_masks_cache_decoding_and_gradients(name):
  """Per variant: shapes; no attention across source padding or to future targets; the KV-cache
  steps equal teacher forcing at every step (logits and weights); finite, non-zero gradients."""
  kw = VARIANTS.get(name, FUSED_CASE)
  model = build_model(_cfg(**kw))
  batch = _batch()
  logits, att, (logp, w_step), grads = _everything(*nnx.split(model), batch)
  if name == "rope_fused_case":
    _FUSED_REFERENCE.update(logits=logits, grads=grads)
  logits = np.asarray(logits)
  base, future, junk = logits[:B], logits[B:2 * B], logits[2 * B:]
  assert base.shape == (B, TT, V_TGT) and np.isfinite(base).all()
  np.testing.assert_allclose(junk, base, rtol=1e-5, atol=1e-5)  # source padding is invisible
  np.testing.assert_allclose(future[:, :4], base[:, :4], rtol=1e-5, atol=1e-5)  # t <= t0
  assert np.abs(future[:, 4:] - base[:, 4:]).max() > 1e-4  # ... and later steps do see them

  np.testing.assert_allclose(logp, jax.nn.log_softmax(base), rtol=1e-4, atol=2e-5)
  if att is None:  # linear cross-attention never forms weights; the steps report zeros
    assert kw["cross"]["scope"] == "linear"
    assert (np.asarray(w_step) == 0).all()
  else:
    w, heads = np.asarray(att.weights)[:B], np.asarray(att.heads)[:B]
    L = kw.get("dec_layers", 1)
    assert w.shape == (B, TT, TS) and heads.shape == (B, L, 2, TT, TS)
    np.testing.assert_allclose(w, heads[:, transformer.ALIGNMENT_LAYER].mean(1), atol=1e-7)
    src_mask = np.arange(TS)[None] < np.asarray(SRC_LENGTHS)[:, None]
    assert (heads * ~src_mask[:, None, None, None] == 0).all()
    # Rows sum to one, except where a cross-attention window holds no valid source position.
    sums = w.sum(-1)
    if kw.get("cross", {}).get("scope") == "window":
      assert (sums[2, 4:] == 0).all()  # source length 1, window |j - t| <= 3
      sums = sums[:, :4]
    np.testing.assert_allclose(sums, 1.0, atol=1e-5)
    np.testing.assert_allclose(w_step, w, rtol=1e-4, atol=1e-6)

  leaves = jax.tree.leaves(grads)
  assert all(np.isfinite(g).all() for g in leaves)
  assert sum(float(jnp.abs(g).sum()) for g in leaves) > 0


def test_one_bfloat16_train_step_with_dropout_through_the_translation_task():
  """train.compute_dtype=bfloat16: matmul operands rounded, parameters and loss float32."""
  import optax
  from attn import training
  model = build_model(_cfg(dropout=0.3), compute_dtype="bfloat16")
  graphdef, state = nnx.split((model, nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)))
  task = training.get_task("translate")
  step = jax.jit(functools.partial(training.train_step, task, graphdef, label_smoothing=0.1))
  new_state, metrics = step(state, _batch(), jax.random.PRNGKey(0))
  assert metrics["loss"].dtype == jnp.float32
  assert abs(float(metrics["nll"]) - np.log(V_TGT)) < 1.0  # untrained: near uniform
  assert np.isfinite(float(metrics["grad_norm"])) and float(metrics["grad_norm"]) > 0
  trained, _ = nnx.merge(graphdef, new_state)
  moved = trained.encoder.embed.embedding[...] - model.encoder.embed.embedding[...]
  assert trained.encoder.embed.embedding.dtype == jnp.float32
  assert float(jnp.abs(moved).max()) > 1e-3


def test_float32_matmuls_go_through_the_custom_vjp_matmul():
  """Every projection, feed-forward and output matmul of a float32 Transformer runs through
  attn.precision.matmul (its backward reads the saved x^T), in float32 throughout."""
  model = build_model(_cfg(enc_layers=2, dec_layers=1))
  jaxpr = str(jax.make_jaxpr(lambda: model(_batch())[0])())
  per_enc, per_dec = 4 + 2, 4 + 4 + 2  # q k v o, ff up and down; self and cross attention
  assert jaxpr.count("custom_vjp_call") == 2 * per_enc + per_dec + 1  # + the output layer
  assert "bf16" not in jaxpr


@functools.partial(jax.jit, static_argnums=(0, 3))
def _searches_then_forced(graphdef, state, batch, max_len):
  """Greedy and beam search (their max_len sizing the cache), and teacher forcing along each
  one's output."""
  model = nnx.merge(graphdef, state)
  init = model.initial_decode_state(batch["src"], batch["src_lengths"], max_len=max_len)
  greedy = decode_lib.greedy_decode(model.step_fn(), init, B, max_len)
  beam = decode_lib.beam_search(model.step_fn(), init, B, max_len, beam_size=3,
                                length_penalty=0.0)
  forced = lambda out: model(dict(batch, tgt=out.tokens, tgt_lengths=out.lengths))[0]
  return greedy, forced(greedy), beam, forced(beam)


def test_searches_agree_with_teacher_forcing_along_their_output():
  """Greedy tokens are the argmax of teacher forcing along them; beam search's scores are the
  teacher-forced log-probabilities of its hypotheses (so the cache it reorders by beam parent
  stays with its hypothesis)."""
  model = build_model(_cfg(max_tgt_len=8))  # the search's max_len (12) sizes the cache instead
  greedy, logits, beam, beam_logits = _searches_then_forced(*nnx.split(model), _batch(), 12)
  tokens, lengths = np.asarray(greedy.tokens), np.asarray(greedy.lengths)
  argmax = np.asarray(jnp.argmax(logits, -1))
  for b in range(B):
    np.testing.assert_array_equal(argmax[b, :lengths[b]], tokens[b, :lengths[b]])
  logp = np.asarray(jax.nn.log_softmax(beam_logits))
  for b in range(B):
    n = int(beam.lengths[b])
    forced = logp[b, np.arange(n), np.asarray(beam.tokens)[b, :n]].sum()
    np.testing.assert_allclose(forced, beam.scores[b], rtol=1e-4, atol=1e-4)


def test_decoding_past_the_cache_is_an_error():
  model = build_model(_cfg(max_tgt_len=4))
  batch = _batch()
  init = model.initial_decode_state(batch["src"], batch["src_lengths"])  # a cache of 4
  step = jax.jit(model.step)  # checks at run time
  step(dict(init, t=jnp.full((B,), 3, jnp.int32)), batch["tgt"][:, 0])  # the last slot: fine
  with pytest.raises(Exception, match="past its key/value cache of 4"):
    jax.block_until_ready(step(dict(init, t=jnp.full((B,), 4, jnp.int32)), batch["tgt"][:, 0]))
  # The searches' step leaves the check to the searches, which refuse a max_len past the cache
  # before they start (so the compiled search calls nothing back in Python and can be cached).
  assert "callback" not in str(jax.make_jaxpr(model.step_fn())(init, batch["tgt"][:, 0]))
  assert "callback" in str(jax.make_jaxpr(model.step)(init, batch["tgt"][:, 0]))
  for search in (lambda n: decode_lib.greedy_decode(model.step_fn(), init, B, n),
                 lambda n: decode_lib.beam_search(model.step_fn(), init, B, n, beam_size=2)):
    assert search(4).tokens.shape == (B, 4)  # exactly the cache: fine
    with pytest.raises(ValueError, match="past its key/value cache of 4 positions \\(the "
                                         "search's max_len is 5\\)"):
      search(5)
  learned = build_model(_cfg(pos_encoding="learned", max_tgt_len=4))
  with pytest.raises(ValueError, match="learned target positions"):
    learned.initial_decode_state(batch["src"], batch["src_lengths"], max_len=5)
  # The task's searches stop at the table's end instead (evaluation asks for ~1.2 x source + 10).
  from attn import training
  from attn.training.task import Search
  out = training.get_task("translate").decode(learned, batch, max_len=9, search=Search())
  assert learned.longest_output == 4 and out.tokens.shape == (B, 4)
  assert build_model(_cfg(max_tgt_len=4)).longest_output is None


_FUSED_REFERENCE = {}  # the unfused twin's outputs, from test_masks_cache_decoding_and_gradients


@functools.partial(jax.jit, static_argnums=0)
def _forward_and_grad(graphdef, state, batch):
  return _loss_and_grad(nnx.merge(graphdef, state), _perturbed(batch))


@pytest.mark.parametrize("target", [True, "cpu_blocked"])
def test_fused_equals_unfused_in_value_and_gradient(target):
  """Scaled-dot self-attention (causal in the decoder, RoPE-rotated) through kernels.attention,
  additive cross-attention through kernels.additive_attention; the unfused twin is a case of
  test_masks_cache_decoding_and_gradients (recomputed here when run alone). model.fused may name
  the kernel target; every role carries it."""
  cfg = _cfg(**FUSED_CASE)
  fused = build_model(cfg.replace(fused=target))
  assert all(a.fused == target for a in (fused.encoder.layers[0].attn,
                                         fused.decoder.layers[0].self_attn,
                                         fused.decoder.layers[0].cross))
  batch = _batch()
  if not _FUSED_REFERENCE:
    logits, _, _, grads = _everything(*nnx.split(build_model(cfg)), batch)
    _FUSED_REFERENCE.update(logits=logits, grads=grads)
  b, att_b, gb = _forward_and_grad(*nnx.split(fused), batch)
  assert att_b is None  # the kernels never form the weights
  np.testing.assert_allclose(b, _FUSED_REFERENCE["logits"], rtol=1e-4, atol=1e-5)
  for x, y in zip(jax.tree.leaves(_FUSED_REFERENCE["grads"]), jax.tree.leaves(gb)):
    np.testing.assert_allclose(y, x, rtol=1e-3, atol=1e-5)


def test_fused_falls_back_where_the_kernels_do_not_reach():
  cfg = _cfg(fused=True, pos_encoding="alibi", cross=dict(scope="window", half_width=2),
             enc_self=dict(score="additive"))
  assert "bias" in transformer_attention.fused_unsupported(cfg, "dec_self")
  assert "bias" in transformer_attention.fused_unsupported(cfg, "enc_self")
  assert "scope" in transformer_attention.fused_unsupported(cfg, "cross")
  model = build_model(cfg)
  layer = model.decoder.layers[0]
  assert not any(a.fused for a in (model.encoder.layers[0].attn, layer.self_attn, layer.cross))


def test_attention_is_attn_multihead_on_the_same_parameters():
  """Without positions, an encoder self-attention is attn.multihead with padding as lengths."""
  model = build_model(_cfg(pos_encoding="none", enc_self=dict(score="general")))
  layer = model.encoder.layers[0].attn
  x = jax.random.normal(jax.random.PRNGKey(1), (B, TS, 16))
  lengths = jnp.asarray(SRC_LENGTHS)
  pos = jnp.arange(TS)[None]
  kp, v = layer.keys_values(x, pos)
  out, att = layer(layer.queries(x, pos), kp, v, q_pos=pos, k_pos=pos, key_lengths=lengths)
  ref, w_ref = attn.multihead(values(layer.params), x, num_heads=2, score="general",
                              key_lengths=lengths)
  np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(att.weights, w_ref, rtol=1e-5, atol=1e-7)
  # The raw scores behind the weights: softmax over the unmasked ones gives them back.
  again = attn.normalize(jnp.where(jnp.isfinite(att.scores), att.scores, 0.0),
                         jnp.isfinite(att.scores))
  np.testing.assert_allclose(again, w_ref, rtol=1e-5, atol=1e-7)
  assert bool(jnp.all(jnp.isinf(att.scores) == (w_ref == 0)))  # -inf exactly where padded


@functools.partial(jax.jit, static_argnums=0)
def _encode(graphdef, state, src, lengths):
  return nnx.merge(graphdef, state).encoder(src, lengths)


def test_without_positions_the_encoder_is_permutation_equivariant():
  src = jnp.asarray(np.random.default_rng(0).integers(4, V_SRC, (B, TS)), jnp.int32)
  lengths = jnp.full((B,), TS, jnp.int32)
  perm = np.random.default_rng(1).permutation(TS)
  for pos, equivariant in (("none", True), ("sinusoidal", False)):
    enc = functools.partial(_encode, *nnx.split(build_model(_cfg(pos_encoding=pos))))
    a, b = enc(src[:, perm], lengths), enc(src, lengths)[:, perm]
    if equivariant:
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    else:
      assert float(jnp.abs(a - b).max()) > 1e-3  # positions break the symmetry


def test_rope_scores_depend_only_on_position_differences():
  q, k = jax.random.normal(jax.random.PRNGKey(0), (2, 1, 2, 5, 8))  # [B, H, T, dh] each
  p = jnp.asarray([[0, 3, 4, 9, 17]])
  rotate = jax.jit(positions.rotate_pairs)
  scores = lambda shift: np.einsum("bhqd,bhkd->bhqk", rotate(q, p + shift), rotate(k, p + shift))
  np.testing.assert_allclose(scores(11), scores(0), rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(scores(-3), scores(0), rtol=1e-4, atol=1e-4)
  # Rotations preserve norms, and position 0 is the identity.
  np.testing.assert_allclose(np.linalg.norm(rotate(q, p), axis=-1), np.linalg.norm(q, axis=-1),
                             rtol=1e-5)
  np.testing.assert_allclose(rotate(q, jnp.zeros((1, 5), jnp.int32)), q, atol=1e-7)


def test_alibi_bias_shape_slopes_and_monotonicity():
  np.testing.assert_allclose(positions.alibi_slopes(8), 2.0 ** -np.arange(1, 9))
  slopes6 = np.asarray(positions.alibi_slopes(6))  # not a power of two: the paper's recipe
  np.testing.assert_allclose(slopes6, [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3])
  q_pos, k_pos = jnp.arange(4)[None] + 2, jnp.arange(7)[None]
  bias = np.asarray(positions.alibi_bias(6, q_pos, k_pos))
  assert bias.shape == (1, 6, 4, 7) and (bias <= 0).all()
  for h in range(6):
    for i in range(4):
      row, qi = bias[0, h, i], i + 2
      assert row[qi] == 0
      assert (np.diff(row[:qi + 1]) > 0).all() and (np.diff(row[qi:]) < 0).all()  # farther: lower
      np.testing.assert_allclose(row, -slopes6[h] * np.abs(np.arange(7) - qi))


def test_sinusoids_follow_vaswani():
  pe = np.asarray(positions.sinusoids(jnp.arange(5)[None], 6))[0]
  i = np.arange(3)
  np.testing.assert_allclose(pe[3, 0::2], np.sin(3 / 10000 ** (2 * i / 6)), rtol=1e-5)
  np.testing.assert_allclose(pe[3, 1::2], np.cos(3 / 10000 ** (2 * i / 6)), rtol=1e-5)


def test_count_params_and_the_rnn_default():
  cfg = _cfg(tie_embeddings=True)
  assert count_params(cfg) == count_params(build_model(cfg))
  untied = cfg.replace_paths({"transformer.tie_embeddings": False})
  assert count_params(untied) == count_params(cfg) + 16 * V_TGT + V_TGT
  assert ModelConfig(src_vocab=5, tgt_vocab=5).arch == "rnn"
  assert cfg.has_attention


@pytest.mark.parametrize("kw,match", [
    (dict(arch="cnn"), "model.arch.*known: rnn, transformer"),
    (dict(pos_encoding="relative"), "model.transformer.pos_encoding.*known: alibi"),
    (dict(num_heads=3), "divisible"),
    (dict(ff_activation="swish"), "model.transformer.ff_activation"),
    (dict(cross=dict(scope="ring")), "^unknown model.transformer.cross.scope 'ring'; known: "),
    (dict(dec_self=dict(normalizer="max")), "model.transformer.dec_self.normalizer"),
    (dict(enc_self=dict(temperature=0.0)), "model.transformer.enc_self.temperature"),
    (dict(dec_self=dict(top_k=0)), "model.transformer.dec_self.top_k"),
    (dict(pos_encoding="rope", enc_self=dict(score="additive")), "transformer.enc_self.*RoPE"),
    (dict(pos_encoding="rope", dec_self=dict(score="general")), "transformer.dec_self.*RoPE"),
    (dict(pos_encoding="rope", d_model=12, num_heads=4), "odd"),
    (dict(pos_encoding="alibi", dec_self=dict(scope="linear")), "transformer.dec_self.*ALiBi"),
    (dict(cross=dict(scope="linear", score="general")), "transformer.cross.*feature map"),
    (dict(enc_self=dict(scope="linear", normalizer="sparsemax")), "model.transformer.enc_self"),
    # The RNN's settings are refused, naming where they belong, not silently ignored.
    (dict(pointer=True), "^model.rnn.pointer=True belongs to model.arch=rnn; model.arch="
                         "transformer reads model.transformer.. and the shared model.. fields. A preset"),
    (dict(match_params_of="bahdanau"), "model.rnn.match_params_of='bahdanau' belongs"),
    (dict(normalizer="entmax15"), "model.rnn.normalizer='entmax15' belongs to model.arch=rnn"),
    (dict(score="dot"), "model.rnn.score='dot' belongs"),
    (dict(decoder="none"), "model.rnn.decoder='none' belongs"),
    (dict(emb_dim=64), "model.rnn.emb_dim=64 belongs"),
])
def test_bad_transformer_configs_are_config_errors(kw, match):
  """Names, ranges and settings of the other architecture fail on construction; what needs an
  abstract evaluation of the attention fails in validate()."""
  with pytest.raises(ConfigError, match=match):
    _cfg(**kw).validate()


def test_good_combinations_are_accepted():
  _cfg(fused=True).validate()  # an RNN-only check (fused decoder) must not apply
  # RoPE leaves cross-attention alone
  _cfg(pos_encoding="rope", cross=dict(score="additive")).validate()
  _cfg(pos_encoding="alibi", cross=dict(scope="linear")).validate()
  _cfg(dec_self=dict(scope="linear")).validate()  # causal linear attention


def test_roles_are_nested_config_sections():
  import ml_collections
  c = configurable.config_dict(ModelConfig, arch="transformer",
                               transformer=dict(cross=dict(scope="topk", top_k=4)))
  t = c.transformer
  assert isinstance(t.enc_self, ml_collections.ConfigDict) and t.cross.top_k == 4
  c.lock()
  t.enc_self.scope = "window"  # what --config.model.transformer.enc_self.scope=window sets
  with pytest.raises(AttributeError):
    t.enc_self.scop = "window"  # typos fail on a locked config
  mc = ModelConfig.from_config(c, src_vocab=V_SRC, tgt_vocab=V_TGT)
  tc = mc.transformer
  assert tc.enc_self == AttentionRole(scope="window") and tc.cross.scope == "topk"
  assert tc.dec_self == AttentionRole()
  with pytest.raises(ConfigError, match="model.transformer.cross"):
    ModelConfig.from_config(dict(arch="transformer", transformer=dict(cross=dict(scopes="topk"))),
                            src_vocab=5, tgt_vocab=5)
