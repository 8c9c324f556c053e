"""The summarization task: the translation task's models, loss and loop (the pointer-generator
and coverage included, attn.training.task), scored with ROUGE against every reference.

Figures of the decoded outputs (results.json, see `analysis`): how much is copied, how many
out-of-vocabulary reference words come back through copying, how often trigrams repeat.
"""

from __future__ import annotations

import numpy as np

from attn.evaluation import metrics as metrics_lib
from attn.data.tokens import EOS, UNK
from attn.training.task import TASKS, TranslationTask


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


@TASKS.register("summarize")
class SummarizationTask(TranslationTask):
  """Seq2seq summarization: ROUGE-1/2/L F1 against every reference (data.reference_fields),
  and figures of how the outputs copy; the pointer-generator and coverage train as in every
  task (attn.training.task)."""

  def score(self, bundle, role, hyps, src_lengths) -> dict:
    """ROUGE-1/2/L F1 x100: `rougeN` the mean over an example's references, `rougeN_max` the
    best one (equal with a single reference), averaged over the examples."""
    del src_lengths
    refs = bundle.reference_sets(role)
    ids = sorted(hyps)
    return metrics_lib.rouge([hyps[i] for i in ids], [refs[i] for i in ids], aggregate="both")

  def selection_metrics(self, bundle) -> tuple[str, ...]:
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
