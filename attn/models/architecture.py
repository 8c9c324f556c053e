"""What a model architecture provides, so that training, decoding, the run viewer and the
diagnosis run it without knowing which one it is (`model.arch` names a registered class:
attn.models.registries.ARCHS). Seq2Seq (arch "rnn") and Transformer (arch "transformer")
implement it; docs/architectures.md shows how to add a third.

Axis names: B batch, Ts source length, Tt target length, V target vocabulary (a
pointer-generator decodes on V + Ts), E the source embedding size.

Batches (attn.data): src [B, Ts], src_lengths [B], tgt [B, Tt] (target then EOS, PAD-padded),
tgt_lengths [B]; src_ext / tgt_ext on the source-extended vocabulary when data.extended_vocab.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Protocol, runtime_checkable

import jax

from attn.models.config import ModelConfig


@runtime_checkable
class Architecture(Protocol):
  """A model registered in ARCHS: `Cls(cfg, *, rngs, compute_dtype)` builds it (float32
  parameters; `compute_dtype` is the matmuls' operand dtype)."""

  # -- class-level facts, read without building the model

  settings: ClassVar[type]
  """The dataclass of its section of the model config, `model.<arch>` (a field of ModelConfig
  named after the registered arch, defaulting to `settings()`)."""

  @staticmethod
  def check_config(cfg: ModelConfig) -> None:
    """ConfigError naming the field for settings it cannot run: names, ranges, combinations.
    Runs in ModelConfig.__post_init__, on every construction and `replace`: no JAX."""

  @staticmethod
  def check_shapes(cfg: ModelConfig) -> None:
    """ConfigError for what only an abstract evaluation finds (a score that does not fit its
    query and key sizes). Runs once, in ModelConfig.validate()."""

  @staticmethod
  def attends(cfg: ModelConfig) -> bool:
    """Whether the model forms attention weights over the source."""

  @staticmethod
  def describe(cfg: ModelConfig) -> dict:
    """The attention variant a run reports: decoder, score, normalizer, scope, temperature
    (results.json, logs, attention.npz, the viewer's labels)."""

  @staticmethod
  def forward_flops(cfg: ModelConfig, B: int, Ts: int, Tt: int) -> int:
    """Matmul FLOPs of the teacher-forced forward pass on a padded [B, Ts] -> [B, Tt] batch."""

  @staticmethod
  def output_width(cfg: ModelConfig) -> int:
    """Width D of the features the [D, V] output layer reads."""

  @staticmethod
  def length_limits(cfg: ModelConfig) -> dict[str, tuple[str, int, str]]:
    """The widest batch it takes on each side it bounds (a learned position table, a
    `location` score's weights): {"source" | "target": (the model field that bounds it, its
    value, the setting that makes it a bound)}; a side left out takes any width. Checked
    against the data's widest batch before a run starts."""

  # -- training

  cfg: ModelConfig

  def __call__(self, batch: dict, dropout_key: jax.Array | None = None) -> tuple[Any, Any]:
    """Teacher-forced logits [B, Tt, V] float32 and attention weights [B, Tt, Ts] (None when
    never formed, e.g. fused); dropout only with a key."""

  # -- decoding (attn.decoding)

  longest_output: int | None
  """The most tokens one search may emit (a learned position table's length); None = any."""

  def initial_decode_state(self, src: jax.Array, src_lengths: jax.Array,
                           src_ext: jax.Array | None = None, *, max_len: int | None = None):
    """The search state for sources src [B, Ts] (a pytree, every leaf [B, ...]); src_ext: the
    pointer-generator's extended-vocabulary source ids; max_len: the most steps the search
    takes (a cache length; unused by a recurrent state)."""

  def step_fn(self) -> Callable:
    """`step(state, y_prev [B]) -> (state, log_probs [B, V] float32, weights [B, Ts])`,
    optionally with a fourth item of extras (e.g. {"p_gen": [B]})."""

  # -- inspection (the run viewer, attention.npz, the diagnosis)

  def attention(self, batch: dict, dropout_key: jax.Array | None = None,
                embed_offset: jax.Array | None = None) -> tuple[Any, Any]:
    """Teacher-forced logits [B, Tt, V] and the StepAttention (attn.models.decoders): weights
    [B, Tt, Ts], the raw scores behind them, a multi-head model's `heads`; None when never
    formed. embed_offset [B, Ts, E] is added to the source embeddings (its gradient is the
    gradient with respect to them: attribution)."""

  # -- diagnosis (attn.inspection.diagnosis)

  def counterfactual(self, batch: dict, intervene: Callable) -> tuple[Any, Any, Any]:
    """Teacher-forced logits along batch["tgt"], the logits each step would have had with its
    attention replaced by `intervene(weights, mask, draw)` (the prefix attending as it did),
    and the StepAttention: (logits, logits_cf [B, Tt, V], StepAttention)."""

  # The encoder exposes its source token lookup as `encoder.embed` (an nnx.Embed; the
  # attribution's embedding gradient and the diagnosis read it).
  encoder: Any


METHODS = ("__call__", "initial_decode_state", "step_fn", "attention", "counterfactual")
CLASS_FACTS = ("check_config", "check_shapes", "attends", "describe", "forward_flops",
               "output_width", "length_limits")
