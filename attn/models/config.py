"""The one boundary from ml_collections config to model code: frozen dataclasses, checked cheaply.

Every model setting and its default lives here. `ModelConfig` holds what every architecture
reads (`model.arch`, the layer counts, dropout, ...) and one nested section per architecture,
named after it: `model.rnn.*` (RNNConfig) and `model.transformer.*` (TransformerConfig). Only the
section of the chosen `model.arch` takes effect; a value set in another one is refused (a sweep
over a setting the model ignores would train one model N times). `experiments/configs/*.py`
build their `model` section from this class (`attn.config.configurable.config_dict`) and presets
only override it.

Constructing or replacing a config runs no JAX: `__post_init__` checks names and ranges only.
The checks that need an abstract evaluation (a score that does not fit its decoder's sizes) run
once, in `ModelConfig.validate()`, which the training loop's validation step calls.
"""

from __future__ import annotations

import dataclasses

from attn import registry
from attn.config import configurable
from attn.config.configurable import option
from attn.errors import ConfigError
from attn.models import registries

# The attention primitives' registries, which the fields below name entries of.
_SCORES, _NORMALIZERS, _SCOPES = (registry.VARIANTS[k] for k in ("score", "normalizer", "scope"))


def _kernel_targets():
  from kernels import targets  # pylint: disable=import-outside-toplevel  (only when one is named)
  return targets.TARGETS


@dataclasses.dataclass(frozen=True)
class AttentionRole:
  """The variant of one of the Transformer's attentions (encoder self-attention, decoder
  self-attention, cross-attention), each a nested section: `--config.model.transformer.cross.
  scope=topk`. Checked by the model that uses it (attn.models.transformer.Transformer)."""
  score: str = option("scaled_dot", "dot | scaled_dot | general | additive (attn registry; "
                      "additive's size is the head size)", names=_SCORES)
  normalizer: str = option("softmax", "softmax | sparsemax | entmax15", names=_NORMALIZERS)
  temperature: float = option(1.0, "divides the scores before the normalizer")
  scope: str = option("global", "global | window | topk | linear (attn registry; window is "
                      "centred at each query's position)", names=_SCOPES)
  half_width: int = option(5, "scope=window: query i sees keys |j - i| <= half_width")
  top_k: int = option(8, "scope=topk: each query keeps its top_k highest-scoring keys")

  def replace(self, **kw) -> "AttentionRole":
    return dataclasses.replace(self, **kw)


