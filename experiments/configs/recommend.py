r"""Config for experiments/recommend.py: next-item recommendation on a generated interaction log
with planted trigger -> target pairs (attn.apps.recommend.data).

    python -m experiments.recommend --config=experiments/configs/recommend.py:default \
        --config.model.kind=gru --workdir=workdirs/rec_gru

Presets (the text after the colon): default (2,000 users, 300 items, histories of 10-40 items;
a few minutes on 2 cores), far (targets up to 24 items after their triggers, histories of 30-60
items), tiny (a few seconds, for tests). model.kind picks the model: sasrec
(causal self-attention), meanpool, gru; the baselines' feed-forward width is chosen so their
parameter count matches sasrec's (model.match_params). Every field can be overridden on the
command line (`--config.train.steps=100`); typos fail with a suggestion. Defaults live in the
dataclasses (attn.apps.recommend.data.InteractionConfig,
attn.apps.recommend.model.RecommenderConfig, attn.apps.recommend.task.RecTrainConfig); a preset
only overrides them.
"""

from attn.errors import ConfigError
from attn.apps.recommend.task import default_config

_PRESETS = {
    "default": {},
    # The trigger's target comes up to 24 items later, in histories of 30-60 items: a long
    # dependency for the GRU to carry, one attention hop for self-attention.
    "far": dict(data=dict(max_offset=24, min_len=30, max_len=60, pair_every=12)),
    "tiny": dict(
        data=dict(num_users=400, num_items=80, num_triggers=8, max_offset=4, min_len=8,
                  max_len=16, pair_every=6, batch_size=64),
        model=dict(dim=32, num_blocks=1, num_heads=2, ffn_dim=32),
        train=dict(steps=150, learning_rate=5e-3, warmup_steps=20, log_every=50, eval_every=75,
                   checkpoint_every=75, attention_samples=4)),
}


def get_config(preset: str = "default"):
  """The recommend config: every field at its dataclass default, then the preset's overrides."""
  preset = preset or "default"
  if preset not in _PRESETS:
    raise ConfigError(f"unknown recommend preset {preset!r}; known: {', '.join(sorted(_PRESETS))}")
  return default_config(**_PRESETS[preset])
