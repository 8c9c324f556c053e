"""The `train` section: LoopConfig (what the training loop reads), TrainConfig (a
sequence-to-sequence task's: the loop's settings, the optimizer's, evaluation and decoding), each
setting with its one default, and the optimizer built from a TrainConfig."""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import optax

from attn.config import configurable
from attn.config.configurable import option
from attn.decoding import Search
from attn.decoding.beam import STOP_RULES
from attn.errors import ConfigError
from attn.precision import AUTO, COMPUTE_DTYPES
from attn.training import distributed

_SCHEDULES = {
    "cosine": lambda c: optax.warmup_cosine_decay_schedule(
        0.0, c.learning_rate, c.warmup_steps, max(c.steps, c.warmup_steps + 1),
        c.learning_rate * c.end_lr_fraction),
    "rsqrt": lambda c: lambda step: c.learning_rate * jnp.minimum(
        (step + 1) / max(c.warmup_steps, 1), jnp.sqrt(max(c.warmup_steps, 1) / (step + 1))),
    "constant": lambda c: optax.linear_schedule(0.0, c.learning_rate, max(c.warmup_steps, 1)),
}


@dataclasses.dataclass(frozen=True)
class LoopConfig:
  """What the training loop itself reads of the `train` section (attn.training.loop): how long
  to train, when to log, evaluate and save, when to stop a diverging or over-budget run, the
  seed and the device mesh. A task's train section extends it with its own settings
  (`Task.train_config`): TrainConfig for sequence-to-sequence tasks, RecTrainConfig for
  recommendation; a subclass may give a field another default."""
  steps: int = option(2000, "optimizer steps")
  learning_rate: float = option(1e-3, "peak learning rate (after warm-up)")
  warmup_steps: int = option(100, "linear warm-up from 0")
  clip_norm: float = option(1.0, "global gradient-norm clipping")
  log_every: int = option(50, "steps between progress lines and train metrics")
  eval_every: int = option(500, "steps between evaluations (each saves best/ when it improves)")
  checkpoint_every: int = option(250, "steps between checkpoints (for resuming)")
  keep_checkpoints: int = option(
      1, "how many of the latest checkpoints checkpoints/ keeps; more than one lets "
         "experiments.average average the last few (every checkpoint_every steps)")
  divergence_factor: float = option(
      10.0, "stop (saving nothing more) when the training loss exceeds this multiple of "
      "the loss of a uniform guess (log of the target vocabulary, or of the item set); a "
      "non-finite loss always stops; 0 = only non-finite")
  max_wall_s: float = option(
      0.0, "stop training (then evaluate) after this much training time of the whole run, "
           "counted across resumes (a rerun that raises train.steps or switches a model "
           "feature on needs a larger budget; one that would train nothing is refused); 0 = off")
  mark_wall_s: tuple[float, ...] = option(
      (), "training times (s, as max_wall_s counts them) at which the run evaluates and keeps "
          "its best checkpoint so far under marks/wall_<s>s/, for scores at equal wall time "
          "(experiments.score --checkpoints=marks); () = none")
  seed: int = option(0, "parameter initialization and dropout seed")
  steps_per_call: int = option(
      1, "optimizer steps per compiled call: n > 1 runs up to n steps as one lax.scan over "
         "their stacked batches (batches of one shape: steps whose batches differ in shape run "
         "one by one), for models whose steps are too short to pay for a call each; progress "
         "lines, evaluations and saves still fall on their steps; one process only")
  compute_dtype: str = option(
      "float32", "float32 | bfloat16 | auto: the matmuls' input dtype (bfloat16 accumulates in "
      "float32); parameters, optimizer state, the loss and the normalizers stay float32. auto: "
      "bfloat16 where a short measurement of the model's matmul shapes on this machine finds it "
      "at least 10% faster (cached per CPU; bfloat16 on a GPU/TPU), else float32; a resumed run "
      "keeps the dtype it ran in (attn.training.dtype_choice)")
  mesh_shape: str = option(
      "", "device mesh as data[,model] sizes, e.g. '4' or '2,2'; '' = every device on the data "
      "axis")

  def __post_init__(self):
    def check(ok, msg):
      if not ok:
        raise ConfigError(f"train.{msg}")

    for field in dataclasses.fields(self):  # nan and inf pass every comparison below or none
      value = getattr(self, field.name)
      check(not isinstance(value, float) or math.isfinite(value),
            f"{field.name}={value} must be a finite number")
    check(self.steps >= 1, f"steps={self.steps} must be >= 1")
    check(self.learning_rate > 0, f"learning_rate={self.learning_rate} must be > 0")
    check(self.warmup_steps >= 0, f"warmup_steps={self.warmup_steps} must be >= 0")
    for name in ("log_every", "eval_every", "checkpoint_every"):
      check(getattr(self, name) >= 1, f"{name}={getattr(self, name)} must be >= 1")
    check(self.keep_checkpoints >= 1, f"keep_checkpoints={self.keep_checkpoints} must be >= 1")
    check(self.steps_per_call >= 1, f"steps_per_call={self.steps_per_call} must be >= 1")
    check(self.clip_norm > 0, f"clip_norm={self.clip_norm} must be > 0")
    check(self.divergence_factor >= 0,
          f"divergence_factor={self.divergence_factor} must be >= 0")
    check(self.max_wall_s >= 0, f"max_wall_s={self.max_wall_s} must be >= 0")
    marks = self.mark_wall_s
    marks = tuple(marks) if isinstance(marks, (tuple, list)) else (marks,)
    check(all(isinstance(m, (int, float)) and not isinstance(m, bool) and m > 0 for m in marks)
          and list(marks) == sorted(set(marks)),
          f"mark_wall_s={self.mark_wall_s!r} must be increasing times in seconds, > 0")
    object.__setattr__(self, "mark_wall_s", tuple(float(m) for m in marks))
    check(self.compute_dtype in (*COMPUTE_DTYPES, AUTO),
          f"compute_dtype={self.compute_dtype!r} unknown; known: "
          f"{', '.join((*COMPUTE_DTYPES, AUTO))}")
    distributed.parse_mesh_shape(self.mesh_shape)  # its ConfigError names train.mesh_shape

  def replace(self, **kw):
    return dataclasses.replace(self, **kw)

  @classmethod
  def from_config(cls, cfg):
    """The validated `train` section `cfg` (unknown fields refused, one ConfigError line)."""
    return configurable.from_config(cls, cfg, section="train")


