"""The one boundary from ml_collections config to model code: a frozen, validated dataclass.

Every model setting and its default lives here; `experiments/configs/*.py` build their `model`
section from this class (`attn.config.configurable.config_dict`) and presets only override it.
"""

from __future__ import annotations

import dataclasses

from attn import registry
from attn.config import configurable
from attn.config.configurable import option
from attn.errors import ConfigError
from attn.models import registries


@dataclasses.dataclass(frozen=True)
class AttentionRole:
  """The variant of one of the Transformer's attentions (encoder self-attention, decoder
  self-attention, cross-attention), each a nested section: `--config.model.cross.scope=topk`.
  Validated by the model that uses it (attn.models.transformer.Transformer.check_config)."""
  score: str = option("scaled_dot", "dot | scaled_dot | general | additive (attn registry; "
                      "additive's size is the head size)")
  normalizer: str = option("softmax", "softmax | sparsemax | entmax15")
  temperature: float = option(1.0, "divides the scores before the normalizer")
  scope: str = option("global", "global | window | topk | linear (attn registry; window is "
                      "centred at each query's position)")
  half_width: int = option(5, "scope=window: query i sees keys |j - i| <= half_width")
  top_k: int = option(8, "scope=topk: each query keeps its top_k highest-scoring keys")

  def replace(self, **kw) -> "AttentionRole":
    return dataclasses.replace(self, **kw)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Seq2seq model hyper-parameters (src_vocab / tgt_vocab come from the data, not the config)."""
  src_vocab: int = option(0, "source vocabulary size (from the data)", derived=True)
  tgt_vocab: int = option(0, "target vocabulary size (from the data)", derived=True)
  emb_dim: int = option(128, "embedding size")
  enc_hidden: int = option(256, "encoder hidden size per direction")
  dec_hidden: int = option(256, "decoder hidden size")
  enc_layers: int = option(1, "encoder layers")
  dec_layers: int = option(1, "decoder layers")
  bidirectional: bool = option(True, "bidirectional encoder")
  cell: str = option("gru", "gru | lstm")
  dropout: float = option(0.2, "dropout rate")
  decoder: str = option("bahdanau", "none | bahdanau | luong (registered decoders)")
  score: str = option("additive", "dot | scaled_dot | general | additive | location (attn registry)")
  normalizer: str = option("softmax", "softmax | sparsemax | entmax15")
  temperature: float = option(1.0, "divides the scores before the normalizer")
  scope: str = option("global", "global | local_m | local_p | window | topk")
  half_width: int = option(5, "D of local windows")
  d_attn: int = option(256, "additive / local-p attention size")
  input_feeding: bool = option(True, "Luong: feed h~_{t-1} into the RNN")
  fused: bool = option(False, "run attention through the fused kernels (decoders and variants "
                       "that support it: Luong without input feeding, dot/scaled_dot/additive)")
  max_src_len: int = option(128, "the longest source the `location` score (and a Transformer's "
                            "learned positions) can address")
  pointer: bool = option(
      False, "pointer-generator (See et al. 2017): p_gen mixes the vocabulary distribution with "
      "the attention over the source, on each example's source-extended vocabulary (needs "
      "data.extended_vocab and a shared vocabulary)")
  coverage: bool = option(
      False, "coverage (See et al. 2017): the sum of earlier attention enters the additive score, "
      "and coverage_loss_weight * sum_i min(a_i, c_i) joins the loss (decoder=bahdanau, "
      "score=additive); may be switched on when resuming a run trained without it")
  coverage_loss_weight: float = option(1.0, "weight of the coverage loss (model.coverage=True)")
  match_params_of: str = option(
      "", "a decoder name: choose dec_hidden so this model has that decoder's parameter count "
      "(the fair no-attention baseline); '' = off")
  arch: str = option("rnn", "rnn | transformer (registered architectures); the Transformer "
                     "reads enc_layers, dec_layers, dropout, fused and the fields below, the RNN "
                     "the fields above")
  d_model: int = option(256, "transformer: width of the embeddings and the residual stream")
  num_heads: int = option(4, "transformer: attention heads (head size d_model / num_heads)")
  d_ff: int = option(1024, "transformer: inner size of the feed-forward blocks")
  ff_activation: str = option("relu", "transformer: relu | gelu")
  pos_encoding: str = option(
      "sinusoidal", "transformer: none | sinusoidal | learned | rope | alibi (registered; rope "
      "and alibi act on self-attention only)")
  tie_embeddings: bool = option(
      False, "transformer: the output layer is the target embedding matrix transposed "
      "(Press & Wolf 2017)")
  max_tgt_len: int = option(
      128, "transformer: decoding's key/value cache length (the most tokens one search can "
      "emit) and the learned target-position table's length")
  enc_self: AttentionRole = option(AttentionRole(), "transformer: encoder self-attention")
  dec_self: AttentionRole = option(AttentionRole(), "transformer: decoder (causal) "
                                   "self-attention")
  cross: AttentionRole = option(AttentionRole(), "transformer: decoder-encoder attention")

  # Fields a resumed run may switch from False to True (its checkpoints gain zero-initialized
  # parameters): coverage is trained on for a last phase (See et al. 2017).
  SWITCH_ON_WHEN_RESUMING = ("coverage",)

  def __post_init__(self):
    for field, kinds in (("arch", registries.ARCHS), ("decoder", registries.DECODERS),
                         ("cell", registries.CELLS), ("score", registry.VARIANTS["score"]),
                         ("normalizer", registry.VARIANTS["normalizer"]),
                         ("scope", registry.VARIANTS["scope"]),
                         ("match_params_of", registries.DECODERS)):
      name = getattr(self, field)
      if field == "match_params_of" and not name:
        continue
      if name not in kinds:
        raise ConfigError(f"unknown model.{field} {name!r}; known: {', '.join(kinds.names())}")
    registries.ARCHS.get(self.arch).check_config(self)  # raises ConfigError
    if min(self.src_vocab, self.tgt_vocab) < 1:
      raise ConfigError(f"model vocabularies must be non-empty (set from the data), got "
                        f"src_vocab={self.src_vocab}, tgt_vocab={self.tgt_vocab}")
    if not 0.0 <= self.dropout < 1.0:
      raise ConfigError(f"model.dropout must be in [0, 1), got {self.dropout}")
    if min(self.emb_dim, self.enc_hidden, self.dec_hidden, self.enc_layers, self.dec_layers) < 1:
      raise ConfigError("model sizes and layer counts must be positive")

  def check_recurrent(self):
    """The recurrent model's checks (arch=rnn; see Seq2Seq.check_config)."""
    self._check_attention_fits()
    if self.fused:
      from attn import core  # pylint: disable=import-outside-toplevel
      why = (registries.DECODERS.get(self.decoder).fused_unsupported(self)
             or core.fused_unsupported(self.score, self.normalizer, self.scope))
      if why:
        raise ConfigError(f"model.fused=True: {why}")
    self._check_copying()

  def _check_copying(self):
    """Pointer and coverage need attention formed one step at a time (coverage: the additive
    score, which it enters; both: the weights themselves, so no fused kernel)."""
    if not (self.pointer or self.coverage):
      return
    which = "model.pointer" if self.pointer else "model.coverage"
    if not self.has_attention:
      raise ConfigError(f"{which}=True needs an attention decoder (bahdanau or luong), "
                        f"not decoder={self.decoder!r}")
    if self.fused:
      raise ConfigError(f"{which}=True needs the attention weights, which model.fused=True "
                        "never forms")
    why = self.coverage and registries.DECODERS.get(self.decoder).coverage_unsupported(self)
    if why:
      raise ConfigError(f"model.coverage=True: {why}")
    if self.coverage_loss_weight < 0:
      raise ConfigError(f"model.coverage_loss_weight={self.coverage_loss_weight} must be >= 0")

  def _check_attention_fits(self):
    """The score accepts the decoder's query and key sizes (e.g. `dot` needs them equal): traced
    abstractly on one query and two keys, so a bad pairing fails here rather than mid-training."""
    decoder = registries.DECODERS.get(self.decoder)
    if not decoder.has_attention:
      return
    import jax  # pylint: disable=import-outside-toplevel
    import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
    from attn import core  # pylint: disable=import-outside-toplevel
    dq, dk, _ = decoder.attention_dims(self)

    def score_once():
      params = core.init_score(self.score, jax.random.PRNGKey(0), dq, dk, d_attn=self.d_attn,
                               max_len=self.max_src_len)
      return core.score(self.score, params, jnp.zeros((1, dq)), jnp.zeros((2, dk)))

    try:
      jax.eval_shape(score_once)
    except (ValueError, TypeError) as e:
      raise ConfigError(f"model.score={self.score!r} does not fit decoder {self.decoder!r} "
                        f"(queries of size {dq}, keys of size {dk}): {e}") from None

  @property
  def enc_out_dim(self) -> int:
    return self.enc_hidden * (2 if self.bidirectional else 1)

  @property
  def has_attention(self) -> bool:
    return registries.ARCHS.get(self.arch).attends(self)

  @property
  def variant(self) -> dict:
    """decoder, score, normalizer, scope, temperature of the attention the run reports (for a
    Transformer: decoder "transformer" and its cross-attention's settings)."""
    return registries.ARCHS.get(self.arch).describe(self)

  def replace(self, **kw) -> "ModelConfig":
    return dataclasses.replace(self, **kw)

  @classmethod
  def from_config(cls, cfg, *, src_vocab, tgt_vocab) -> "ModelConfig":
    """From an ml_collections ConfigDict (the `model` section); unknown fields are errors."""
    return configurable.from_config(cls, cfg, section="model", src_vocab=src_vocab,
                                    tgt_vocab=tgt_vocab)
