"""The image captioning task: digit strips (attn.apps.caption.data) captioned by the region CNN
and a recurrent decoder (attn.apps.caption.model), in the same loop, workdir layout and resume
as translation.

What differs from translation is only what the `Task` interface leaves to a task: the data
section and bundle (`data_config`, `load_data`), the model (`build_model`, with the same
model.rnn.* settings and the same parameter-count match of the no-attention baseline), the
scores (exact match and digit accuracy, overall and by the number of digits in the image) and
the image and region boxes stored in attention.npz for the viewer. The loss, decoding and the
teacher-forced attention are the translation task's: the captioner is a Seq2Seq.

AER and attention on gold read the EOS step as unaligned (no region holds "the end"), so AER
leaves its attention out (`aer_skips_unaligned`).
"""

from __future__ import annotations

from attn.apps.caption import data as captions
from attn.errors import ConfigError
from attn.evaluation import metrics as metrics_lib
from attn.models import ModelConfig, match_param_count
from attn.apps.caption.model import build_captioner
from attn.training.seq2seq_task import Seq2SeqTask
from attn.training.task import refuse_changed_data

_CAPTION_VOCAB = 14  # 4 reserved ids and the 10 digits (attn.apps.caption.data)


def digit_accuracy(hyps: list[str], refs: list[str]) -> float:
  """Share of reference digits the output has at the same position (a missing or extra digit
  shifts nothing: position i of the output is compared with position i of the reference)."""
  right = total = 0
  for h, r in zip(hyps, refs):
    h, r = h.split(), r.split()
    right += sum(a == b for a, b in zip(h, r))
    total += len(r)
  return right / max(total, 1)


def by_digit_count(hyps: list[str], refs: list[str], metric) -> dict[str, float]:
  """`metric(hyps, refs)` over the images of each number of digits: {"1": ..., "2": ...}."""
  counts = [len(r.split()) for r in refs]
  out = {}
  for n in sorted(set(counts)):
    pick = [i for i, c in enumerate(counts) if c == n]
    out[str(n)] = metric([hyps[i] for i in pick], [refs[i] for i in pick])
  return out


class CaptionTask(Seq2SeqTask):
  """Caption digit strips: exact match and digit accuracy (by number of digits too); AER and
  attention on the gold cell."""

  scores = ("digit_accuracy", "exact_match")
  figures = ("aer", "attention_on_gold")
  nested = ("exact_match_by_digits", "digit_accuracy_by_digits")
  metrics = ("exact_match", "digit_accuracy", "aer", "attention_on_gold", "params", "wall_s")
  columns = ("decoder", "score", "normalizer", "params", "exact_match", "digit_accuracy", "aer",
             "attention_on_gold", "wall_s")
  notes = (("exact_match_by_digits", "exact match by number of digits"),)
  aer_skips_unaligned = True
  sections = {**Seq2SeqTask.sections, "data": captions.CaptionDataConfig}

  def check_resumed_data(self, recorded, dc) -> None:
    refuse_changed_data(recorded, dc)

  def load_data(self, cfg, workdir):
    return captions.load(cfg, workdir)

  def _model_config(self, cfg, data) -> ModelConfig:
    return ModelConfig.from_config(cfg, src_vocab=data.pixels, tgt_vocab=_CAPTION_VOCAB)

  def model_config(self, cfg, bundle) -> ModelConfig:
    mc = self._model_config(cfg, bundle.config)
    ref = mc.rnn.match_params_of
    if ref and ref != mc.rnn.decoder:
      mc = match_param_count(mc, mc.replace_paths({"rnn.decoder": ref}), build=build_captioner)
    return mc.replace_paths({"rnn.match_params_of": ""})

  def check_model_config(self, cfg, data, train) -> None:
    del train
    mc = self._model_config(cfg, data)
    if mc.arch != "rnn":
      raise ConfigError(f"model.arch={mc.arch!r}: the captioner's decoder is recurrent "
                        "(model.arch='rnn'); its settings are model.rnn.*")
    if mc.rnn.pointer:
      raise ConfigError("model.rnn.pointer=True: a caption has no source words to copy")
    if mc.fused:
      raise ConfigError(f"model.fused={mc.fused!r}: the captioner's attention runs unfused "
                        "(model.fused=False)")
    if data.cells > mc.max_src_len:
      raise ConfigError(f"data.cells={data.cells} is over model.max_src_len={mc.max_src_len}, "
                        "the most regions the position embeddings cover")
    mc.validate()

  def build_model(self, model_config, seed: int, compute_dtype: str = "float32"):
    return build_captioner(model_config, seed=seed, compute_dtype=compute_dtype)

  def output_text(self, bundle, role, example_id, ids):
    return bundle.tgt_vocab.decode(ids)

  def output_labels(self, bundle, role, example_id, ids):
    return bundle.tgt_vocab.labels(ids)

  def score(self, bundle, role, hyps, src_lengths) -> dict:
    del src_lengths
    refs_all = bundle.references(role)
    ids = sorted(hyps)
    h, r = [hyps[i] for i in ids], [refs_all[i] for i in ids]
    return {"digit_accuracy": digit_accuracy(h, r),
            "exact_match": metrics_lib.exact_match(h, r),
            "digit_accuracy_by_digits": by_digit_count(h, r, digit_accuracy),
            "exact_match_by_digits": by_digit_count(h, r, metrics_lib.exact_match)}

  def selection_metrics(self, bundle) -> tuple[str, ...]:
    return ("exact_match", "digit_accuracy")

  def attention_arrays(self, bundle, role, example_ids) -> dict:
    """`image_{id}` [H, W] uint8 (white ink on black) and `regions_{id}` [R, 4] int32 (top,
    left, height, width in the image's pixels): the picture under each attention column."""
    out = {}
    for i in example_ids:
      out[f"image_{i}"] = bundle.image(role, i)
      out[f"regions_{i}"] = bundle.regions()
    return out
