"""The summarization task: the translation task's models, loss and loop (the pointer-generator
and coverage included, attn.training.task), scored with ROUGE (`summary_rouge`), and figures of the
decoded outputs (results.json, see `analysis`): how much is copied, how many out-of-vocabulary
reference words come back through copying, how often trigrams repeat.

Two ways to score a split whose records carry annotations besides the target (data.reference_fields;
AESLC's dev and test: `ann0`-`ann2`, three subject lines written by annotators, next to the
sender's own subject), kept apart, never pooled into one reference set:

- Against the annotations (`rouge1`, `rouge2`, `rougeL`: each example's mean F1 over its
  annotations; `*_max`: its best annotation): the references the AESLC release adds for
  evaluation (Zhang & Tetreault, ACL 2019, "This Email Could Save Your Life",
  aclanthology.org/P19-1043; data: github.com/ryanzhumich/AESLC, whose repository holds the data
  and a README, no scoring code). NOT VERIFIED, as only the paper's abstract and introduction
  could be read here: how the paper combines an example's three annotations (mean, best, or
  ROUGE-1.5.5's pooled multi-reference counts), which ROUGE package and options it ran (stemming,
  tokenization), and whether the sender's subject is also among its references. Both the mean
  and the best are reported so the comparison can be made either way; neither is claimed to be
  the paper's.
- Against the target field alone (`*_subject`): the single reference PEGASUS scores AESLC with.
  PEGASUS reads TFDS `aeslc` (google-research/pegasus, pegasus/params/public_params.py
  `aeslc_transformer`: test_pattern "tfds:aeslc-test"), whose `subject_line` is the lines after
  `@subject`, the annotations unread (tensorflow/datasets,
  tensorflow_datasets/datasets/aeslc/aeslc_dataset_builder.py `_parse_email_file`), and scores
  with rouge-score, Porter stemming on, F1 (pegasus/eval/text_eval.py: `RougeScorer(["rouge1",
  "rouge2", "rougeL", "rougeLsum"], use_stemmer=True)`, `scorer.score(targets, preds)`). It reports
  the middle of a bootstrap over examples (`BootstrapAggregator`), here the plain mean; for a
  one-line subject rougeLsum equals rougeL.

A split without annotations (training-like, or the shared AESLC copy's dev) is scored against the
target: `rouge1/2/L`, and `*_max` equal to them. Checkpoint selection reads the eval split only
(`selection_metrics`).
"""

from __future__ import annotations

import numpy as np

from attn.evaluation import metrics as metrics_lib
from attn.data.tokens import EOS, UNK
from attn.training.seq2seq_task import Seq2SeqTask

_ROUGE = ("rouge1", "rouge2", "rougeL")


def repeated_ngram_rate(outputs, n: int = 3) -> float:
  """Share of the n-grams of the outputs (token lists) that already occurred earlier in the same
  output (See et al. 2017's duplicate measure); 0 when no output has n tokens."""
  total = repeated = 0
  for toks in outputs:
    seen = set()
    for i in range(len(toks) - n + 1):
      gram = tuple(toks[i:i + n])
      repeated += gram in seen
      seen.add(gram)
      total += 1
  return repeated / total if total else 0.0


def summary_rouge(hypotheses, targets, annotations) -> dict:
  """ROUGE-1/2/L F1 x100 (rouge-score, Porter stemming: attn.evaluation.metrics.rouge), corpus
  means over examples, of `hypotheses` (strings) against each example's target (`targets`, one
  string each) and annotations (`annotations`, a list of strings each, maybe empty); the three
  lists are indexed alike.

  No example with annotations: {"rougeN": F1 against the target, "rougeN_max": the same}.
  Otherwise the two protocols of the module docstring, side by side:
    rougeN: per example, the mean F1 over its annotations; rougeN_max: its best annotation;
      both averaged over the examples that have annotations ("annotated_examples": how many);
    rougeN_subject: F1 against the target alone, averaged over every example.
  """
  subject = metrics_lib.rouge(hypotheses, targets, aggregate="both")
  keep = [i for i, refs in enumerate(annotations) if refs]
  if not keep:
    return subject
  ann = metrics_lib.rouge([hypotheses[i] for i in keep], [annotations[i] for i in keep],
                          aggregate="both")
  return {**ann, **{f"{t}_subject": subject[t] for t in metrics_lib.ROUGE_TYPES},
          "annotated_examples": len(keep)}


