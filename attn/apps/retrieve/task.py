"""One model of the retrieval sweep as a task of the one training loop (attn.training.loop):
what the loop needs to know to train a retriever + reader (attn.apps.retrieve.model) on the
two-hop questions of attn.apps.retrieve.data, so each model of the sweep gets the loop's
divergence guard, Ctrl-C save, resuming, workdir lock and device mesh.

A run's config has three sections, built from the sweep's RetrieveConfig by `run_config`:
`data` (RetrieveData: the stories, the number of distractors, the pool sizes, the batch size
and the pools' seed), `model` (RetrieveModelSection: mode, dim, hops, top_k) and `train`
(RetrieveTrainConfig: the loop's settings and the weight of the gold-passage loss).

Batches: step s reads the questions drawn by `jax.random.randint` from the key of the seed
folded with 1, then with the first step of s's chunk of 250 steps, then with s's place in the
chunk, and carries the `random` mode's key drawn with them (`step_draws`); a resumed run reads
the batches an uninterrupted one would. The sweep measures its final model: the run has no eval
split (no best/), and `write_results` evaluates the last state on the held-out pools.

Run workdir: config.json, model.json, checkpoints/, metrics.jsonl + tb/, retriever.npz (the
trained parameters, as the page reads them) and results.json (last).
"""

from __future__ import annotations

import dataclasses
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from attn.common import files, jitting
from attn.config import configurable
from attn.config.configurable import option
from attn.data import stories
from attn.errors import ConfigError
from attn.models import count_params, reader
from attn.apps.retrieve import data as pools
from attn.apps.retrieve import evaluation
from attn.apps.retrieve import model as retriever
from attn.training import distributed
from attn.training.config import LoopConfig
from attn.training.task import RUN_FIGURES, Task

CHUNK = 250  # steps per block of draws: step_draws' key schedule
PARAMS_FILE = "retriever.npz"  # a run's trained parameters (reader.save_params)
RESULTS_FILE = "results.json"


@dataclasses.dataclass(frozen=True)
class RetrieveData:
  """The `data` section of one run: its pools (pools.build) and the batch size."""
  stories: stories.StoryConfig = option(pools.POOL_STORIES, "What the stories are drawn from.")
  distractors: int = option(4, "Distractor stories per pool.")
  train_size: int = option(4000, "Training questions (each with its own pool).")
  test_size: int = option(500, "Held-out questions.")
  batch_size: int = option(32, "Questions per step.")
  seed: int = option(0, "Seed of the training pools (the held-out ones: pools.held_out_pools).")

  def __post_init__(self):
    if self.distractors < 0:
      raise ConfigError(f"data.distractors={self.distractors} must be >= 0")
    for name in ("train_size", "test_size", "batch_size"):
      if getattr(self, name) < 1:
        raise ConfigError(f"data.{name}={getattr(self, name)} must be >= 1")

  @property
  def tokens_per_batch(self) -> int:
    """0: every batch holds batch_size questions (the loop's mesh check reads it)."""
    return 0


@dataclasses.dataclass(frozen=True)
class RetrieverSettings:
  """The `model` section of one run: the fields of RetrieverConfig a user sets (the sizes come
  from the data)."""
  mode: str = option("retrieve", "Retrieval mode (retriever.RETRIEVAL).",
                     names=retriever.RETRIEVAL)
  dim: int = option(32, "Embedding size d.")
  hops: int = option(2, "Reader hops.")
  top_k: int = option(2, "Passages (stories) read per question.")


@dataclasses.dataclass(frozen=True)
class RetrieveModelSection:
  """The `model` section of one run. Its settings sit under `retriever` (as in model.json): a
  flat top_k would be read as a sequence-to-sequence setting by the loop's migration of older
  config.json files (attn.models.config.migrate_model_section) when a finished run is loaded."""
  retriever: RetrieverSettings = option(RetrieverSettings(), "The retriever + reader.")


