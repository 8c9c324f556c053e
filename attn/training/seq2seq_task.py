"""Sequence-to-sequence tasks: a source is encoded, a target decoded with attention over it.

What translation, summarization and captioning share: the model of `model.arch`, the loss,
greedy and beam decoding, teacher-forced attention and the text of outputs; each application's
task adds its scores and how they choose the best checkpoint.

The model's training objective is the same in every such task: the pointer-generator's loss on
each example's source-extended vocabulary (model.rnn.pointer: -log P(y_t) of the mixed
distribution, attn.models.copying, on `tgt_ext`; a target word outside the vocabulary that
occurs in the source is a copy target) and the coverage loss (model.rnn.coverage:
coverage_loss_weight * sum_t sum_i min(a^t_i, c^t_i), See et al. 2017, eq. 13) train wherever the
model has them, and outputs with ids >= V are written back as words of that example's source.
"""

from __future__ import annotations

import abc

import jax.numpy as jnp
import numpy as np

from attn import decoding
from attn.data.config import DataConfig
from attn.decoding import Search
from attn.errors import ConfigError
from attn.models import ModelConfig, build_model, copying, match_param_count, sequence_loss
from attn.training import evaluation
from attn.training.config import TrainConfig, make_optimizer
from attn.training.task import Task


class Seq2SeqTask(Task):
  """A task whose model encodes a source and decodes a target (attn.models.Architecture):
  the loss of every such task (the pointer-generator's and coverage's included), decoding,
  attention and output text. Subclasses give `score` and `selection_metrics`."""

  # The train section holds the loop's settings, the optimizer's, and evaluation's and decoding's.
  sections = {"data": DataConfig, "model": ModelConfig, "train": TrainConfig}

  # The scores experiments.score tabulates when it scores finished runs again (other splits,
  # checkpoints, averages; the first chooses decoding settings on --tune_split), and which
  # experiments.average averages; () where neither takes the task's runs.
  rescored: tuple[str, ...] = ()
  # Whether AER leaves out the attention of output tokens without a gold link (a caption's EOS,
  # which has no region to point at), rather than counting it as an error.
  aer_skips_unaligned = False

  def make_optimizer(self, tc):
    return make_optimizer(tc)

  def data_config(self, cfg):
    """The validated `data` section (DataConfig by default: its errors are DataErrors)."""
    return self.sections["data"].from_config(cfg)

  def check_data(self, cfg):
    # (A task whose data section is not a DataConfig reads its data with its own load_data.)
    if issubclass(self.sections["data"], DataConfig):
      from attn import data  # pylint: disable=import-outside-toplevel  (needs the data extras)
      data.check(cfg)

  def load_data(self, cfg, workdir):
    """The data bundle the loop reads (attn.data.DataBundle's interface) of the `data` section."""
    from attn import data  # pylint: disable=import-outside-toplevel  (needs the data extras)
    return data.load(cfg, workdir)

  def train_batches(self, bundle, tc, start_step: int, select_rows=None):
    del tc  # the batch order is a data setting (attn.data)
    return bundle.train_iter(start_step, select_rows)

  def train_tokens(self, bundle, tc, step: int) -> float:
    del tc
    return float(bundle.train_tokens(step))

  def device_batch(self, batch) -> dict:
    return evaluation.device_batch(batch)

  @abc.abstractmethod
  def score(self, bundle, role, hyps: dict, src_lengths: dict) -> dict:
    """Metrics of decoded outputs `hyps` (example_id -> text) against the split's references."""

  def attention_arrays(self, bundle, role, example_ids) -> dict:
    """Arrays attention.npz stores besides the weights, e.g. `image_{id}` and `regions_{id}` for
    the viewer's picture of an image task; none by default."""
    del bundle, role, example_ids
    return {}

  def analysis(self, bundle, role, outputs) -> dict:
    """Task-specific figures of the decoded test outputs (`evaluation.Outputs`) for
    results.json; none by default."""
    del bundle, role, outputs
    return {}

  def model_config(self, cfg, bundle) -> ModelConfig:
    mc = ModelConfig.from_config(cfg, src_vocab=bundle.src_vocab.size,
                                 tgt_vocab=bundle.tgt_vocab.size)
    ref = mc.rnn.match_params_of
    if ref and ref != mc.rnn.decoder:
      mc = match_param_count(mc, mc.replace_paths({"fused": False, "rnn.decoder": ref}))
    # The match is resolved into dec_hidden: the config of record is the concrete model.
    return mc.replace_paths({"rnn.match_params_of": ""})

  def check_model_config(self, cfg, data, train) -> None:
    mc = ModelConfig.from_config(cfg, src_vocab=8, tgt_vocab=8)  # placeholder vocabularies
    check_sections(mc.validate(), data, train)

  def build_model(self, model_config, seed: int, compute_dtype: str = "float32"):
    return build_model(model_config, seed=seed, compute_dtype=compute_dtype)

  def describe_model(self, model_config) -> str:
    v = model_config.variant
    return f"{v['decoder']}/{v['score']}/{v['normalizer']}"

  def loss_options(self, tc) -> dict:
    return {"label_smoothing": tc.label_smoothing}

  def uniform_loss(self, model_config) -> float:
    """log V of the target vocabulary (at least 2 words)."""
    return float(np.log(max(model_config.tgt_vocab, 2)))

  def evaluate(self, run, role: str = "eval") -> dict:
    """Perplexity and the task's scores of greedy outputs of the first
    train.eval_decode_sentences examples (attn.training.evaluation.evaluate)."""
    ev = evaluation.evaluate(run, role, run.tc.eval_decode_sentences)
    return {k: v for k, v in ev.items() if isinstance(v, float)}

  def write_results(self, run, ckpt) -> dict:
    """Decodes the test split with the best checkpoint and writes predictions.txt,
    attention.npz, attention.png and results.json (attn.training.evaluation.write_results)."""
    return evaluation.write_results(run, ckpt)

  def loss(self, model, batch, dropout_key=None, label_smoothing=0.0):
    """The cross-entropy of the targets, or the pointer-generator's on the extended vocabulary
    (model.rnn.pointer; no label smoothing, check_sections), plus the coverage loss
    (model.rnn.coverage; not in the returned NLL)."""
    cfg = model.cfg.rnn  # every architecture's config has it (a Transformer's at its defaults)
    logits, att = model.attention(batch, dropout_key)
    Tt = batch["tgt"].shape[1]
    mask = (jnp.arange(Tt)[None, :] < batch["tgt_lengths"][:, None]).astype(jnp.float32)
    if cfg.pointer:
      logp = copying.gold_log_prob(logits, att.p_gen_logit, att.weights, batch["src_ext"],
                                   batch["tgt_ext"])
      nll = -jnp.sum(logp * mask)
      total, ntok = nll, jnp.sum(mask)
    else:
      total, ntok, nll = sequence_loss(logits, batch["tgt"], batch["tgt_lengths"], label_smoothing)
    if cfg.coverage and cfg.coverage_loss_weight:
      total = total + cfg.coverage_loss_weight * copying.coverage_loss(att.weights, mask)
    return total, ntok, nll

  def decode(self, model, batch, *, max_len: int, search: Search):
    """A `decoding.DecodeOutput` for one batch (the device arrays: src, src_lengths[, src_ext])."""
    src = batch["src"]
    if model.longest_output is not None:  # e.g. a learned position table: no step past its end
      max_len = min(max_len, model.longest_output)
    init = model.initial_decode_state(src, batch["src_lengths"], batch.get("src_ext"),
                                      max_len=max_len)
    common = dict(min_len=search.min_len, block_repeat_ngram=search.block_repeat_ngram,
                  keep_weights=search.attention, shrink_to=search.shrink_to)
    if search.beam_size == 1:
      return decoding.greedy_decode(model.step_fn(), init, src.shape[0], max_len, **common)
    return decoding.beam_search(
        model.step_fn(), init, src.shape[0], max_len, beam_size=search.beam_size,
        length_penalty=search.length_penalty, coverage_penalty=search.coverage_penalty,
        source_lengths=batch["src_lengths"], stop=search.stop, **common)

  def attention(self, model, batch):
    """Teacher-forced `StepAttention` (weights and raw scores, [B, Tt, Ts] each) along
    batch["tgt"], or None when the model never forms the weights (fused)."""
    return model.attention(batch)[1]

  # -- text of outputs on the extended vocabulary

  def _source_oovs(self, bundle, role) -> list[list[str]]:
    """Per example_id: the distinct out-of-vocabulary words of its (truncated) source, in the
    order that numbers them V, V + 1, ... (as the data pipeline's src_ext does). Computed once
    per split of a bundle."""
    cache = self.__dict__.setdefault("_oov_cache", {})
    key = (id(bundle), role)
    if key not in cache:  # the bundle is kept with its entry, so its id is not reused
      cache[key] = (bundle, bundle.source_oovs(role))
    return cache[key][1]

  def output_text(self, bundle, role, example_id: int, ids) -> str:
    """The text of decoded `ids` (up to EOS) for example `example_id` of the split; ids >= V
    are words of that example's source (data.extended_vocab)."""
    if not bundle.config.extended_vocab:
      return bundle.tgt_vocab.decode(ids)
    return bundle.tgt_vocab.decode_extended(ids, self._source_oovs(bundle, role)[example_id])

  def output_labels(self, bundle, role, example_id: int, ids) -> list[str]:
    """One label per decoded id (heatmap rows)."""
    if not bundle.config.extended_vocab:
      return bundle.tgt_vocab.labels(ids)
    return bundle.tgt_vocab.labels_extended(ids, self._source_oovs(bundle, role)[example_id])