@dataclasses.dataclass(frozen=True)
class TrainConfig(LoopConfig):
  """The `train` section of a sequence-to-sequence task: the loop's settings (LoopConfig), the
  optimizer's schedule and the loss's label smoothing, and the evaluation's and test decoding's
  settings.

  The batch size is a data setting (`data.batch_size`): the buckets are built from it.
  """
  schedule: str = option("cosine", "cosine | rsqrt | constant (after warm-up)")
  end_lr_fraction: float = option(0.1, "cosine decays to this fraction of the peak")
  weight_decay: float = option(0.0, "AdamW weight decay")
  label_smoothing: float = option(0.0, "label smoothing of the training loss")
  eval_decode_sentences: int = option(
      500, "sentences of the eval split decoded (greedy) for the eval score")
  beam_size: int = option(1, "test decoding beam; 1 = greedy")
  length_penalty: float = option(Search.length_penalty,
                                 "beam search length penalty alpha (GNMT)")
  beam_stop: str = option(
      Search.stop, "when beam search ends an example's search: bound (exact: no live "
      "hypothesis can still enter its beam_size best) or k_finished (once beam_size hypotheses "
      "have finished, as fairseq and JoeyNMT stop: fewer steps, not exact)")
  max_decode_ratio: float = option(1.5, "decode at most ratio * Ts + 10 tokens")
  max_decode_len: int = option(0, "and at most this many tokens (0 = no further cap)")
  min_decode_len: int = option(0, "no EOS before this many output tokens, EOS counted")
  block_repeat_ngram: int = option(
      0, "decoding never repeats an n-gram of this size within an output (3 = trigram "
      "blocking); 0 = off")
  coverage_penalty: float = option(
      0.0, "beam search coverage penalty beta (GNMT): beta * sum_i log min(attention on source "
      "token i, 1) is added to each hypothesis' score; 0 = off")
  attention_samples: int = option(64, "examples whose attention (weights and raw scores) goes "
                                  "to attention.npz, for the run viewer and the diagnosis")

  def __post_init__(self):
    def check(ok, msg):
      if not ok:
        raise ConfigError(f"train.{msg}")

    check(self.schedule in _SCHEDULES,
          f"schedule={self.schedule!r} unknown; known: {', '.join(sorted(_SCHEDULES))}")
    super().__post_init__()
    check(self.beam_size >= 1, f"beam_size={self.beam_size} must be >= 1")
    check(0.0 <= self.label_smoothing < 1.0,
          f"label_smoothing={self.label_smoothing} must be in [0, 1)")
    check(0.0 <= self.end_lr_fraction <= 1.0,
          f"end_lr_fraction={self.end_lr_fraction} must be in [0, 1]")
    check(self.weight_decay >= 0, f"weight_decay={self.weight_decay} must be >= 0")
    check(self.max_decode_ratio > 0, f"max_decode_ratio={self.max_decode_ratio} must be > 0")
    for name in ("max_decode_len", "min_decode_len", "block_repeat_ngram"):
      check(getattr(self, name) >= 0, f"{name}={getattr(self, name)} must be >= 0")
    check(self.length_penalty >= 0, f"length_penalty={self.length_penalty} must be >= 0")
    check(self.coverage_penalty >= 0, f"coverage_penalty={self.coverage_penalty} must be >= 0")
    check(self.beam_stop in STOP_RULES,
          f"beam_stop={self.beam_stop!r} unknown; known: {', '.join(STOP_RULES)}")
    check(not self.max_decode_len or self.min_decode_len <= self.max_decode_len,
          f"min_decode_len={self.min_decode_len} is over max_decode_len={self.max_decode_len}")
    check(self.eval_decode_sentences >= 0 and self.attention_samples >= 0,
          "eval_decode_sentences and attention_samples must be >= 0")

  def search(self):
    """The test decoding's search settings."""
    return Search(beam_size=self.beam_size, length_penalty=self.length_penalty,
                  min_len=self.min_decode_len, block_repeat_ngram=self.block_repeat_ngram,
                  coverage_penalty=self.coverage_penalty, stop=self.beam_stop)

  def max_output_len(self, src_width: int) -> int:
    """The most tokens decoded for sources of width `src_width`."""
    n = int(self.max_decode_ratio * src_width) + 10
    return min(n, self.max_decode_len) if self.max_decode_len else n