class SummarizationTask(Seq2SeqTask):
  """Seq2seq summarization: ROUGE-1/2/L F1 against the annotations where a split has them and
  against the target (`summary_rouge`), and figures of how the outputs copy; the
  pointer-generator and coverage train as in every task (attn.training.seq2seq_task)."""

  scores = (*_ROUGE, *(f"{r}_max" for r in _ROUGE), *(f"{r}_subject" for r in _ROUGE))
  figures = ("annotated_examples", "repeated_trigram_rate", "source_token_share",
             "oov_in_references", "oov_recovered", "oov_copies", "copied_share", "mean_p_gen")
  metrics = (*_ROUGE, "params", "tokens_per_sec", "wall_s")
  columns = ("decoder", "score", "normalizer", "params", *_ROUGE, "tokens_per_sec", "wall_s")
  # against the test split's annotations (mean and best of them) and the sender's subject
  rescored = (*_ROUGE, *(f"{r}_max" for r in _ROUGE), *(f"{r}_subject" for r in _ROUGE))

  def score(self, bundle, role, hyps, src_lengths) -> dict:
    """`summary_rouge` of the decoded examples (`hyps`: example_id -> text, maybe a subset of
    the split), plus "rouge_references": the fields rouge1/2/L were scored against (the
    reference fields, comma-joined, or the target field)."""
    del src_lengths
    ids = sorted(hyps)
    targets, annotations = bundle.references(role), bundle.annotations(role)
    out = summary_rouge([hyps[i] for i in ids], [targets[i] for i in ids],
                        [annotations[i] for i in ids])
    cfg = bundle.config
    out["rouge_references"] = (",".join(cfg.reference_fields) if "annotated_examples" in out
                               else cfg.target_field or "target")
    return out

  def selection_metrics(self, bundle) -> tuple[str, ...]:
    """rouge1, then rougeL, then rouge2 of the eval split (data.eval_split, AESLC: dev; the
    loop never scores the test split before the end): against the eval split's annotations when
    data.reference_fields are set, else against its target."""
    return ("rouge1", "rougeL", "rouge2")

  def analysis(self, bundle, role, outputs) -> dict:
    """Figures of the decoded outputs (the output tokens, EOS left out; source and reference
    tokens as the vocabulary tokenizes them):

    repeated_trigram_rate: share of output trigrams repeating an earlier one of that output;
    source_token_share: share of output tokens that occur in the example's source;
    oov_recovered: of the reference words outside the vocabulary that occur in the source (only
      copying can produce them), the share the output contains; oov_in_references: their count;
    copied_share, mean_p_gen (pointer-generator): share of output tokens emitted with
      p_gen < 0.5 (the switch favoured copying) and the mean p_gen over output tokens;
    oov_copies: output tokens that are source words outside the vocabulary (ids >= V).
    """
    vocab = bundle.tgt_vocab
    sources, refs = bundle.sources(role), bundle.references(role)
    cap = bundle.config.max_src_len - 1
    ids = sorted(outputs.text)
    out_tokens, in_source, n_tokens = [], 0, 0
    oov_total = oov_found = oov_copies = 0
    for i in ids:
      # The output's own tokens (one label per id, a copied word as itself, <unk> as one token),
      # not its detokenized text tokenized again, which would split "<unk>" into three.
      out_ids = np.asarray(outputs.tokens[i], np.int64)
      toks = [t for t, y in zip(outputs.tgt_labels[i], out_ids) if y != EOS]
      out_tokens.append(toks)
      src = set(vocab.tokenize(sources[i])[:cap])
      in_source += sum(t in src for t in toks)
      n_tokens += len(toks)
      copyable = {t for t in vocab.tokenize(refs[i]) if vocab.token_to_id(t) == UNK
                  and t in src}
      oov_total += len(copyable)
      oov_found += len(copyable & set(toks))
      oov_copies += int(np.sum(out_ids >= vocab.size))
    out = {"repeated_trigram_rate": repeated_ngram_rate(out_tokens, 3),
           "source_token_share": in_source / max(n_tokens, 1),
           "oov_in_references": float(oov_total),
           "oov_recovered": oov_found / oov_total if oov_total else 0.0,
           "oov_copies": float(oov_copies)}
    gates = [outputs.extras[i]["p_gen"][np.asarray(outputs.tokens[i]) != EOS] for i in ids
             if "p_gen" in outputs.extras.get(i, {})]  # the EOS step left out
    if gates:
      g = np.concatenate(gates)
      out.update(copied_share=float(np.mean(g < 0.5)) if g.size else 0.0,
                 mean_p_gen=float(np.mean(g)) if g.size else 0.0)
    return out
