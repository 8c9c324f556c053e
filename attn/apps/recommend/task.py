"""Next-item recommendation: a recommender (attn.apps.recommend.model) trained on the
generated interaction log (attn.apps.recommend.data) through the one training loop
(attn.training.loop, `task="recommend"`), which ranks the held-out items and writes the run's
files. `RecommendTask` is what the loop needs to know: the train section (RecTrainConfig), the
optimizer, the batches of histories, the model and its loss, the valid split's ranking (best/ by
NDCG@10, then HR@10) and the result files; the loop brings the divergence guard, the Ctrl-C
save, resuming, the workdir lock and checks, the device mesh, checkpoints and metrics.jsonl.

Training objective: the full softmax cross-entropy of the next item at every position of the
training history (SASRec trains a binary loss against one sampled negative; with a few hundred
items the full softmax is affordable and is what the full ranking evaluates).

Workdir: config.json, model.json, checkpoints/, best/, metrics.jsonl + tb/, results.json
(hr10, ndcg10, per history-length bucket, attention on the planted trigger), attention.npz (the
run viewer's format: attn.inspection.viewer).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from attn.config import configurable
from attn.config.configurable import option
from attn.apps.recommend import data as interactions
from attn.errors import ConfigError
from attn.apps.recommend import model as recommenders
from attn.apps.recommend import evaluation
from attn.training.config import LoopConfig
from attn.training.task import RUN_FIGURES, Task, refuse_changed_data


@dataclasses.dataclass(frozen=True)
class RecTrainConfig(LoopConfig):
  """The `train` section of experiments/configs/recommend.py: the loop's settings (LoopConfig,
  some at other defaults here) and the test users whose attention is kept."""
  steps: int = option(1200, "optimizer steps")
  learning_rate: float = option(3e-3, "peak learning rate (Adam, after warm-up)")
  warmup_steps: int = option(100, "linear warm-up from 0, then cosine decay to 10%")
  log_every: int = option(100, "steps between progress lines and train metrics")
  eval_every: int = option(300, "steps between valid-split evaluations (best/ by NDCG@10)")
  checkpoint_every: int = option(300, "steps between checkpoints (for resuming)")
  seed: int = option(0, "model initialization, dropout and batch order")
  attention_samples: int = option(32, "test users whose attention goes to attention.npz")

  def __post_init__(self):
    super().__post_init__()
    if self.attention_samples < 0:
      raise ConfigError(f"train.attention_samples={self.attention_samples} must be >= 0")


SECTIONS = {"data": interactions.InteractionConfig, "model": recommenders.RecommenderConfig,
            "train": RecTrainConfig}


@dataclasses.dataclass(frozen=True)
class RecBundle:
  """The loaded data: the log's config and its leave-one-out splits ("train", "valid", "test";
  interactions.leave_one_out). The loop's "eval" split is "valid"."""
  config: interactions.InteractionConfig
  splits: dict


