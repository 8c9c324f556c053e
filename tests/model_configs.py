"""ModelConfigs and batches for the model tests. `model_config`: from one flat list of keywords: shared fields, model.rnn and
model.transformer fields alike (a Transformer role may be given as a dict), each put in its
section by name (attn.models.config.SECTION_OF)."""

import jax.numpy as jnp
import numpy as np

from attn.models.config import SECTION_OF, AttentionRole, ModelConfig, RNNConfig, TransformerConfig

ROLES = ("enc_self", "dec_self", "cross")


def model_config(**kw) -> ModelConfig:
  kw = {k: AttentionRole(**v) if k in ROLES and isinstance(v, dict) else v for k, v in kw.items()}
  rnn = {k: kw.pop(k) for k in list(kw) if SECTION_OF.get(k) == "rnn"}
  transformer = {k: kw.pop(k) for k in list(kw) if SECTION_OF.get(k) == "transformer"}
  return ModelConfig(**kw, rnn=RNNConfig(**rnn), transformer=TransformerConfig(**transformer))


def random_batch(src_lengths, tgt_lengths, Ts, Tt, v_src, v_tgt, seed=0) -> dict:
  """A padded batch of random ids in [4, v) (past the reserved ids), PAD (0) past each length:
  src [B, Ts], tgt [B, Tt] int32 and their lengths [B]."""
  rng = np.random.default_rng(seed)
  batch = {}
  for side, lengths, T, v in (("src", src_lengths, Ts, v_src), ("tgt", tgt_lengths, Tt, v_tgt)):
    ids = rng.integers(4, v, (len(lengths), T))
    ids[np.arange(T)[None, :] >= np.asarray(lengths)[:, None]] = 0
    batch[side] = jnp.asarray(ids, jnp.int32)
    batch[f"{side}_lengths"] = jnp.asarray(lengths, jnp.int32)
  return batch
