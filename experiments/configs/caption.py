r"""Config for experiments/caption.py: show, attend and tell in miniature (digit strips).

    python -m experiments.caption --config=experiments/configs/caption.py:default \
        --workdir=workdirs/caption/bahdanau
    # the no-attention decoder (the mean region feature) at the same parameter count
    python -m experiments.caption --config=experiments/configs/caption.py:default \
        --config.model.rnn.decoder=none --config.model.rnn.match_params_of=bahdanau \
        --workdir=workdirs/caption/none

Presets (the text after the colon): default (a strip of 6 cells, 1-4 digits, distractors in
half of the other cells; ~2,000 steps, a few minutes on 2 CPU cores), tiny (for tests: 3 cells of 12px, 1-2 digits, one font, no distractors,
small model and images, a few steps). Every field can be overridden on the command line; the data fields
and their defaults live in attn.apps.caption.data.CaptionDataConfig, the model's in
attn.models.ModelConfig (model.rnn.*: decoder, score, normalizer, sizes), the training's in
attn.training.TrainConfig; a preset only overrides them.
"""

import ml_collections

from attn.config import configurable
from attn.apps.caption.data import CaptionDataConfig
from attn.errors import ConfigError
from attn.models.config import ModelConfig
from attn.training.config import TrainConfig

_RNN = dict(emb_dim=32, enc_hidden=64, dec_hidden=96, d_attn=64, bidirectional=False,
            decoder="bahdanau", score="additive")

_PRESETS = {
    "default": dict(
        data=dict(cells=6, min_digits=1, max_digits=4, batch_size=64),
        model=dict(dropout=0.1, rnn=_RNN),
        train=dict(steps=2000, learning_rate=3e-3, warmup_steps=100, eval_every=500,
                   checkpoint_every=500, log_every=100, eval_decode_sentences=500,
                   attention_samples=32)),
    "tiny": dict(
        data=dict(cells=3, cell_px=12, min_digits=1, max_digits=2, distractor_rate=0.0,
                  fonts=("DejaVuSans.ttf",), max_rotate_deg=0.0, batch_size=32,
                  eval_examples=64, test_examples=64),
        model=dict(dropout=0.0, rnn=dict(_RNN, emb_dim=16, enc_hidden=32, dec_hidden=32,
                                         d_attn=32)),
        train=dict(steps=6, learning_rate=5e-3, warmup_steps=1, eval_every=6,
                   checkpoint_every=3, log_every=3, eval_decode_sentences=64,
                   attention_samples=4)),
}


def get_config(preset: str = "default"):
  """The caption config: every field of CaptionDataConfig, ModelConfig and TrainConfig at its
  dataclass default, then the preset's overrides."""
  preset = preset or "default"
  if preset not in _PRESETS:
    raise ConfigError(f"unknown caption preset {preset!r}; known: {', '.join(sorted(_PRESETS))}")
  p = _PRESETS[preset]
  c = ml_collections.ConfigDict()
  c.data = configurable.config_dict(CaptionDataConfig, **p["data"])
  c.model = configurable.config_dict(ModelConfig, **p["model"])
  c.train = configurable.config_dict(TrainConfig, **p["train"])
  return c