@dataclasses.dataclass(frozen=True)
class RetrieveTrainConfig(LoopConfig):
  """The `train` section of one run: the loop's settings (LoopConfig, at defaults that keep the
  sweep's cost: no warm-up, rare logs and saves) and the weight of the gold-passage loss.
  clip_norm is not applied: the optimizer is plain Adam, as the sweep has always trained."""
  steps: int = option(1500, "Adam steps.")
  learning_rate: float = option(0.01, "Adam learning rate (constant).")
  warmup_steps: int = option(0, "unused: the learning rate is constant")
  log_every: int = option(250, "steps between progress lines and train metrics")
  eval_every: int = option(1500, "unused: a run has no eval split (its final model is measured)")
  checkpoint_every: int = option(1500, "steps between checkpoints (for resuming; the last step "
                                 "and Ctrl-C always save, and a model trains its 1500 steps in "
                                 "seconds)")
  steps_per_call: int = option(50, "optimizer steps per compiled call (most models' steps take "
                               "less time than a call of its own costs)")
  retrieval_loss: float = option(1.0, "Weight of the gold-passage loss (0: end to end only).")

  def __post_init__(self):
    super().__post_init__()
    if self.retrieval_loss < 0:
      raise ConfigError(f"train.retrieval_loss={self.retrieval_loss} must be >= 0")


@dataclasses.dataclass(frozen=True)
class RunModel:
  """The model config of record of one run: the retriever's config and the number of passages
  per pool it reads (what a uniform guess over them is measured against)."""
  retriever: retriever.RetrieverConfig
  passages: int

  def record(self) -> dict:
    """model.json: what a resumed run must match."""
    return {"retriever": self.retriever.to_dict(), "passages": self.passages}


@dataclasses.dataclass(frozen=True)
class RetrieveBundle:
  """The loaded data: its config and the pools by split ("train", "test"; no "eval")."""
  config: RetrieveData
  splits: dict


@functools.lru_cache(maxsize=8)
def load_pools(dc: RetrieveData) -> RetrieveBundle:
  """The training and held-out pools of data section `dc` (built once per process: the sweep
  builds every run's pools first, to refuse bad settings before writing anything)."""
  vocab = stories.Vocab.for_config(dc.stories)
  train = pools.build(dc.train_size, dc.distractors, dc.seed, dc.stories, vocab).arrays
  test = pools.held_out_pools(dc.test_size, dc.distractors, dc.seed, dc.stories, vocab)
  return RetrieveBundle(dc, {"train": train, "test": test})


@functools.partial(jax.jit, static_argnums=(2, 3, 4), compiler_options=jitting.QUICK_COMPILE)
def _chunk_draws(key, start, count: int, batch_size: int, num_questions: int):
  """(questions [count, batch_size], keys [count, 2]) of the first `count` steps of the chunk
  starting at step `start`: per step i, k1, k2 = split(fold_in(fold_in(key, start), i));
  questions randint(k1, ...), k2 the `random` mode's key."""
  chunk_key = jax.random.fold_in(key, start)

  def one(i):
    k1, k2 = jax.random.split(jax.random.fold_in(chunk_key, i))
    return jax.random.randint(k1, (batch_size,), 0, num_questions), k2

  return jax.vmap(one)(jnp.arange(count))