def check_sections(mc: ModelConfig, data, train) -> None:
  """The rules where the model section meets the data section (a DataConfig) and the train
  section (a TrainConfig), checked before anything is read or written: ConfigError naming the
  settings on both sides."""
  r = mc.rnn
  if r.pointer and not data.extended_vocab:
    raise ConfigError("model.rnn.pointer=True needs data.extended_vocab=True (and "
                      "data.shared_vocab=True): the copy targets are ids on each example's "
                      "source-extended vocabulary")
  if r.pointer and train.label_smoothing:
    raise ConfigError(f"train.label_smoothing={train.label_smoothing} with model.rnn.pointer="
                      "True: label smoothing is not defined on the pointer-generator's mixed "
                      "distribution; set train.label_smoothing=0")
  if getattr(mc.settings, "share_embeddings", False) and not data.shared_vocab:
    raise ConfigError(f"model.{mc.arch}.share_embeddings=True needs data.shared_vocab=True: "
                      "one embedding serves both sides only over one vocabulary")
  if data.pack:
    check_packable(mc)
  widest = data.widest_batch
  for side, (field, limit, why) in mc.length_limits().items():
    width, source = widest[side]
    if limit < width:
      raise ConfigError(f"{field}={limit} is below the widest {side} batch, {width} tokens "
                        f"({source}): with {why} the model has no position past {field}; "
                        f"raise it to {width} or narrow the data")


def check_packable(mc: ModelConfig) -> None:
  """ConfigError naming the setting that data.pack=True (packed training rows) cannot serve."""
  if mc.arch != "transformer":
    raise ConfigError(f"data.pack=True with model.arch={mc.arch}: only the Transformer keeps "
                      "the examples of a packed row apart (its attention is masked per example); "
                      "a recurrent encoder would carry one example's state into the next")
  for field in ("enc_self", "dec_self", "cross"):
    scope = getattr(mc.transformer, field).scope
    if scope in ("linear", "local_p"):
      raise ConfigError(
          f"data.pack=True with model.transformer.{field}.scope={scope}: "
          + ("linear attention takes key masks only, not the per-example masks of a packed "
             "row" if scope == "linear" else "local_p predicts a window over the whole "
             "row's source, not over one example's") + "; pack with another scope")
  if mc.fused:
    raise ConfigError(f"data.pack=True with model.fused={mc.fused!r}: the fused kernels take key "
                      "lengths, not the per-example masks a packed row needs; set one of them "
                      "False")
