"""The task interface the training loop and the evaluation share: what to build, what to score,
how to decode.

A task is registered by name (registry kind "task"); `train_and_evaluate(config, workdir,
task=...)` looks it up. Translation is the first; summarization and other models plug in by
subclassing `Task` rather than copying the loop.
"""

from __future__ import annotations

import abc

from attn import decode as decode_lib
from attn import metrics as metrics_lib
from attn import registry
from attn.models import ModelConfig, build_model, match_param_count, sequence_loss


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
  def decode(self, model, src, src_lengths, *, max_len, beam_size, length_penalty):
    """A `decode.DecodeOutput` for one batch (greedy when beam_size == 1)."""

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


@registry.register("task", "translate")
class TranslationTask(Task):
  """Seq2seq translation (and built-in tasks): BLEU / chrF, exact match, gold-alignment scores."""

  def model_config(self, cfg, bundle) -> ModelConfig:
    mc = ModelConfig.from_config(cfg, src_vocab=bundle.src_vocab.size,
                                 tgt_vocab=bundle.tgt_vocab.size)
    ref = mc.match_params_of
    if ref and ref != mc.decoder:
      mc = match_param_count(mc, mc.replace(decoder=ref, fused=False))
    # The match is resolved into dec_hidden: the config of record is the concrete model.
    return mc.replace(match_params_of="")

  def check_model_config(self, cfg) -> None:
    ModelConfig.from_config(cfg, src_vocab=8, tgt_vocab=8)  # placeholder vocabularies

  def build_model(self, model_config, seed: int, compute_dtype: str = "float32"):
    return build_model(model_config, seed=seed, compute_dtype=compute_dtype)

  def loss(self, model, batch, dropout_key=None, label_smoothing=0.0):
    logits, _ = model(batch, dropout_key=dropout_key)
    return sequence_loss(logits, batch["tgt"], batch["tgt_lengths"], label_smoothing)

  def decode(self, model, src, src_lengths, *, max_len, beam_size, length_penalty):
    init = model.initial_decode_state(src, src_lengths)
    if beam_size == 1:
      return decode_lib.greedy_decode(model.step_fn(), init, src.shape[0], max_len)
    return decode_lib.beam_search(model.step_fn(), init, src.shape[0], max_len,
                                  beam_size=beam_size, length_penalty=length_penalty)

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
  return registry.get(name, "task").fn()
