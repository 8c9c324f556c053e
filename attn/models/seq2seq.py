"""Encoder-decoder model, its loss, parameter counting and parameter-count matching.

Batches (from attn.data): src [B, Ts], src_lengths [B], tgt [B, Tt] (target then EOS, PAD-padded),
tgt_lengths [B]. The decoder input is BOS + tgt[:, :-1].
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import functools

from attn import core, registry
from attn.errors import ConfigError
from attn.models import copying
from attn.models import registries
from attn.models import decoders as _decoders  # noqa: F401  (registers the decoders)
from attn.models.config import ModelConfig, RNNConfig, check_attention_numbers
from attn.models.encoder import Encoder
from attn.data.tokens import BOS


@registries.ARCHS.register("rnn")
class Seq2Seq(nnx.Module):
  """compute_dtype: "float32" | "bfloat16", the operand dtype of the encoder's and decoder's
  matmuls (attn.models.layers: float32 accumulation, float32 parameters, activations, logits).

  An `attn.models.architecture.Architecture`: its class-level facts (`check_config`,
  `check_shapes`, `attends`, ...) are read without building a model."""

  settings = RNNConfig  # its section, model.rnn

  @staticmethod
  def check_config(cfg: ModelConfig) -> None:
    """ConfigError, naming the field, for settings this model cannot run (no JAX)."""
    r = cfg.rnn
    # (its registry names are checked by ModelConfig: configurable.option(names=...))
    if min(r.emb_dim, r.enc_hidden, r.dec_hidden) < 1:
      raise ConfigError("model.rnn.emb_dim, enc_hidden and dec_hidden must be positive")
    check_attention_numbers("model.rnn", r)
    if cfg.fused:
      why = (registries.DECODERS.get(r.decoder).fused_unsupported(cfg)
             or core.fused_unsupported(r.score, r.normalizer, r.scope))
      if why:
        raise ConfigError(f"model.fused={cfg.fused!r}: {why}")  # True, "auto" or a target
    copying.check_config(cfg)

  @staticmethod
  def check_shapes(cfg: ModelConfig) -> None:
    """The score accepts the decoder's query and key sizes (e.g. `dot` needs them equal): traced
    abstractly on one query and two keys, so a bad pairing fails in validation rather than
    mid-training."""
    r = cfg.rnn
    decoder = registries.DECODERS.get(r.decoder)
    if not decoder.has_attention:
      return
    dq, dk, _ = decoder.attention_dims(cfg)
    why = _score_refuses(r.score, dq, dk, r.d_attn, cfg.max_src_len)
    if why:
      raise ConfigError(f"model.rnn.score={r.score!r} does not fit decoder {r.decoder!r} "
                        f"(queries of size {dq}, keys of size {dk}): {why}")

  @staticmethod
  def forward_flops(cfg: ModelConfig, B: int, Ts: int, Tt: int) -> int:
    from attn.models import cost  # pylint: disable=import-outside-toplevel
    return cost.recurrent_forward_flops(cfg, B, Ts, Tt)

  @staticmethod
  def output_width(cfg: ModelConfig) -> int:
    return cfg.rnn.dec_hidden  # the deep output's width: [dec_hidden, V]

  @staticmethod
  def attends(cfg: ModelConfig) -> bool:
    return registries.DECODERS.get(cfg.rnn.decoder).has_attention

  @staticmethod
  def length_limits(cfg: ModelConfig) -> dict[str, tuple[str, int, str]]:
    """A positional score (location: a weight per source position) bounds the source."""
    r = cfg.rnn
    if not (Seq2Seq.attends(cfg) and registry.get(r.score, "score").positional):
      return {}
    return {"source": ("model.max_src_len", cfg.max_src_len, f"model.rnn.score={r.score!r}")}

  @staticmethod
  def describe(cfg: ModelConfig) -> dict:
    """The attention variant a run reports (results, logs, attention.npz)."""
    return {"decoder": cfg.rnn.decoder, "score": cfg.rnn.score, "normalizer": cfg.rnn.normalizer,
            "scope": cfg.rnn.scope, "temperature": cfg.rnn.temperature}

  longest_output = None  # a recurrent decoder can emit any number of tokens

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, compute_dtype: str = "float32"):
    self.cfg = cfg
    self.encoder = Encoder(cfg, rngs=rngs, compute_dtype=compute_dtype)
    self.decoder = registries.DECODERS.get(cfg.rnn.decoder)(cfg, rngs=rngs,
                                                           compute_dtype=compute_dtype)

  def memory(self, src, src_lengths, dropout_key=None, embed_offset=None):
    """Encodes and prepares everything per-source the decoder needs (dict, leading axis B)."""
    return self.decoder.memory(self.encoder(src, src_lengths, dropout_key=dropout_key,
                                            embed_offset=embed_offset))

  def __call__(self, batch, dropout_key=None):
    """Teacher-forced logits [B, Tt, V] and attention weights [B, Tt, Ts] (None when fused)."""
    logits, att = self.attention(batch, dropout_key)
    return logits, None if att is None else att.weights

  def attention(self, batch, dropout_key=None, embed_offset=None):
    """Teacher-forced logits [B, Tt, V] and the StepAttention (weights and raw scores, each
    [B, Tt, Ts]; None when fused). embed_offset: [B, Ts, E] added to the source embeddings (a
    zero offset whose gradient is the gradient with respect to the embeddings)."""
    k_enc, k_dec = (None, None) if dropout_key is None else jax.random.split(dropout_key)
    memory = self.memory(batch["src"], batch["src_lengths"], k_enc, embed_offset)
    return self.decoder.teacher_force(memory, shift_right(batch["tgt"]), k_dec)

  def counterfactual(self, batch, intervene):
    """Teacher-forced logits along batch["tgt"], and the logits each step would have had with its
    attention replaced by `intervene(weights [B, 1, Ts], mask [B, 1, Ts], t)` (see
    decoders.RecurrentDecoder.counterfactual). Returns (logits, logits_cf [B, Tt, V],
    StepAttention [B, Tt, Ts])."""
    memory = self.memory(batch["src"], batch["src_lengths"])
    return self.decoder.counterfactual(memory, shift_right(batch["tgt"]), intervene)

  def step_fn(self):
    """`step(state, y_prev) -> (state, log_probs [B, V], weights [B, Ts])` for attn.decoding; the
    state carries the memory, so beam search tiles the source with the hypotheses.

    A pointer-generator's log_probs cover the source-extended vocabulary [B, V + Ts] (the state
    carries `src_ext`), and the step also returns extras {"p_gen": [B]}."""
    decoder = self.decoder
    pointer = self.cfg.rnn.pointer

    def step(state, y_prev):
      dec_state, logits, att = decoder.step(state["memory"], state["dec"], y_prev, state["t"])
      new = {**state, "dec": dec_state, "t": state["t"] + 1}
      if not pointer:
        return new, jax.nn.log_softmax(logits.astype(jnp.float32)), att.weights
      logp = copying.extended_log_probs(logits, att.p_gen_logit, att.weights, state["src_ext"])
      return new, logp, att.weights, {"p_gen": jax.nn.sigmoid(att.p_gen_logit)}

    return step

  def initial_decode_state(self, src, src_lengths, src_ext=None, *, max_len=None):
    """src_ext: [B, Ts] source ids on the extended vocabulary (pointer-generator only).
    max_len: the most steps the search will take; unused (a recurrent state has no length),
    taken so that callers can pass it to any architecture."""
    del max_len
    memory = self.memory(src, src_lengths)
    state = {"memory": memory, "dec": self.decoder.initial_state_from_memory(memory),
             "t": jnp.zeros((src.shape[0],), jnp.int32)}
    if self.cfg.rnn.pointer:
      if src_ext is None:
        raise ValueError("a pointer-generator decodes on the extended vocabulary: pass src_ext "
                         "(data.extended_vocab=True batches carry it)")
      state["src_ext"] = src_ext
    return state


@functools.lru_cache(maxsize=None)
def _score_refuses(score: str, dq: int, dk: int, d_attn: int, max_len: int) -> str | None:
  """What `score` raises on queries of size dq and keys of size dk (None if nothing), from one
  abstract evaluation (jax.eval_shape); cached per pairing."""
  def score_once():
    params = core.init_score(score, jax.random.PRNGKey(0), dq, dk, d_attn=d_attn,
                             max_len=max_len)
    return core.score(score, params, jnp.zeros((1, dq)), jnp.zeros((2, dk)))

  try:
    jax.eval_shape(score_once)
  except (ValueError, TypeError) as e:
    return str(e)
  return None


def shift_right(tgt):
  """Decoder input: BOS + tgt[:, :-1] ([B, Tt])."""
  return jnp.concatenate([jnp.full_like(tgt[:, :1], BOS), tgt[:, :-1]], axis=1)


def build_model(cfg: ModelConfig, seed: int = 0, compute_dtype: str = "float32") -> nnx.Module:
  """A freshly initialized model of architecture `cfg.arch` (Seq2Seq, Transformer): float32
  parameters, the same for every compute dtype."""
  return registries.ARCHS.get(cfg.arch)(cfg, rngs=nnx.Rngs(params=seed),
                                           compute_dtype=compute_dtype)


def count_params(model_or_cfg, build=None) -> int:
  """Number of trainable parameters, of a model or (without allocating) of a ModelConfig, the
  model `build(cfg)` makes (default: build_model)."""
  if isinstance(model_or_cfg, ModelConfig):
    model_or_cfg = nnx.eval_shape(lambda: (build or build_model)(model_or_cfg))
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(nnx.state(model_or_cfg, nnx.Param))))


def match_param_count(cfg: ModelConfig, reference: ModelConfig, build=None) -> ModelConfig:
  """`cfg` with model.rnn.dec_hidden chosen so its parameter count is as close as possible to
  `reference`'s
  (the fair fixed-vector baseline: same budget, no attention). Count grows with dec_hidden.
  build: what makes the model of a config (default build_model; e.g. the image captioner)."""
  count = functools.partial(count_params, build=build)
  target = count(reference)
  sized = lambda d: cfg.replace(rnn=cfg.rnn.replace(dec_hidden=d))
  lo, hi = 1, max(cfg.rnn.dec_hidden, 8)
  while count(sized(hi)) < target:
    hi *= 2
  while hi - lo > 1:
    mid = (lo + hi) // 2
    if count(sized(mid)) < target:
      lo = mid
    else:
      hi = mid
  return sized(min((lo, hi), key=lambda d: abs(count(sized(d)) - target)))


def sequence_loss(logits, tgt, tgt_lengths, label_smoothing=0.0):
  """Masked token cross-entropy. logits: [B, Tt, V]; tgt: [B, Tt]; tgt_lengths: [B].
  Returns (sum of token losses, number of tokens, sum of unsmoothed NLL) as float32 scalars.

  With smoothing a, the target distribution is (1 - a) onehot + a / V (optax.smooth_labels), so
  the token loss -sum_v q_v log p_v = lse - (1 - a) z_y - a mean_v z_v, lse = logsumexp_v z_v:
  one pass over the [B, Tt, V] logits for lse and the mean and a gather for z_y, instead of two
  optax.softmax_cross_entropy calls against one-hot [B, Tt, V] labels (three times the memory
  traffic). Same value up to float32 rounding (tests/test_models.py compares with NumPy).
  """
  logits = logits.astype(jnp.float32)
  mask = (jnp.arange(tgt.shape[1])[None, :] < tgt_lengths[:, None]).astype(jnp.float32)
  lse = jax.nn.logsumexp(logits, axis=-1)  # [B, Tt]
  z_y = jnp.take_along_axis(logits, tgt[..., None], axis=-1)[..., 0]  # [B, Tt]
  nll = lse - z_y
  smoothed = (lse - (1.0 - label_smoothing) * z_y - label_smoothing * jnp.mean(logits, axis=-1)
              if label_smoothing else nll)
  return jnp.sum(smoothed * mask), jnp.sum(mask), jnp.sum(nll * mask)