class RecommendTask(Task):
  """Next-item recommendation as a task of the training loop. Batches are dicts of inputs,
  lengths [B] and targets ([B, T] each but lengths); the loss counts the valid positions."""
  scores = ("hr10", "ndcg10")
  figures = ("attention_on_gold", "random_hr10", "users")
  nested = ("hr10_by_length", "ndcg10_by_length", "attention_on_gold_by_length",
            "attention_on_gold_by_layer", "attention_on_gold_by_layer_and_length",
            "gold_is_argmax_by_layer")
  metrics = ("hr10", "ndcg10", "attention_on_gold", "params", "wall_s")
  columns = ("kind", "params", "hr10", "ndcg10", "attention_on_gold", "wall_s")
  notes = ()
  run_figures = RUN_FIGURES
  sections = SECTIONS

  def train_config(self, cfg) -> RecTrainConfig:
    return RecTrainConfig.from_config(cfg)

  def make_optimizer(self, tc: RecTrainConfig):
    """Adam with global-norm clipping; linear warm-up, then cosine decay to 10% of the peak."""
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, tc.learning_rate, tc.warmup_steps, max(tc.steps, tc.warmup_steps + 1),
        tc.learning_rate * 0.1)
    return optax.chain(optax.clip_by_global_norm(tc.clip_norm), optax.adam(schedule))

  def check_resumed_data(self, recorded, dc) -> None:
    refuse_changed_data(recorded, dc)

  def data_config(self, cfg) -> interactions.InteractionConfig:
    return configurable.from_config(interactions.InteractionConfig, cfg, section="data")

  def load_data(self, cfg, workdir) -> RecBundle:
    """The generated log of the `data` section and its split (a function of the config: nothing
    is read from or written to `workdir`)."""
    del workdir
    dc = self.data_config(cfg)
    return RecBundle(dc, interactions.leave_one_out(interactions.generate(dc)))

  def has_eval(self, bundle) -> bool:
    return "valid" in bundle.splits

  def train_batches(self, bundle: RecBundle, tc, start_step: int, select_rows=None):
    batches = interactions.train_batches(bundle.splits["train"], bundle.config.batch_size,
                                         tc.seed, start_step, select_rows)
    return ({"inputs": x, "lengths": n, "targets": y} for x, n, y in batches)

  def train_tokens(self, bundle: RecBundle, tc, step: int) -> float:
    """The training positions of the global batch of `step` (its histories' lengths)."""
    split = bundle.splits["train"]
    rows = interactions.batch_rows(len(split.lengths), bundle.config.batch_size, tc.seed, step)
    return float(split.lengths[rows].sum())

  def model_config(self, cfg, bundle: RecBundle) -> recommenders.RecommenderConfig:
    mc = configurable.from_config(recommenders.RecommenderConfig, cfg, section="model")
    return resolve_model(mc, bundle.config)

  def check_model_config(self, cfg, data, train) -> None:
    configurable.from_config(recommenders.RecommenderConfig, cfg, section="model")
    if train.compute_dtype != "float32":
      raise ConfigError(f"train.compute_dtype={train.compute_dtype!r}: the recommenders compute "
                        "in float32 only; set train.compute_dtype=float32")

  def build_model(self, model_config, seed: int, compute_dtype: str = "float32"):
    del compute_dtype  # float32 only (check_model_config)
    return recommenders.build(model_config, seed=seed)

  def describe_model(self, model_config) -> str:
    return model_config.kind

  def loss(self, model, batch, dropout_key=None, **options):
    """(sum of the next-item cross-entropies over the valid positions, their number (at least
    1), the same sum): batch inputs, targets [B, T], lengths [B]."""
    del options  # none
    inputs, lengths, targets = batch["inputs"], batch["lengths"], batch["targets"]
    h, _ = model(inputs, lengths, dropout_key)
    logp = jax.nn.log_softmax(model.logits(h).astype(jnp.float32))  # [B, T, V]
    nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]  # [B, T]
    valid = (jnp.arange(inputs.shape[1])[None] < lengths[:, None]).astype(jnp.float32)
    total = jnp.sum(nll * valid)
    return total, jnp.maximum(valid.sum(), 1.0), total

  def uniform_loss(self, model_config) -> float:
    """log of the number of items (PAD is never a candidate: its logit is -inf)."""
    return float(np.log(max(model_config.num_items, 2)))

  def selection_metrics(self, bundle) -> tuple[str, ...]:
    return ("ndcg10", "hr10")

  def evaluate(self, run, role: str = "eval") -> dict:
    """hr10 and ndcg10 of ranking the held-out items of `role` ("eval": the valid split)."""
    ev = evaluation.rank_split(run.graphdef, run.state, run.bundle.splits[
        "valid" if role == "eval" else role])
    return {"hr10": float(ev["hr10"]), "ndcg10": float(ev["ndcg10"])}

  def write_results(self, run, ckpt) -> dict:
    """Ranks the test split with the best checkpoint; writes attention.npz and results.json
    (evaluation.write_results). The step and training time are the whole run's."""
    trained = {"params": recommenders.count_params(run.model), "step": run.progress.step,
               "wall_s": run.progress.wall_s}
    if ckpt.best.latest_step() is not None:  # (an evaluation at the last step always saves one)
      ckpt.restore(ckpt.best, run)
    return evaluation.write_results(run, run.bundle.splits, trained)


def default_config(**sections):
  """The experiment's ConfigDict: every section at its dataclass defaults, then `sections`
  (section name -> dict of overrides)."""
  import ml_collections  # pylint: disable=import-outside-toplevel
  cfg = ml_collections.ConfigDict()
  for name, cls in SECTIONS.items():
    setattr(cfg, name, configurable.config_dict(cls, **sections.get(name, {})))
  return cfg


def validate_config(config):
  """(data, model, train) dataclasses of `config`; ConfigError (one line) naming the first bad
  field. Reads no data, writes nothing."""
  out = []
  for name, cls in SECTIONS.items():
    if name not in config:
      raise ConfigError(f"the config has no `{name}` section")
    out.append(configurable.from_config(cls, config[name], section=name))
  RecommendTask().check_model_config(config.model, out[0], out[2])
  return tuple(out)


def resolve_model(mc, dc):
  """The model config of record: sizes from the data and, for a baseline with
  model.match_params, the feed-forward width that brings its parameter count closest to the
  attention model's at the same dim (the count is linear in ffn_dim)."""
  mc = dataclasses.replace(mc, num_items=dc.num_items, max_len=dc.max_input_len)
  if not mc.match_params or mc.has_attention:
    return mc
  count = lambda cfg: recommenders.count_params(nnx.eval_shape(lambda: recommenders.build(cfg)))
  goal = count(dataclasses.replace(mc, kind="sasrec"))
  at1, at2 = (count(dataclasses.replace(mc, ffn_dim=f)) for f in (1, 2))
  width = max(1, round(1 + (goal - at1) / (at2 - at1)))
  return dataclasses.replace(mc, ffn_dim=width, match_params=False)