@dataclasses.dataclass(frozen=True)
class RNNConfig:
  """The recurrent encoder-decoder's settings (model.arch=rnn, attn.models.seq2seq.Seq2Seq)."""
  emb_dim: int = option(128, "embedding size")
  enc_hidden: int = option(256, "encoder hidden size per direction")
  dec_hidden: int = option(256, "decoder hidden size")
  bidirectional: bool = option(True, "bidirectional encoder")
  cell: str = option("gru", "gru | lstm", names=registries.CELLS)
  decoder: str = option("bahdanau", "none | bahdanau | luong (registered decoders)",
                        names=registries.DECODERS)
  score: str = option("additive", "dot | scaled_dot | general | additive | location (attn "
                      "registry)", names=_SCORES)
  normalizer: str = option("softmax", "softmax | sparsemax | entmax15", names=_NORMALIZERS)
  temperature: float = option(1.0, "divides the scores before the normalizer")
  scope: str = option("global", "global | local_m | local_p | window | topk", names=_SCOPES)
  half_width: int = option(5, "D of local windows")
  top_k: int = option(8, "scope=topk: each query keeps its top_k highest-scoring keys")
  d_attn: int = option(256, "additive / local-p attention size")
  input_feeding: bool = option(True, "Luong: feed h~_{t-1} into the RNN")
  pointer: bool = option(
      False, "pointer-generator (See et al. 2017): p_gen mixes the vocabulary distribution with "
      "the attention over the source, on each example's source-extended vocabulary (needs "
      "data.extended_vocab and a shared vocabulary)")
  coverage: bool = option(
      False, "coverage (See et al. 2017): the sum of earlier attention enters the additive score, "
      "and coverage_loss_weight * sum_i min(a_i, c_i) joins the loss (decoder=bahdanau, "
      "score=additive); may be switched on when resuming a run trained without it")
  coverage_loss_weight: float = option(1.0, "weight of the coverage loss (model.rnn.coverage)")
  match_params_of: str = option(
      "", "a decoder name: choose dec_hidden so this model has that decoder's parameter count "
      "(the fair no-attention baseline); '' = off", names=registries.DECODERS, also=("",))

  @property
  def enc_out_dim(self) -> int:
    return self.enc_hidden * (2 if self.bidirectional else 1)

  def replace(self, **kw) -> "RNNConfig":
    return dataclasses.replace(self, **kw)


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
  """The Transformer's settings (model.arch=transformer, attn.models.transformer.Transformer)."""
  d_model: int = option(256, "width of the embeddings and the residual stream")
  num_heads: int = option(4, "attention heads (head size d_model / num_heads)")
  d_ff: int = option(1024, "inner size of the feed-forward blocks")
  ff_activation: str = option("relu", "relu | gelu")
  pos_encoding: str = option(
      "sinusoidal", "none | sinusoidal | learned | rope | alibi (registered; rope and alibi act "
      "on self-attention only)", names=registries.POS_ENCODINGS)
  tie_embeddings: bool = option(
      False, "the output layer is the target embedding matrix transposed (Press & Wolf 2017)")
  share_embeddings: bool = option(
      False, "the source embedding is the target embedding (one vocabulary: data.shared_vocab"
             "=True); with tie_embeddings, one matrix for all three (Press & Wolf 2017)")
  max_tgt_len: int = option(
      128, "decoding's key/value cache length (the most tokens one search can emit) and the "
      "learned target-position table's length")
  enc_self: AttentionRole = option(AttentionRole(), "encoder self-attention")
  dec_self: AttentionRole = option(AttentionRole(), "decoder (causal) self-attention")
  cross: AttentionRole = option(AttentionRole(), "decoder-encoder attention")

  @property
  def d_head(self) -> int:
    return self.d_model // self.num_heads

  def replace(self, **kw) -> "TransformerConfig":
    return dataclasses.replace(self, **kw)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Model hyper-parameters: the fields every architecture reads, then one section per
  architecture (its `settings` class, under its registered name). src_vocab / tgt_vocab come
  from the data, not the config."""
  src_vocab: int = option(0, "source vocabulary size (from the data)", derived=True)
  tgt_vocab: int = option(0, "target vocabulary size (from the data)", derived=True)
  arch: str = option("rnn", "rnn | transformer (registered architectures); each reads the "
                     "fields here and its own section, model.<arch>.*", names=registries.ARCHS)
  enc_layers: int = option(1, "encoder layers")
  dec_layers: int = option(1, "decoder layers")
  dropout: float = option(0.2, "dropout rate")
  fused: bool | str = option(False, "run attention through the fused kernels where the variant "
                             "supports it (RNN: Luong without input feeding, dot/scaled_dot/"
                             "additive); True = kernel target 'auto', or a target's name "
                             "(kernels.targets: triton, mosaic_gpu, tpu, cpu_blocked, ...)",
                             names=_kernel_targets, also=("auto",))
  max_src_len: int = option(128, "the longest source the `location` score (and a Transformer's "
                            "learned positions) can address")
  rnn: RNNConfig = option(RNNConfig(), "the recurrent model's settings (model.arch=rnn)")
  transformer: TransformerConfig = option(TransformerConfig(), "the Transformer's settings "
                                          "(model.arch=transformer)")

  # Fields a resumed run may switch from False to True (its checkpoints gain zero-initialized
  # parameters), as dotted paths: coverage is trained on for a last phase (See et al. 2017).
  SWITCH_ON_WHEN_RESUMING = ("rnn.coverage",)

  def __post_init__(self):
    # The registry names of every section (arch, fused, rnn.score, transformer.cross.scope, ...),
    # also for a config built here rather than from a config file (configurable.from_config).
    if not isinstance(self.fused, (bool, str)):  # (the command line parses it as a literal)
      raise ConfigError(f"model.fused={self.fused!r}: give True, False, 'auto' or a kernel "
                        "target's name (kernels.targets)")
    configurable.check_names(ModelConfig, self, section="model")
    _check_unread_sections(self)
    if min(self.src_vocab, self.tgt_vocab) < 1:
      raise ConfigError(f"model vocabularies must be non-empty (set from the data), got "
                        f"src_vocab={self.src_vocab}, tgt_vocab={self.tgt_vocab}")
    if not 0.0 <= self.dropout < 1.0:
      raise ConfigError(f"model.dropout must be in [0, 1), got {self.dropout}")
    if min(self.enc_layers, self.dec_layers, self.max_src_len) < 1:
      raise ConfigError("model.enc_layers, dec_layers and max_src_len must be positive")
    self.architecture.check_config(self)  # names and ranges of its section: no JAX

  @property
  def architecture(self):
    """The registered class of `arch` (attn.models.architecture.Architecture)."""
    return registries.ARCHS.get(self.arch)

  @property
  def settings(self):
    """The chosen architecture's section (an RNNConfig or a TransformerConfig)."""
    return getattr(self, self.arch)

  def validate(self) -> "ModelConfig":
    """The checks that need JAX (one abstract evaluation of each attention the model forms on
    its sizes), so a pairing the model cannot run fails here rather than mid-training. Raises
    ConfigError; returns self."""
    self.architecture.check_shapes(self)
    return self

  def length_limits(self) -> dict[str, tuple[str, int, str]]:
    """The widest batch the model takes on each side it bounds: {"source" | "target": (the model
    field that bounds it, its value, the setting that makes it a bound)}; a side left out takes
    any width (the architecture's `length_limits`)."""
    return self.architecture.length_limits(self)

  @property
  def has_attention(self) -> bool:
    return self.architecture.attends(self)

  @property
  def variant(self) -> dict:
    """decoder, score, normalizer, scope, temperature of the attention the run reports (for a
    Transformer: decoder "transformer" and its cross-attention's settings)."""
    return self.architecture.describe(self)

  def replace(self, **kw) -> "ModelConfig":
    return dataclasses.replace(self, **kw)

  def replace_paths(self, values: dict) -> "ModelConfig":
    """A copy with each field at a dotted path ("dec_layers", "rnn.coverage") set to its value."""
    out = self
    for path, value in values.items():
      out = _replace_path(out, path, value)
    return out

  def record(self) -> dict:
    """The settings that take effect, as a nested dict: every shared field and the chosen
    architecture's section (what model.json and results.json record)."""
    out = dataclasses.asdict(self)
    for name in section_names():
      if name != self.arch:
        del out[name]
    return out

  @classmethod
  def from_config(cls, cfg, *, src_vocab, tgt_vocab) -> "ModelConfig":
    """From an ml_collections ConfigDict (the `model` section); unknown fields are errors (a
    field that moved into an architecture's section says where it went)."""
    given = configurable.as_dict(cfg)
    moved = sorted(k for k in given if k in SECTION_OF)
    if moved:
      raise ConfigError("; ".join(f"model.{k} is now model.{SECTION_OF[k]}.{k}" for k in moved)
                        + " (each architecture's settings have their own section)")
    return configurable.from_config(cls, given, section="model", src_vocab=src_vocab,
                                    tgt_vocab=tgt_vocab)


