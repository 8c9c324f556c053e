"""Next-item recommendation: train a recommender (attn.apps.recommend.recommenders) on the generated
interaction log (attn.apps.recommend.interactions), rank the held-out items, write the run's files.

Why not a `Task` in TASKS: the seq2seq loop's task interface is built around a data bundle of
source/target text, decoding (`decode`, `Search`), text scores against references and token
vocabularies; next-item ranking has none of these (no decoding, no vocabulary, a score over the
whole item set per user). So this is the smallest loop that reuses the same pieces as
attn.training.loop for everything else: the workdir checks and run lock
(`workdir.prepare`/`lock`/`check_model`/`record_model`), orbax `Checkpoints` (latest for
resuming, best by the valid split's NDCG@10), `MetricsWriter` (metrics.jsonl, TensorBoard) and
the atomic writer; config.json and model.json are written once the config is valid and the
workdir's checkpoints are known to be of this model, results.json last.

Training objective: the full softmax cross-entropy of the next item at every position of the
training history (SASRec trains a binary loss against one sampled negative; with a few hundred
items the full softmax is affordable and is what the full ranking evaluates).

Workdir: config.json, model.json, checkpoints/, best/, metrics.jsonl + tb/, results.json
(hr10, ndcg10, per history-length bucket, attention on the planted trigger), attention.npz (the
run viewer's format: attn.inspection.viewer).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from attn.config import configurable
from attn.config.configurable import option
from attn.apps.recommend import interactions
from attn.errors import ConfigError
from attn.apps.recommend import recommenders
from attn.apps.recommend import recommendation_eval as rec_eval
from attn.training import workdir as workdir_lib
from attn.training.checkpoints import Checkpoints
from attn.training.metrics_log import MetricsWriter
from attn.training.task import RUN_FIGURES

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class RecTrainConfig:
  """The `train` section of experiments/configs/recommend.py."""
  steps: int = option(1200, "optimizer steps")
  learning_rate: float = option(3e-3, "peak learning rate (Adam, after warm-up)")
  warmup_steps: int = option(100, "linear warm-up from 0, then cosine decay to 10%")
  clip_norm: float = option(1.0, "global gradient-norm clipping")
  log_every: int = option(100, "steps between progress lines and train metrics")
  eval_every: int = option(300, "steps between valid-split evaluations (best/ by NDCG@10)")
  checkpoint_every: int = option(300, "steps between checkpoints (for resuming)")
  seed: int = option(0, "model initialization and batch order")
  attention_samples: int = option(32, "test users whose attention goes to attention.npz")

  def __post_init__(self):
    for name in ("steps", "log_every", "eval_every", "checkpoint_every"):
      if getattr(self, name) < 1:
        raise ConfigError(f"train.{name}={getattr(self, name)} must be at least 1")
    if not self.learning_rate > 0:
      raise ConfigError(f"train.learning_rate={self.learning_rate} must be positive")
    if self.warmup_steps < 0 or self.attention_samples < 0:
      raise ConfigError("train.warmup_steps and train.attention_samples must be >= 0")


class RecommendTask:
  """What a finished recommend run's results.json holds (attn.training.task.Task's
  declarations), read by launch.py and the run tools."""
  scores = ("hr10", "ndcg10")
  figures = ("attention_on_gold", "random_hr10", "users")
  nested = ("hr10_by_length", "ndcg10_by_length", "attention_on_gold_by_length",
            "attention_on_gold_by_layer", "attention_on_gold_by_layer_and_length",
            "gold_is_argmax_by_layer")
  metrics = ("hr10", "ndcg10", "attention_on_gold", "params", "wall_s")
  columns = ("kind", "params", "hr10", "ndcg10", "attention_on_gold", "wall_s")
  notes = ()
  run_figures = RUN_FIGURES


SECTIONS = {"data": interactions.InteractionConfig, "model": recommenders.RecommenderConfig,
            "train": RecTrainConfig}


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


def make_optimizer(tc: RecTrainConfig):
  schedule = optax.warmup_cosine_decay_schedule(
      0.0, tc.learning_rate, tc.warmup_steps, max(tc.steps, tc.warmup_steps + 1),
      tc.learning_rate * 0.1)
  return optax.chain(optax.clip_by_global_norm(tc.clip_norm), optax.adam(schedule))


def next_item_loss(model, inputs, lengths, targets, dropout_key=None):
  """(mean cross-entropy over the valid positions, number of positions). inputs, targets:
  [B, T]; lengths: [B]."""
  h, _ = model(inputs, lengths, dropout_key)
  logp = jax.nn.log_softmax(model.logits(h).astype(jnp.float32))  # [B, T, V]
  nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]  # [B, T]
  valid = (jnp.arange(inputs.shape[1])[None] < lengths[:, None]).astype(jnp.float32)
  n = jnp.maximum(valid.sum(), 1.0)
  return jnp.sum(nll * valid) / n, n


def train_step(graphdef, state, inputs, lengths, targets, dropout_key):
  """One Adam step; state = nnx.state((model, optimizer)). Returns (state, metrics)."""
  model, optimizer = nnx.merge(graphdef, state)
  (loss, n), grads = nnx.value_and_grad(next_item_loss, has_aux=True)(model, inputs, lengths,
                                                                     targets, dropout_key)
  optimizer.update(model, grads)
  return nnx.state((model, optimizer)), {"loss": loss, "positions": n,
                                         "grad_norm": optax.tree.norm(grads)}


@dataclasses.dataclass
class RecRun:
  """What a run holds; the counters are the ones `Checkpoints` saves and restores."""
  workdir: str
  dc: interactions.InteractionConfig
  mc: recommenders.RecommenderConfig
  tc: RecTrainConfig
  graphdef: object
  state: object
  step: int = 0
  best_score: tuple = ()
  best_step: int = 0
  best_eval: dict = dataclasses.field(default_factory=dict)
  wall_s: float = 0.0
  train_tokens: float = 0.0  # training positions seen
  eval_pending: bool = False

  @property
  def model(self):
    return nnx.merge(self.graphdef, self.state)[0]


def _evaluate(run: RecRun, splits, ckpt, writer) -> None:
  ev = rec_eval.rank_split(run.graphdef, run.state, splits["valid"])
  scores = {k: ev[k] for k in ("hr10", "ndcg10")}
  writer.write(run.step, "eval", scores)
  log.info(f"eval at step {run.step}: hr10 {scores['hr10']:.3f} ndcg10 {scores['ndcg10']:.3f}")
  score = (scores["ndcg10"], scores["hr10"])
  if score >= run.best_score:
    run.best_score, run.best_step, run.best_eval = score, run.step, scores
    ckpt.save(ckpt.best, run)


def train(run: RecRun, splits, ckpt: Checkpoints, writer: MetricsWriter) -> None:
  """Steps from run.step to train.steps: progress lines, evaluations (best/) and checkpoints."""
  tc = run.tc
  step_fn = jax.jit(functools.partial(train_step, run.graphdef), donate_argnums=(0,))
  batches = interactions.train_batches(splits["train"], run.dc.batch_size, tc.seed, run.step)
  t0 = time.time()
  while run.step < tc.steps:
    inputs, lengths, targets = next(batches)
    # The dropout masks are a function of the seed and the step: a resumed run draws the same.
    key = jax.random.fold_in(jax.random.PRNGKey(tc.seed + 1), run.step)
    run.state, m = step_fn(run.state, inputs, lengths, targets, key)
    run.step += 1
    run.train_tokens += float(lengths.sum())
    due = lambda every: run.step % every == 0 or run.step == tc.steps
    if due(tc.log_every) or due(tc.eval_every) or due(tc.checkpoint_every):
      m = {k: float(v) for k, v in jax.device_get(m).items()}
      run.wall_s += time.time() - t0
      if due(tc.log_every):
        writer.write(run.step, "train", m)
        log.info(f"step {run.step}/{tc.steps} loss {m['loss']:.3f} |g| {m['grad_norm']:.2f}")
      if due(tc.eval_every):
        _evaluate(run, splits, ckpt, writer)
      if due(tc.checkpoint_every):
        ckpt.save(ckpt.latest, run)
      t0 = time.time()


def train_and_evaluate(config, workdir: str) -> dict:
  """Trains (resuming from `workdir`'s checkpoint), ranks the test split with the best
  checkpoint, writes results.json (returned) and attention.npz. Every user mistake is a
  ConfigError / WorkdirError before anything is written."""
  dc, mc, tc = validate_config(config)
  mc = resolve_model(mc, dc)
  workdir_lib.prepare(workdir)
  with workdir_lib.lock(workdir):
    workdir_lib.check_model(workdir, mc)
    splits = interactions.leave_one_out(interactions.generate(dc))
    model = recommenders.build(mc, seed=tc.seed)
    params = recommenders.count_params(model)
    optimizer = nnx.Optimizer(model, make_optimizer(tc), wrt=nnx.Param)
    graphdef, state = nnx.split((model, optimizer))
    run = RecRun(workdir, dc, mc, tc, graphdef, state)
    log.info(f"model {mc.kind}: {params:,} parameters")
    ckpt = Checkpoints(workdir)
    try:
      if ckpt.restore(ckpt.latest, run):
        log.info(f"resumed from step {run.step}")
      rec_eval.write_records(config, workdir, mc)
      train(run, splits, ckpt, MetricsWriter(workdir, resumed_step=run.step))
      trained = {"step": run.step, "wall_s": run.wall_s}
      ckpt.restore(ckpt.best, run)  # (an evaluation at the last step always saves one)
      return rec_eval.write_results(run, splits, {"params": params, **trained})
    finally:
      ckpt.close()
