"""Evaluation metrics: sacreBLEU / chrF, ROUGE, exact match (overall and per source-length bucket),
and the quality of attention as an alignment (AER on hard alignments, attention mass on gold links).

Scales: bleu, chrf and rouge are in [0, 100], as sacreBLEU and papers report them; exact match
(an accuracy) and the alignment metrics are fractions in [0, 1] (AER as Och & Ney 2003 define it).

`references` is one entry per hypothesis: a string, or a list of alternative reference strings
(multi-reference; the lists may differ in length). Text metrics are corpus level.

sacrebleu and rouge-score are imported inside the functions: they are slow to import (nltk)
and are not installed on the GPU machine, where `attn` must still import.

Alignment arrays: pred_weights and gold are [B, Tt, Ts], row i of example b being target token i.
pred_weights must come from teacher forcing on the same reference target as gold (so rows match);
gold has positive entries on gold links (rows normalized for aligned tokens, zero rows for padding
and unaligned tokens); tgt_lengths, src_lengths [B] bound the valid region, entries outside it
are ignored in both arrays.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

TextRefs = Sequence[str] | Sequence[Sequence[str]]


def _ref_lists(hypotheses, references):
  """Per-hypothesis lists of references, checked against the hypotheses."""
  if isinstance(hypotheses, str) or isinstance(references, str):
    raise TypeError("hypotheses and references must be sequences of strings, not one string")
  if len(hypotheses) != len(references):
    raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
  if not hypotheses:
    raise ValueError("no hypotheses to score")
  refs = [[r] if isinstance(r, str) else list(r) for r in references]
  if any(not r for r in refs):
    raise ValueError("every hypothesis needs at least one reference")
  return refs


def _ref_streams(hypotheses, references):
  """sacrebleu's layout: reference streams [n_refs][n_hyps], None where a hypothesis has fewer."""
  refs = _ref_lists(hypotheses, references)
  n = max(len(r) for r in refs)
  return [[r[i] if i < len(r) else None for r in refs] for i in range(n)]


def bleu(hypotheses: Sequence[str], references: TextRefs, *, lowercase: bool = False,
         tokenize: str = "13a") -> float:
  """Corpus sacreBLEU in [0, 100] (default 13a tokenization, exp smoothing, as sacrebleu's CLI).

  Pass detokenized text: sacreBLEU tokenizes itself, so its scores compare across papers.
  """
  from sacrebleu.metrics import BLEU
  metric = BLEU(lowercase=lowercase, tokenize=tokenize)
  return float(metric.corpus_score(list(hypotheses), _ref_streams(hypotheses, references)).score)


def chrf(hypotheses: Sequence[str], references: TextRefs, *, lowercase: bool = False,
         word_order: int = 0) -> float:
  """Corpus chrF (beta = 2, character n-grams up to 6) in [0, 100]; word_order=2 gives chrF++."""
  from sacrebleu.metrics import CHRF
  metric = CHRF(lowercase=lowercase, word_order=word_order)
  return float(metric.corpus_score(list(hypotheses), _ref_streams(hypotheses, references)).score)


ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")


def _rouge_f1(hypotheses, references) -> dict[str, list[np.ndarray]]:
  """ROUGE type -> per example, the F1 (in [0, 1]) against each of its references."""
  from rouge_score import rouge_scorer
  scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True)
  out = {t: [] for t in ROUGE_TYPES}
  for hyp, refs in zip(hypotheses, _ref_lists(hypotheses, references)):
    scores = [scorer.score(ref, hyp) for ref in refs]  # (target, prediction)
    for t in ROUGE_TYPES:
      out[t].append(np.array([s[t].fmeasure for s in scores]))
  return out


ROUGE_AGGREGATES = ("max", "mean", "both")


