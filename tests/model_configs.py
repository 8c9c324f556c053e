"""ModelConfigs for tests, from one flat list of keywords: shared fields, model.rnn and
model.transformer fields alike (a Transformer role may be given as a dict), each put in its
section by name (attn.models.config.SECTION_OF)."""

from attn.models.config import SECTION_OF, AttentionRole, ModelConfig, RNNConfig, TransformerConfig

ROLES = ("enc_self", "dec_self", "cross")


def model_config(**kw) -> ModelConfig:
  kw = {k: AttentionRole(**v) if k in ROLES and isinstance(v, dict) else v for k, v in kw.items()}
  rnn = {k: kw.pop(k) for k in list(kw) if SECTION_OF.get(k) == "rnn"}
  transformer = {k: kw.pop(k) for k in list(kw) if SECTION_OF.get(k) == "transformer"}
  return ModelConfig(**kw, rnn=RNNConfig(**rnn), transformer=TransformerConfig(**transformer))