def check_attention_numbers(where: str, settings) -> None:
  """The numbers of one attention's settings (a Transformer role, model.rnn), each architecture's
  one check of them: temperature > 0; half_width and top_k, where the section has them, >= 1
  (a scope reads them only inside the first traced step). ConfigError naming `where`.field."""
  if not settings.temperature > 0:
    raise ConfigError(f"{where}.temperature must be > 0, got {settings.temperature}")
  for name in ("half_width", "top_k"):
    value = getattr(settings, name, None)
    if value is not None and value < 1:
      raise ConfigError(f"{where}.{name} must be positive, got {value}")


def _replace_path(obj, path: str, value):
  head, _, rest = path.partition(".")
  new = value if not rest else _replace_path(getattr(obj, head), rest, value)
  return dataclasses.replace(obj, **{head: new})


def section_names() -> list[str]:
  """ModelConfig's architecture sections (each named after its registered architecture)."""
  return [f.name for f in configurable.settable_fields(ModelConfig)
          if configurable.is_section(f.default)]


def _first_set(obj, default, prefix: str):
  """(dotted name, value) of the first field of `obj` that differs from `default`, else None."""
  for f in dataclasses.fields(obj):
    got, want = getattr(obj, f.name), getattr(default, f.name)
    if got == want:
      continue
    if configurable.is_section(want):
      return _first_set(got, want, f"{prefix}{f.name}.")
    return f"{prefix}{f.name}", got
  return None


def _check_unread_sections(cfg: ModelConfig) -> None:
  """A value set in a section the chosen architecture does not read is a ConfigError."""
  defaults = ModelConfig.__dataclass_fields__
  for name in section_names():
    if name == cfg.arch:
      continue
    found = _first_set(getattr(cfg, name), defaults[name].default, f"model.{name}.")
    if found:
      raise ConfigError(
          f"{found[0]}={found[1]!r} belongs to model.arch={name}; model.arch={cfg.arch} reads "
          f"model.{cfg.arch}.* and the shared model.* fields. A preset (or a --config override) "
          f"set it: to run a preset's task on model.arch={cfg.arch}, use a preset of that "
          f"architecture (e.g. translate.py's *_transformer presets) or, in a config file, "
          f"experiments.configs.use_arch(config, {cfg.arch!r}), which puts the other sections "
          "back to their defaults")


def _section_of() -> dict[str, str]:
  out = {}
  for name in section_names():
    for f in configurable.settable_fields(type(ModelConfig.__dataclass_fields__[name].default)):
      assert f.name not in out, f"model.{f.name} is in two sections"
      out[f.name] = name
  return out


# A field's name -> the section that holds it (each name is in one section).
SECTION_OF = _section_of()
for _field, _section in SECTION_OF.items():
  configurable.MOVED[f"model.{_field}"] = f"model.{_section}.{_field}"


def migrate_model_section(model: dict) -> dict:
  """A `model` section written before each architecture had its own section (every field flat at
  `model.*`, as config.json and model.json were) in today's layout: a flat field of the chosen
  architecture moves into its section; another architecture's never took effect and is dropped.
  A section already in today's layout is returned as it is."""
  model = dict(model)
  arch = model.get("arch", ModelConfig.__dataclass_fields__["arch"].default)
  for k in [k for k in model if k in SECTION_OF]:
    value = model.pop(k)
    if SECTION_OF[k] == arch:
      model[arch] = {**configurable.as_dict(model.get(arch, {})), k: value}
  return model
