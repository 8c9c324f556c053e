"""The reading-focus demo's readers as a task of the one training loop (attn.training.loop): one
run trains one reader (attn.models.reader) with one normalizer on bAbI-style stories
(attn.data.stories). `FocusTask` is what the loop needs to know: the train section
(FocusTrainConfig), Adam, the random batches, the reader and its answer NLL, the test split's
reading at each inference temperature and the run's result files; the loop brings the
divergence guard, the Ctrl-C save, resuming, the workdir lock, the device mesh and checkpoints.

The stories have no eval split: the loop never evaluates during training and the reader of the
last step is the one measured. attn.apps.focus.sweep builds each run's config from a FocusConfig
and gathers the runs into the demo's files.

Run workdir: config.json, model.json, checkpoints/, metrics.jsonl + tb/, reader.npz (the
trained parameters) and results.json (last: train_seconds, final_loss, eval, step).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from typing import ClassVar

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
from attn.models import reader
from attn.training import distributed
from attn.training.config import LoopConfig
from attn.training.task import Task

READER_FILE = "reader.npz"  # the run's trained parameters (reader.save_params)
RESULTS_FILE = "results.json"
FINAL_LOSS_STEPS = 50  # final_loss: the mean training loss over the batches of the last steps
# The batches of steps [k * DRAW_BLOCK, (k + 1) * DRAW_BLOCK) are drawn from one key folded with
# k * DRAW_BLOCK, then with the step's offset in the block: the stream of the compiled chunks of
# 250 steps the demo trained with before it used the loop, so its figures did not move.
DRAW_BLOCK = 250


@dataclasses.dataclass(frozen=True)
class FocusTrainConfig(LoopConfig):
  """The `train` section of a reader's run: the loop's settings (LoopConfig; steps,
  learning_rate and seed come from FocusConfig, which holds their defaults) and the inference
  temperatures the test split is read at. The optimizer is Adam at a constant learning rate
  (after warmup_steps of linear warm-up, none by default); clip_norm is not read. With no eval
  split, eval_every has no effect."""
  warmup_steps: int = option(0, "linear warm-up from 0 (0 = Adam at a constant rate)")
  log_every: int = option(500, "steps between progress lines and train metrics")
  eval_every: int = option(1000, "unused: the stories have no eval split")
  checkpoint_every: int = option(3000, "steps between checkpoints (for resuming; the last step "
                                 "and Ctrl-C always save, and a reader trains 3000 steps in "
                                 "about a second)")
  steps_per_call: int = option(50, "optimizer steps per compiled call (a reader's step takes "
                               "less time than a call of its own costs)")
  temperatures: tuple[float, ...] = option((1.0,), "inference temperatures of the test reading")

  def __post_init__(self):
    super().__post_init__()
    if not self.temperatures or not all(t > 0 for t in self.temperatures):
      raise ConfigError(f"train.temperatures={self.temperatures!r} must be positive numbers")


@dataclasses.dataclass(frozen=True)
class FocusDataConfig:
  """The `data` section of a reader's run, built from a FocusConfig (which holds the defaults
  and validates them): the stories' generator settings, how many to draw for each split (test
  stories from seed + 1_000_003, a disjoint stream) and the Adam batch size."""
  train_size: int
  test_size: int
  batch_size: int
  seed: int
  stories: stories.StoryConfig = stories.StoryConfig()
  tokens_per_batch: ClassVar[int] = 0  # fixed batches of batch_size stories


@dataclasses.dataclass(frozen=True)
class StoryBundle:
  """The loaded data: the data section, the vocabulary, the test stories (for the page's
  samples) and the encoded splits "train" and "test" (stories.Arrays)."""
  config: FocusDataConfig
  vocab: stories.Vocab
  test_examples: list
  splits: dict


@functools.lru_cache(maxsize=1)  # the demo's runs share their data section: generate it once
def load_stories(dc: FocusDataConfig) -> StoryBundle:
  """The stories of data section `dc` (a function of it; nothing is read or written)."""
  sc = dc.stories
  vocab = stories.Vocab.for_config(sc)
  train_set = stories.generate(dc.train_size, dc.seed, sc)
  test_set = stories.generate(dc.test_size, dc.seed + 1_000_003, sc)  # a disjoint stream
  return StoryBundle(dc, vocab, test_set, {"train": stories.encode(train_set, vocab, sc),
                                           "test": stories.encode(test_set, vocab, sc)})


@functools.partial(jax.jit, static_argnames=("num_examples", "batch_size"),
                   compiler_options=jitting.QUICK_COMPILE)
def _block_draws(seed, block_start, *, num_examples: int, batch_size: int):
  """The training rows of the DRAW_BLOCK steps from `block_start` (a multiple of DRAW_BLOCK),
  drawn with replacement. Returns [DRAW_BLOCK, batch_size] int32."""
  key = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(seed), 1), block_start)
  keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(DRAW_BLOCK))
  return jax.vmap(lambda k: jax.random.randint(k, (batch_size,), 0, num_examples))(keys)


def batch_rows(num_examples: int, batch_size: int, seed: int, start_step: int):
  """Yields the training rows [batch_size] of each step, step `start_step` first: a function of
  the seed and the step only (DRAW_BLOCK), so a resumed run reads the rows an uninterrupted one
  would."""
  draw = functools.partial(_block_draws, seed, num_examples=num_examples, batch_size=batch_size)
  for block, draws in jitting.blocks_ahead(draw, start_step - start_step % DRAW_BLOCK,
                                           DRAW_BLOCK):  # [DRAW_BLOCK, B]
    yield from draws[max(start_step - block, 0):]


def _batch(data: stories.Arrays, rows) -> dict:
  """What the reader reads of examples `rows`: story [B, S, W], story_mask [B, S], question
  [B, Wq] and the gold answer [B]."""
  return {"story": data.story[rows], "story_mask": data.story_mask[rows],
          "question": data.question[rows], "answer": data.answer[rows]}


# ----------------------------------------------------------------------------- measuring

def _rates(hit, correct, w):
  return {"evidence_hit_rate": float(hit.mean()), "answer_accuracy": float(correct.mean()),
          "mean_max_weight": float(w.max(-1).mean()),
          "mean_nonzero_weights": float((w > 0).sum(-1).mean()), "examples": int(hit.size)}


def evaluate_rows(model: reader.Reader, data: stories.Arrays, temperatures) -> list[dict]:
  """Per temperature: evidence hit rate (argmax weight on the gold final supporting fact),
  answer accuracy, mean max weight and mean number of non-zero weights, overall and per
  question kind present (`by_kind`)."""
  graphdef, state = nnx.split(model)
  rows = []
  for t in temperatures:
    out = reader.read(graphdef, state, data.story, data.story_mask, data.question, float(t))
    w = np.asarray(out.weights)  # [N, S]
    hit = w.argmax(-1) == data.support
    correct = np.asarray(out.log_probs).argmax(-1) == data.answer
    row = {"temperature": float(t), **_rates(hit, correct, w), "by_kind": {}}
    for k, kind in enumerate(stories.KINDS):
      sel = data.kind == k
      if sel.any():
        row["by_kind"][kind] = _rates(hit[sel], correct[sel], w[sel])
    rows.append(row)
  return rows


def nearest_to_one(rows: list[dict]) -> dict:
  """The evaluation row whose temperature is nearest to 1 (on a log scale)."""
  return min(rows, key=lambda x: abs(math.log(x["temperature"])))


def final_loss(run) -> float:
  """The mean training loss of the run's current parameters on the batches of its last
  FINAL_LOSS_STEPS steps (a function of the state: the same after a resume)."""
  tc = run.tc
  start = max(run.progress.step - FINAL_LOSS_STEPS, 0)
  it = run.task.train_batches(run.bundle, tc, start, None if run.rows is None
                              else run.rows.select)
  losses = []
  for _ in range(run.progress.step - start):
    _, ntok, nll = run.state_loss_fn(run.state, run.device_batch(next(it)))
    losses.append(float(nll) / max(float(ntok), 1.0))
  return float(np.mean(losses)) if losses else float("nan")


# ----------------------------------------------------------------------------- the task

class FocusTask(Task):
  """One reader trained on the stories. Batches are dicts of story [B, S, W], story_mask
  [B, S], question [B, Wq] and answer [B]; the loss counts stories."""
  scores = ("evidence_hit_rate", "answer_accuracy")
  figures = ("train_seconds", "final_loss")
  metrics = ("evidence_hit_rate", "answer_accuracy", "train_seconds")
  sections = {"data": FocusDataConfig, "model": reader.ReaderConfig, "train": FocusTrainConfig}

  def train_config(self, cfg) -> FocusTrainConfig:
    return FocusTrainConfig.from_config(cfg)

  def make_optimizer(self, tc: FocusTrainConfig):
    """Adam, at a constant rate after the (optional) linear warm-up."""
    if not tc.warmup_steps:
      return optax.adam(tc.learning_rate)
    return optax.adam(optax.linear_schedule(0.0, tc.learning_rate, tc.warmup_steps))

  def data_config(self, cfg) -> FocusDataConfig:
    return configurable.from_config(FocusDataConfig, cfg, section="data")

  def load_data(self, cfg, workdir) -> StoryBundle:
    del workdir  # generated: nothing is read or written
    return load_stories(self.data_config(cfg))

  def train_batches(self, bundle: StoryBundle, tc, start_step: int, select_rows=None):
    data = bundle.splits["train"]
    for rows in batch_rows(len(data.answer), bundle.config.batch_size, tc.seed, start_step):
      yield _batch(data, rows if select_rows is None else select_rows(rows))

  def train_tokens(self, bundle: StoryBundle, tc, step: int) -> float:
    """The stories of a batch (the loss is one answer per story)."""
    return float(bundle.config.batch_size)

  def model_config(self, cfg, bundle: StoryBundle) -> reader.ReaderConfig:
    return self._reader_config(cfg, bundle.config, len(bundle.vocab))

  def check_model_config(self, cfg, data: FocusDataConfig, train) -> None:
    self._reader_config(cfg, data, vocab_size=1)
    if train.compute_dtype != "float32":
      raise ConfigError(f"train.compute_dtype={train.compute_dtype!r}: the reader computes in "
                        "float32 only; set train.compute_dtype=float32")

  @staticmethod
  def _reader_config(cfg, dc: FocusDataConfig, vocab_size: int) -> reader.ReaderConfig:
    """The reader of `model` section `cfg` (score, normalizer, dim, d_attn), its sizes from the
    stories."""
    return configurable.from_config(reader.ReaderConfig, cfg, section="model",
                                    vocab_size=vocab_size, num_answers=len(dc.stories.places),
                                    max_sentences=dc.stories.max_sentences)

  def build_model(self, model_config, seed: int, compute_dtype: str = "float32"):
    del compute_dtype  # float32 only (check_model_config)
    return reader.build(model_config, seed=seed)

  def describe_model(self, model_config) -> str:
    return f"reader/{model_config.score}/{model_config.normalizer}"

  def loss(self, model, batch, dropout_key=None, **options):
    """(sum of the answer NLLs over the batch, the number of stories B, the same sum)."""
    del dropout_key, options  # no dropout, no options
    out = model(batch["story"], batch["story_mask"], batch["question"])
    nll = -jnp.take_along_axis(out.log_probs, batch["answer"][:, None], axis=-1)[:, 0]  # [B]
    total = jnp.sum(nll)
    return total, jnp.float32(nll.shape[0]), total

  def uniform_loss(self, model_config) -> float:
    """log of the number of places (the answers)."""
    return float(np.log(max(model_config.num_answers, 2)))

  def selection_metrics(self, bundle) -> tuple[str, ...]:
    return ("answer_accuracy", "evidence_hit_rate")

  def evaluate(self, run, role: str = "test") -> dict:
    """Evidence hit rate and answer accuracy of reading split `role` at the temperature nearest
    to 1."""
    nnx.update((run.model, run.optimizer), run.state)
    row = nearest_to_one(evaluate_rows(run.model, run.bundle.splits[role], run.tc.temperatures))
    return {k: row[k] for k in self.selection_metrics(run.bundle)}

  def write_results(self, run, ckpt) -> dict:
    """Reads the test split at every temperature with the last step's reader (no eval split, so
    best/ stays empty); writes reader.npz and results.json: train_seconds (the whole run's
    training time, across resumes), final_loss (`final_loss`), eval (`evaluate_rows`) and
    step."""
    del ckpt  # the last step's state is the reader
    nnx.update((run.model, run.optimizer), run.state)
    results = {"train_seconds": run.progress.wall_s, "final_loss": final_loss(run),
               "eval": evaluate_rows(run.model, run.bundle.splits["test"], run.tc.temperatures),
               "step": run.progress.step}
    if distributed.is_primary():
      with files.atomic_path(os.path.join(run.workdir, READER_FILE), suffix=".npz") as tmp:
        reader.save_params(tmp, run.model)
      files.write_json(os.path.join(run.workdir, RESULTS_FILE), results)
    return results