def rouge(hypotheses: Sequence[str], references: TextRefs, *,
          aggregate: str = "max") -> dict[str, float]:
  """Corpus mean of ROUGE-1/2/L F1 in [0, 100] (rouge-score, Porter stemming on).

  With several references per hypothesis (the lists may differ in length), each example's score
  against them is, per ROUGE type:
    aggregate="max" (default): its best reference -> keys "rouge1", "rouge2", "rougeL" (as
      rouge-score's score_multi);
    aggregate="mean": the mean over its references -> the same keys;
    aggregate="both": the mean -> "rouge1", "rouge2", "rougeL", and the best ->
      "rouge1_max", "rouge2_max", "rougeL_max".
  With one reference per example every aggregate is that reference's score. A hypothesis equal to
  one of its 3 references scores 100 on the max and (100 + F1(ref 2) + F1(ref 3)) / 3 on the mean.
  rouge-score's tokenizer keeps only [a-z0-9]: non-Latin text scores 0.
  """
  if aggregate not in ROUGE_AGGREGATES:
    raise ValueError(f"aggregate={aggregate!r}; use one of {', '.join(ROUGE_AGGREGATES)}")
  f1 = _rouge_f1(hypotheses, references)
  mean = {t: 100.0 * float(np.mean([s.mean() for s in f1[t]])) for t in ROUGE_TYPES}
  best = {t: 100.0 * float(np.mean([s.max() for s in f1[t]])) for t in ROUGE_TYPES}
  if aggregate == "max":
    return best
  if aggregate == "mean":
    return mean
  return {**mean, **{f"{t}_max": v for t, v in best.items()}}


def _key(x):
  return x if isinstance(x, str) else tuple(np.asarray(x).tolist())


def exact_match(hypotheses: Sequence, references: Sequence) -> float:
  """Fraction (in [0, 1]) of hypotheses equal to their reference. Items are strings (compared
  exactly, no normalization) or token sequences (lists / 1-D arrays, element by element)."""
  if len(hypotheses) != len(references):
    raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
  if not len(hypotheses):
    raise ValueError("no hypotheses to score")
  hits = sum(_key(h) == _key(r) for h, r in zip(hypotheses, references))
  return hits / len(hypotheses)


def length_buckets(src_lengths, buckets: int | Sequence[int]) -> list[str]:
  """The bucket label ("10-19") of every length.

  buckets: an int width w (buckets [0, w), [w, 2w), ...), or increasing edges e_0 < e_1 < ...
  (buckets [e_0, e_1), [e_1, e_2), ...; a length outside [e_0, e_last) is an error).
  """
  lengths = np.asarray(src_lengths, np.int64).reshape(-1)
  if isinstance(buckets, (int, np.integer)):
    if buckets < 1:
      raise ValueError(f"bucket width must be >= 1, got {buckets}")
    lo = lengths // buckets * buckets
    return [f"{a}-{a + buckets - 1}" for a in lo]
  edges = np.asarray(buckets, np.int64)
  if edges.ndim != 1 or len(edges) < 2 or (np.diff(edges) <= 0).any():
    raise ValueError(f"bucket edges must increase, at least two of them; got {list(buckets)}")
  outside = (lengths < edges[0]) | (lengths >= edges[-1])
  if outside.any():
    raise ValueError(f"lengths {sorted(set(lengths[outside].tolist()))} fall outside the bucket "
                     f"edges [{edges[0]}, {edges[-1]})")
  i = np.searchsorted(edges, lengths, side="right") - 1
  return [f"{edges[k]}-{edges[k + 1] - 1}" for k in i]


def _bucket_members(n_hyps: int, n_refs: int, src_lengths, buckets) -> dict[str, list[int]]:
  """{bucket label: example indices} in increasing length order, empty buckets left out; a
  ValueError when the counts of hypotheses, references and lengths differ."""
  n = len(np.asarray(src_lengths).reshape(-1))
  if not n_hyps == n_refs == n:
    raise ValueError(f"{n_hyps} hypotheses, {n_refs} references and {n} source lengths")
  labels = length_buckets(src_lengths, buckets)
  return {label: [i for i, l in enumerate(labels) if l == label]
          for label in sorted(set(labels), key=lambda s: int(s.split("-")[0]))}


def exact_match_by_bucket(hypotheses: Sequence, references: Sequence, src_lengths,
                          buckets: int | Sequence[int]) -> dict[str, float]:
  """Exact match (fraction) per source-length bucket, {"10-19": 0.85, ...}, in increasing length
  order; buckets with no example are left out. See length_buckets for `buckets`."""
  members = _bucket_members(len(hypotheses), len(references), src_lengths, buckets)
  return {label: exact_match([hypotheses[i] for i in idx], [references[i] for i in idx])
          for label, idx in members.items()}


