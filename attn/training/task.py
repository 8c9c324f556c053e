"""The task interface the training loop and the evaluation share: what to build, what to score,
how to decode.

A task is registered by name in `TASKS`; `train_and_evaluate(config, workdir,
task=...)` looks it up. Translation is the first; summarization and other models plug in by
subclassing `Task` rather than copying the loop.
"""

from __future__ import annotations

import abc

from attn import decoding
from attn.decoding import Search  # noqa: F401  (re-exported: the settings `decode` takes)
from attn.evaluation import metrics as metrics_lib
from attn.errors import ConfigError
from attn.models import ModelConfig, build_model, match_param_count, sequence_loss
from attn.registry import Registry

# What a run trains for (translate, summarize): entries are `Task` subclasses.
TASKS = Registry("task", error=ConfigError)


class Task(abc.ABC):
  """What a training run needs to know about its task. Methods are pure in the model (an
  nnx.Module merged inside jit) and the batch (dict of arrays, shapes in attn/data/pipeline.py)."""

  @abc.abstractmethod
  def model_config(self, cfg, bundle):
    """The frozen model config from the config's `model` section and the loaded data."""

  @abc.abstractmethod
  def check_model_config(self, cfg) -> None:
    """Validates the `model` section before any data is read (vocabulary sizes still unknown);
    raises ConfigError naming the field."""

  @abc.abstractmethod
  def build_model(self, model_config, seed: int, compute_dtype: str = "float32"):
    """A freshly initialized model (float32 parameters) whose matmuls run in `compute_dtype`."""

  @abc.abstractmethod
  def loss(self, model, batch, dropout_key=None, label_smoothing=0.0):
    """(sum of token losses, number of tokens, sum of unsmoothed NLL), float32 scalars."""

  @abc.abstractmethod
  def decode(self, model, batch, *, max_len: int, search: Search):
    """A `decoding.DecodeOutput` for one batch (the device arrays: src, src_lengths[, src_ext])."""

  @abc.abstractmethod
  def attention(self, model, batch):
    """Teacher-forced `StepAttention` (weights and raw scores, [B, Tt, Ts] each) along
    batch["tgt"], or None when the model never forms the weights (fused)."""

  @abc.abstractmethod
  def score(self, bundle, role, hyps: dict, src_lengths: dict) -> dict:
    """Metrics of decoded outputs `hyps` (example_id -> text) against the split's references."""

  @abc.abstractmethod
  def selection_metrics(self, bundle) -> tuple[str, ...]:
    """The eval metrics (higher is better) that pick the best checkpoint, compared in order: the
    later ones break ties of the earlier (exact match stays 0 for a while on built-in tasks)."""

  def output_text(self, bundle, role, example_id: int, ids) -> str:
    """The text of decoded `ids` (up to EOS) for example `example_id` of the split."""
    del role, example_id
    return bundle.tgt_vocab.decode(ids)

  def output_labels(self, bundle, role, example_id: int, ids) -> list[str]:
    """One label per decoded id (heatmap rows)."""
    del role, example_id
    return bundle.tgt_vocab.labels(ids)

  def analysis(self, bundle, role, outputs) -> dict:
    """Task-specific figures of the decoded test outputs (`evaluation.Outputs`) for
    results.json; none by default."""
    del bundle, role, outputs
    return {}


@TASKS.register("translate")
class TranslationTask(Task):
  """Seq2seq translation (and built-in tasks): BLEU / chrF, exact match, gold-alignment scores."""

  def model_config(self, cfg, bundle) -> ModelConfig:
    mc = ModelConfig.from_config(cfg, src_vocab=bundle.src_vocab.size,
                                 tgt_vocab=bundle.tgt_vocab.size)
    ref = mc.rnn.match_params_of
    if ref and ref != mc.rnn.decoder:
      mc = match_param_count(mc, mc.replace_paths({"fused": False, "rnn.decoder": ref}))
    # The match is resolved into dec_hidden: the config of record is the concrete model.
    return mc.replace_paths({"rnn.match_params_of": ""})

  def check_model_config(self, cfg) -> None:
    ModelConfig.from_config(cfg, src_vocab=8, tgt_vocab=8).validate()  # placeholder vocabularies

  def build_model(self, model_config, seed: int, compute_dtype: str = "float32"):
    return build_model(model_config, seed=seed, compute_dtype=compute_dtype)

  def loss(self, model, batch, dropout_key=None, label_smoothing=0.0):
    logits, _ = model(batch, dropout_key=dropout_key)
    return sequence_loss(logits, batch["tgt"], batch["tgt_lengths"], label_smoothing)

  def decode(self, model, batch, *, max_len, search):
    src = batch["src"]
    if model.longest_output is not None:  # e.g. a learned position table: no step past its end
      max_len = min(max_len, model.longest_output)
    init = model.initial_decode_state(src, batch["src_lengths"], batch.get("src_ext"),
                                      max_len=max_len)
    common = dict(min_len=search.min_len, block_repeat_ngram=search.block_repeat_ngram)
    if search.beam_size == 1:
      return decoding.greedy_decode(model.step_fn(), init, src.shape[0], max_len, **common)
    return decoding.beam_search(
        model.step_fn(), init, src.shape[0], max_len, beam_size=search.beam_size,
        length_penalty=search.length_penalty, coverage_penalty=search.coverage_penalty,
        source_lengths=batch["src_lengths"], **common)

  def attention(self, model, batch):
    return model.attention(batch)[1]

  def score(self, bundle, role, hyps, src_lengths) -> dict:
    """BLEU/chrF for text tasks, exact match (+ per source-length bucket) for built-in tasks."""
    refs_all = bundle.references(role)
    ids = sorted(hyps)
    h = [hyps[i] for i in ids]
    r = [refs_all[i] for i in ids]
    lowercase = bool(bundle.config.lowercase)
    out = {"bleu": metrics_lib.bleu(h, r, lowercase=lowercase),
           "chrf": metrics_lib.chrf(h, r, lowercase=lowercase),
           "exact_match": metrics_lib.exact_match(h, r)}
    if bundle.has_alignments:
      lengths = [src_lengths[i] for i in ids]
      out["exact_match_by_src_len"] = metrics_lib.exact_match_by_bucket(
          h, r, lengths, buckets=10 if max(lengths) > 20 else 5)
    return out

  def selection_metrics(self, bundle) -> tuple[str, ...]:
    return ("exact_match", "bleu", "chrf") if bundle.has_alignments else ("bleu", "chrf")


def get_task(name: str) -> Task:
  return TASKS.get(name)()