def make_optimizer(c: TrainConfig):
  """Adam(W) with warm-up/decay and global-norm clipping."""
  return optax.chain(optax.clip_by_global_norm(c.clip_norm),
                     optax.adamw(_SCHEDULES[c.schedule](c), weight_decay=c.weight_decay))


def config_record(config) -> str:
  """config.json's text: the experiment config (an ml_collections ConfigDict) as JSON, its
  `model` section holding only what takes effect (the shared fields and the chosen
  architecture's section; attn.models.ModelConfig.record)."""
  import json  # pylint: disable=import-outside-toplevel
  from attn.models.config import section_names  # pylint: disable=import-outside-toplevel
  out = json.loads(config.to_json_best_effort())
  model = out.get("model")
  if isinstance(model, dict):
    arch = model.get("arch", "rnn")
    for name in section_names():
      if name != arch:
        model.pop(name, None)
  return json.dumps(out, indent=1)


def migrate_config(config: dict) -> dict:
  """An experiment config read from an older config.json, in today's layout (its `model`
  section: attn.models.config.migrate_model_section)."""
  from attn.models.config import migrate_model_section  # pylint: disable=import-outside-toplevel
  if isinstance(config.get("model"), dict):
    config = {**config, "model": migrate_model_section(config["model"])}
  return config