def bleu_by_bucket(hypotheses: Sequence[str], references: TextRefs, src_lengths,
                   buckets: int | Sequence[int], *, lowercase: bool = False) -> dict[str, dict]:
  """Corpus BLEU of each source-length bucket (Bahdanau et al. 2015, Fig. 2, by bucket):
  {"10-19": {"bleu": 31.2, "sentences": 412}, ...} in increasing length order, empty buckets
  left out. See length_buckets for `buckets`; references as for `bleu`."""
  members = _bucket_members(len(hypotheses), len(references), src_lengths, buckets)
  return {label: {"bleu": bleu([hypotheses[i] for i in idx], [references[i] for i in idx],
                               lowercase=lowercase), "sentences": len(idx)}
          for label, idx in members.items()}


# ----------------------------------------------------------------------------- alignment

def _valid_region(shape, tgt_lengths, src_lengths):
  """Boolean [B, Tt, Ts]: True inside each example's target x source lengths."""
  B, Tt, Ts = shape
  tgt = np.asarray(tgt_lengths).reshape(-1)
  src = np.asarray(src_lengths).reshape(-1)
  if len(tgt) != B or len(src) != B:
    raise ValueError(f"need {B} target and source lengths, got {len(tgt)} and {len(src)}")
  if (tgt > Tt).any() or (src > Ts).any() or (tgt < 0).any() or (src < 0).any():
    raise ValueError(f"lengths exceed the arrays' [Tt={Tt}, Ts={Ts}]: tgt {tgt}, src {src}")
  return (np.arange(Tt)[None, :, None] < tgt[:, None, None]) & \
         (np.arange(Ts)[None, None, :] < src[:, None, None])


def _check_pair(pred_weights, gold):
  pred, gold = np.asarray(pred_weights, np.float64), np.asarray(gold, np.float64)
  if pred.ndim != 3 or pred.shape != gold.shape:
    raise ValueError(f"pred_weights and gold must both be [B, Tt, Ts], got {pred.shape} and "
                     f"{gold.shape}")
  return pred, gold


def hard_alignment(pred_weights, tgt_lengths, src_lengths):
  """Boolean links [B, Tt, Ts]: for each valid target token, the argmax of its attention over the
  valid source positions (first on ties). A row with no attention mass there (e.g. a model
  without attention, all zeros) gets no link."""
  w = np.asarray(pred_weights, np.float64)
  valid = _valid_region(w.shape, tgt_lengths, src_lengths)
  w = np.where(valid, w, -np.inf)
  j = np.argmax(w, axis=-1)                                    # [B, Tt]
  links = np.zeros(w.shape, bool)
  np.put_along_axis(links, j[..., None], True, axis=-1)
  has_mass = (np.where(valid, w, 0.0) > 0).any(-1, keepdims=True)
  return links & valid & has_mass


def alignment_error_rate(pred_weights, gold, tgt_lengths, src_lengths, *,
                         skip_unaligned: bool = False) -> float:
  """Corpus AER of the attention's hard alignment, in [0, 1] (lower is better).

  A = hard_alignment(pred_weights) (one link per target token), S = P = gold links (gold > 0):
  AER = 1 - (|A∩S| + |A∩P|) / (|A| + |S|) = 1 - 2|A∩S| / (|A| + |S|) (Och & Ney 2003), counts
  summed over the whole batch. skip_unaligned=True drops A's links for target tokens that have
  no gold link (the attention must point somewhere; by default that counts as an error).
  """
  pred, gold = _check_pair(pred_weights, gold)
  valid = _valid_region(pred.shape, tgt_lengths, src_lengths)
  S = (gold > 0) & valid
  A = hard_alignment(pred, tgt_lengths, src_lengths)
  if skip_unaligned:
    A &= S.any(-1, keepdims=True)
  denom = A.sum() + S.sum()
  if denom == 0:
    raise ValueError("no predicted or gold links in the valid region: AER is undefined")
  return float(1.0 - 2.0 * (A & S).sum() / denom)


def attention_on_gold(pred_weights, gold, tgt_lengths, src_lengths) -> float:
  """Soft alignment quality in [0, 1]: the attention mass on gold links, sum_j w_ij [gold_ij > 0],
  averaged over the valid target tokens that have at least one gold link. 1 = all attention on
  gold source positions."""
  pred, gold = _check_pair(pred_weights, gold)
  valid = _valid_region(pred.shape, tgt_lengths, src_lengths)
  S = (gold > 0) & valid
  aligned = S.any(-1)                                          # [B, Tt]
  if not aligned.any():
    raise ValueError("no gold links in the valid region")
  mass = np.where(S, pred, 0.0).sum(-1)                        # [B, Tt]
  return float(mass[aligned].mean())
