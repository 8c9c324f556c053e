"""The translation task: seq2seq on text corpora (Multi30k, TFDS, jsonl) and the built-in tasks
(attn.data.builtin_tasks), scored by BLEU / chrF, exact match and, where the data has gold
alignments, exact match by source length (and AER, attention on gold: attn.training.evaluation).
"""

from __future__ import annotations

from attn.evaluation import metrics as metrics_lib
from attn.training.seq2seq_task import Seq2SeqTask


class TranslationTask(Seq2SeqTask):
  """Seq2seq translation (and built-in tasks): BLEU / chrF, exact match, gold-alignment scores."""

  scores = ("bleu", "chrf", "exact_match")
  figures = ("aer", "attention_on_gold")
  nested = ("exact_match_by_src_len",)
  metrics = ("bleu", "exact_match", "params", "tokens_per_sec", "wall_s")
  columns = ("decoder", "score", "normalizer", "params", "bleu", "chrf", "exact_match",
             "tokens_per_sec", "wall_s")
  notes = (("exact_match_by_src_len", "exact match by source length"),)
  rescored = ("bleu",)

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
