"""The one boundary from ml_collections config to model code: a frozen, validated dataclass."""

from __future__ import annotations

import dataclasses

from attn import registry


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Seq2seq model hyper-parameters.

  decoder: registered decoder name ("none", "bahdanau", "luong").
  cell: registered recurrent cell ("gru", "lstm").
  score / normalizer / scope: registered attention variants used by the decoder.
  half_width: D of local-m / local-p windows. input_feeding: Luong's h~_{t-1} fed to the RNN.
  fused: Luong without input feeding runs all target steps through one fused kernel call
    (attn.attend(fused=True): dot / scaled_dot / additive scores, softmax, global scope).
  """
  src_vocab: int
  tgt_vocab: int
  emb_dim: int = 128
  enc_hidden: int = 256
  dec_hidden: int = 256
  enc_layers: int = 1
  dec_layers: int = 1
  bidirectional: bool = True
  cell: str = "gru"
  dropout: float = 0.2
  decoder: str = "bahdanau"
  score: str = "additive"
  normalizer: str = "softmax"
  temperature: float = 1.0
  scope: str = "global"
  half_width: int = 5
  d_attn: int = 256
  input_feeding: bool = True
  fused: bool = False
  max_src_len: int = 128  # the longest source the `location` score can address

  def __post_init__(self):
    for kind, name in (("decoder", self.decoder), ("cell", self.cell), ("score", self.score),
                       ("normalizer", self.normalizer), ("scope", self.scope)):
      registry.get(name, kind)  # unknown names fail here with the list of known ones
    if self.fused and (self.decoder != "luong" or self.input_feeding
                       or self.score not in ("dot", "scaled_dot", "additive")
                       or self.normalizer != "softmax" or self.scope != "global"):
      raise ValueError(
          "model.fused=True runs the fused kernels: it needs decoder='luong', input_feeding=False, "
          "score in dot/scaled_dot/additive, normalizer='softmax', scope='global'; got "
          f"decoder={self.decoder!r}, input_feeding={self.input_feeding}, score={self.score!r}, "
          f"normalizer={self.normalizer!r}, scope={self.scope!r}")
    if not 0.0 <= self.dropout < 1.0:
      raise ValueError(f"model.dropout must be in [0, 1), got {self.dropout}")
    if min(self.emb_dim, self.enc_hidden, self.dec_hidden, self.enc_layers, self.dec_layers) < 1:
      raise ValueError("model sizes and layer counts must be positive")

  @property
  def enc_out_dim(self) -> int:
    return self.enc_hidden * (2 if self.bidirectional else 1)

  def replace(self, **kw) -> "ModelConfig":
    return dataclasses.replace(self, **kw)

  @classmethod
  def from_config(cls, cfg, *, src_vocab, tgt_vocab) -> "ModelConfig":
    """From an ml_collections ConfigDict (the `model` section); unknown fields are errors."""
    fields = {f.name for f in dataclasses.fields(cls)} - {"src_vocab", "tgt_vocab"}
    given = dict(cfg)
    extra = set(given) - fields - {"match_params_of"}
    if extra:
      raise ValueError(f"unknown model config fields {sorted(extra)}; known: {sorted(fields)}")
    given.pop("match_params_of", None)
    return cls(src_vocab=src_vocab, tgt_vocab=tgt_vocab, **given)