def step_draws(seed: int, steps: int, batch_size: int, num_questions: int, start_step: int):
  """Yields (question indices [batch_size], the `random` mode's key [2]) of each step from
  `start_step` on (see the module docstring): a function of the seed, the number of steps (the
  chunk size is min(CHUNK, steps)) and the step."""
  key = jax.random.fold_in(jax.random.PRNGKey(seed), 1)
  chunk = min(CHUNK, steps)
  draw = lambda start: _chunk_draws(key, start, chunk, batch_size, num_questions)
  for start, (rows, keys) in jitting.blocks_ahead(draw, start_step // chunk * chunk, chunk):
    for i in range(max(start_step - start, 0), chunk):
      yield rows[i], keys[i]


def question_losses(model, batch, key, retrieval_loss: float):
  """(loss [B], answer NLL [B]) per question: -log p(a|q) plus retrieval_loss times -log
  softmax(r_q . r_p)[gold] over the whole pool (a whole_pool reader scores no passage: NLL
  only). batch: passages [B, P, S, W], passage_mask [B, P, S], question [B, Wq], answer [B],
  gold [B]; key: the `random` mode's."""
  out = model(batch["passages"], batch["passage_mask"], batch["question"], key=key)
  nll = -jnp.take_along_axis(out.log_probs, batch["answer"][:, None], axis=-1)[:, 0]  # [B]
  if retriever.RETRIEVAL.get(model.cfg.mode).flat:  # no passage scores to supervise
    return nll, nll
  gold_lp = jnp.take_along_axis(jax.nn.log_softmax(out.passage_scores),
                                batch["gold"][:, None], axis=-1)[:, 0]  # [B]
  return nll - retrieval_loss * gold_lp, nll


class RetrieveTask(Task):
  """One (mode, distractors) model of the retrieval sweep (see the module docstring). Batches
  are dicts of passages, passage_mask, question, answer and gold (batch_arrays) and key [B, 2]
  (the step's `random`-mode key in every row); the loss counts questions."""
  scores = ("answer_accuracy", "recall_at_k")
  figures = ("distractors", "passages", "train_seconds", "final_loss")
  nested = ("hop_hits",)
  metrics = ("answer_accuracy", "recall_at_k", "train_seconds")
  columns = ("mode", "distractors", "recall_at_k", "answer_accuracy", "train_seconds")
  run_figures = RUN_FIGURES
  sections = {"data": RetrieveData, "model": RetrieveModelSection, "train": RetrieveTrainConfig}

  def train_config(self, cfg) -> RetrieveTrainConfig:
    return RetrieveTrainConfig.from_config(cfg)

  def make_optimizer(self, tc: RetrieveTrainConfig):
    """Adam at the constant train.learning_rate (no clipping, no schedule)."""
    return optax.adam(tc.learning_rate)

  def data_config(self, cfg) -> RetrieveData:
    return configurable.from_config(RetrieveData, cfg, section="data")

  def load_data(self, cfg, workdir) -> RetrieveBundle:
    """The pools of the `data` section (a function of it: nothing is read from `workdir`)."""
    del workdir
    return load_pools(self.data_config(cfg))

  def has_eval(self, bundle) -> bool:
    """False: the sweep measures the final model (no best/)."""
    return False

  def train_batches(self, bundle: RetrieveBundle, tc, start_step: int, select_rows=None):
    data = bundle.splits["train"]
    for rows, key in step_draws(tc.seed, tc.steps, bundle.config.batch_size, len(data.answer),
                                start_step):
      keys = np.broadcast_to(key, (len(rows), 2))  # one per row: the rows split over the mesh
      if select_rows is not None:
        rows, keys = select_rows(rows), select_rows(keys)
      yield dict(zip(("passages", "passage_mask", "question", "answer", "gold"),
                     pools.batch_arrays(data, rows)), key=keys)

  def train_tokens(self, bundle: RetrieveBundle, tc, step: int) -> float:
    """The questions of a global batch."""
    return float(bundle.config.batch_size)

  def model_config(self, cfg, bundle: RetrieveBundle) -> RunModel:
    settings = configurable.from_config(RetrieveModelSection, cfg, section="model").retriever
    dc = bundle.config
    mc = retriever.RetrieverConfig(
        vocab_size=len(stories.Vocab.for_config(dc.stories)), num_answers=len(dc.stories.places),
        max_sentences=dc.stories.max_sentences, **dataclasses.asdict(settings))
    return RunModel(mc, dc.distractors + 1)

  def check_model_config(self, cfg, data, train) -> None:
    settings = configurable.from_config(RetrieveModelSection, cfg, section="model").retriever
    for name in ("dim", "hops", "top_k"):
      if getattr(settings, name) < 1:
        raise ConfigError(f"model.retriever.{name}={getattr(settings, name)} must be >= 1")
    if train.compute_dtype != "float32":
      raise ConfigError(f"train.compute_dtype={train.compute_dtype!r}: the retriever computes "
                        "in float32 only; set train.compute_dtype=float32")

  def build_model(self, model_config: RunModel, seed: int, compute_dtype: str = "float32"):
    del compute_dtype  # float32 only (check_model_config)
    return retriever.build(model_config.retriever, seed=seed)

  def describe_model(self, model_config: RunModel) -> str:
    r = model_config.retriever
    return f"{r.mode}, top {r.top_k} of {model_config.passages} passages, d={r.dim}"

  def loss(self, model, batch, dropout_key=None, **options):
    """(sum of the per-question losses, questions, sum of the answer NLLs), float32 scalars.
    options: retrieval_loss (0 when the loss is only evaluated: its third part is what counts
    then). The `random` mode draws with the batch's key (its rows all hold the step's), not
    with `dropout_key`."""
    del dropout_key
    loss, nll = question_losses(model, batch, batch["key"][0], options.get("retrieval_loss", 0.0))
    return jnp.sum(loss), jnp.asarray(loss.shape[0], jnp.float32), jnp.sum(nll)

  def loss_options(self, tc: RetrieveTrainConfig) -> dict:
    return {"retrieval_loss": tc.retrieval_loss}

  def compiler_options(self, tc, model_config: RunModel) -> dict | None:
    """A reader of the whole pool sums bags of words over every sentence of it: those sums are
    compiled by XLA, fused with the lookups (attn.common.jitting.XLA_REDUCTIONS). The other
    modes read k stories and run faster with XLA's defaults."""
    del tc
    if retriever.RETRIEVAL.get(model_config.retriever.mode).flat:
      return jitting.cpu_options(jitting.XLA_REDUCTIONS)
    return None

  def uniform_loss(self, model_config: RunModel) -> float:
    """log(answers) + log(passages) (a whole_pool reader: log(answers)): a uniform guess's
    answer NLL plus its gold-passage NLL at weight 1 (run_config scales train.divergence_factor
    by a larger retrieval_loss)."""
    r = model_config.retriever
    flat = retriever.RETRIEVAL.get(r.mode).flat
    return float(np.log(r.num_answers) + (0.0 if flat else np.log(model_config.passages)))

  def selection_metrics(self, bundle) -> tuple[str, ...]:
    return ("answer_accuracy", "recall_at_k")

  def evaluate(self, run, role: str = "eval") -> dict:
    """recall@k, answer accuracy and hop hits of the current parameters on the held-out pools
    (role "eval" or "test": the run has no other)."""
    del role
    model, _ = nnx.merge(run.graphdef, run.state)
    dc = run.bundle.config
    return evaluation.measure(model, run.bundle.splits["test"], run.tc.seed,
                              dc.stories.max_sentences)

  def final_loss(self, run, steps: int = 50) -> float:
    """The mean training loss (the retrieval term included) of the current parameters over the
    batches of the last `steps` steps: a function of the state, the same after a resume. Computed
    by the program the loop's divergence check compiled (`Run.state_loss_fn`)."""
    start = max(run.progress.step - steps, 0)
    batches = self.train_batches(run.bundle, run.tc, start,
                                 None if run.rows is None else run.rows.select)
    losses = []
    for _ in range(start, run.progress.step):
      total, count, _ = run.state_loss_fn(run.state, run.device_batch(next(batches)))
      losses.append(float(total) / max(float(count), 1.0))
    return float(np.mean(losses)) if losses else float("nan")

  def write_results(self, run, ckpt) -> dict:
    """Measures the final parameters on the held-out pools; writes retriever.npz, then
    results.json (process 0 only). Returns the results: distractors, train_seconds (the
    training time across resumes), final_loss, step, params, the retriever's config ("model")
    and what evaluation.measure gives."""
    del ckpt  # no eval split: the last state is the one measured
    model, _ = nnx.merge(run.graphdef, run.state)
    results = {"distractors": run.bundle.config.distractors, "train_seconds": run.progress.wall_s,
               "final_loss": self.final_loss(run), **self.evaluate(run, "test"),
               "step": run.progress.step, "params": count_params(model),
               "model": run.mc.retriever.to_dict()}
    if distributed.is_primary():
      with files.atomic_path(os.path.join(run.workdir, PARAMS_FILE)) as tmp:
        reader.save_params(tmp, model)
      files.write_json(os.path.join(run.workdir, RESULTS_FILE), results)
    return results


def run_config(cfg, mode: str, distractors: int):
  """The loop config (ConfigDict: data, model, train) of the sweep's model of `mode` with
  `distractors`, from `cfg` (a sweep.RetrieveConfig). train.divergence_factor is 10 x
  max(1, retrieval_loss), as uniform_loss counts the gold-passage term at weight 1."""
  import ml_collections  # pylint: disable=import-outside-toplevel
  config = ml_collections.ConfigDict()
  config.data = configurable.config_dict(
      RetrieveData, stories=cfg.stories, distractors=distractors, train_size=cfg.train_size,
      test_size=cfg.test_size, batch_size=cfg.batch_size, seed=cfg.seed)
  config.model = configurable.config_dict(RetrieveModelSection, retriever=RetrieverSettings(
      mode=mode, dim=cfg.dim, hops=cfg.hops, top_k=cfg.top_k))
  config.train = configurable.config_dict(
      RetrieveTrainConfig, steps=cfg.steps, learning_rate=cfg.learning_rate, seed=cfg.seed,
      retrieval_loss=cfg.retrieval_loss, divergence_factor=10.0 * max(1.0, cfg.retrieval_loss))
  return config
