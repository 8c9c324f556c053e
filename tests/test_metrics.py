"""attn.evaluation.metrics on hand-computed cases and sacreBLEU's documented example."""

import numpy as np
import pytest

from attn.evaluation import metrics

# sacreBLEU's README (Python API section): two reference streams; BLEU = 48.53, chrF2 = 59.73.
SYS = ["The dog bit the man.", "It wasn't surprising.", "The man had just bitten him."]
REFS_A = ["The dog bit the man.", "It was not unexpected.", "The man bit him first."]
REFS_B = ["The dog had bit the man.", "No one was surprised.", "The man had bitten the dog."]


def test_sacrebleu_documented_example():
  refs = [[a, b] for a, b in zip(REFS_A, REFS_B)]  # ours: per hypothesis
  assert metrics.bleu(SYS, refs) == pytest.approx(48.53, abs=0.005)
  assert metrics.chrf(SYS, refs) == pytest.approx(59.73, abs=0.005)


def test_bleu_hand_computed():
  assert metrics.bleu(["the cat sat on the mat"], ["the cat sat on the mat"]) == pytest.approx(100)
  # p1..p4 = 4/5, 3/4, 2/3, 1/2, equal lengths (BP = 1): BLEU = (1/5)^(1/4).
  assert metrics.bleu(["a b c d e"], ["a b c d f"]) == pytest.approx(100 * 0.2 ** 0.25, abs=1e-6)
  # All precisions 1, hypothesis 4 tokens vs 5: BP = exp(1 - 5/4).
  assert metrics.bleu(["a b c d"], ["a b c d e"]) == pytest.approx(100 * np.exp(-0.25), abs=1e-6)
  # Corpus level: n-gram counts pooled over sentences, not averaged scores.
  pooled = metrics.bleu(["a b c d e", "a b c d f"], ["a b c d f", "a b c d f"])
  assert pooled == pytest.approx(100 * (9 / 10 * 7 / 8 * 5 / 6 * 3 / 4) ** 0.25, abs=1e-6)


def test_lowercase_option():
  assert metrics.bleu(["THE CAT SAT ON A MAT"], ["the cat sat on a mat"]) == 0.0
  assert metrics.bleu(["THE CAT SAT ON A MAT"], ["the cat sat on a mat"],
                      lowercase=True) == pytest.approx(100)
  assert metrics.chrf(["ABC"], ["abc"], lowercase=True) == pytest.approx(100)


def test_chrf_hand_computed():
  # Orders with n-grams on both sides: 1 (P = R = 2/3), 2 (1/2), 3 (0); F = mean P = 7/18.
  assert metrics.chrf(["abc"], ["abd"]) == pytest.approx(100 * 7 / 18, abs=1e-6)
  # P = 1, R = (1/2 + 1/3) / 2 = 5/12; F_2 = 5 P R / (4 P + R) = 25/53 (recall-weighted).
  assert metrics.chrf(["ab"], ["abcd"]) == pytest.approx(100 * 25 / 53, abs=1e-6)


def test_rouge_hand_computed_and_stemming():
  r = metrics.rouge(["the cat sat"], ["the cat ran"])
  assert r["rouge1"] == pytest.approx(200 / 3)  # 2 of 3 unigrams both ways
  assert r["rouge2"] == pytest.approx(50)       # "the cat" of 2 bigrams
  assert r["rougeL"] == pytest.approx(200 / 3)  # LCS "the cat"
  assert metrics.rouge(["cats running"], ["cat runs"]) == pytest.approx(
      {"rouge1": 100, "rouge2": 100, "rougeL": 100})  # Porter stemming
  # Corpus value = mean over examples; several references: the best one.
  assert metrics.rouge(["a b", "c d"], ["a b", "x y"])["rouge1"] == pytest.approx(50)
  assert metrics.rouge(["c d"], [["x y", "c d"]])["rouge1"] == pytest.approx(100)


def test_input_checks():
  with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
    metrics.bleu(["a", "b"], ["a"])
  with pytest.raises(TypeError):
    metrics.bleu("a b", "a b")


def test_exact_match_and_buckets():
  hyps = ["a b", "c", "d e f", "g", ["1", "2"], "x"]
  refs = ["a b", "c ", "d e f", "h", ["1", "2"], "x"]  # "c " != "c": no normalization
  assert metrics.exact_match(hyps, refs) == pytest.approx(4 / 6)
  src = [3, 12, 15, 19, 25, 10]
  assert metrics.exact_match_by_bucket(hyps, refs, src, 10) == pytest.approx(
      {"0-9": 1.0, "10-19": 0.5, "20-29": 1.0})
  got = metrics.exact_match_by_bucket(hyps, refs, src, [0, 10, 20, 30])
  assert list(got) == ["0-9", "10-19", "20-29"]
  # Edges of unequal width; ordered by length, not alphabetically; empty buckets left out.
  got = metrics.exact_match_by_bucket(hyps, refs, src, [3, 11, 20, 100, 200])
  assert list(got) == ["3-10", "11-19", "20-99"]
  assert got == pytest.approx({"3-10": 1.0, "11-19": 1 / 3, "20-99": 1.0})
  with pytest.raises(ValueError, match=r"lengths \[3\] fall outside"):
    metrics.exact_match_by_bucket(hyps, refs, src, [5, 30])
  # Token arrays compare element by element.
  assert metrics.exact_match([np.array([4, 5])], [[4, 5]]) == 1.0


def aer_case():
  """Example 0: 3x3 by hand. Example 1: lengths (1, 2) in [3, 3] arrays, padding full of traps."""
  pred = np.zeros((2, 3, 3))
  pred[0] = [[0.7, 0.2, 0.1],   # -> 0   gold {0}      hit
             [0.1, 0.3, 0.6],   # -> 2   gold {1}      miss
             [0.2, 0.5, 0.3]]   # -> 1   gold {1, 2}   hit
  gold = np.zeros((2, 3, 3))
  gold[0] = [[1, 0, 0], [0, 1, 0], [0, 0.5, 0.5]]
  pred[1] = [[0.4, 0.6, 9.0],   # valid source 0..1 -> 1; the 9 sits in source padding
             [9.0, 9.0, 9.0],   # target padding
             [9.0, 9.0, 9.0]]
  gold[1] = [[0, 1, 0], [1, 0, 0], [1, 0, 0]]  # rows 1-2 are past the target length: ignored
  return pred, gold, np.array([3, 1]), np.array([3, 2])


def test_alignment_error_rate_hand_computed():
  pred, gold, tl, sl = aer_case()
  # Example 0 alone: A = {(0,0), (1,2), (2,1)}, S = {(0,0), (1,1), (2,1), (2,2)}, |A∩S| = 2.
  assert metrics.alignment_error_rate(pred[:1], gold[:1], tl[:1], sl[:1]) == pytest.approx(
      1 - 2 * 2 / (3 + 4))
  # Both: example 1 adds one hit (0 -> 1); counts pooled: |A| = 4, |S| = 5, |A∩S| = 3.
  assert metrics.alignment_error_rate(pred, gold, tl, sl) == pytest.approx(1 - 2 * 3 / 9)
  links = metrics.hard_alignment(pred, tl, sl)
  assert links.sum() == 4 and links[1, 0, 1] and not links[1, 0, 2]
  # Gold as the prediction: row 2 has 2 gold links but one argmax link, so AER = 1 - 6/7 > 0.
  perfect = metrics.alignment_error_rate(gold[:1], gold[:1], tl[:1], sl[:1])
  assert perfect == pytest.approx(1 - 2 * 3 / (3 + 4))


def test_alignment_unaligned_tokens_and_no_attention():
  pred, gold, tl, sl = aer_case()
  gold[0, 1] = 0  # target token 1 now unaligned: its link is a false positive unless skipped
  assert metrics.alignment_error_rate(pred[:1], gold[:1], tl[:1], sl[:1]) == pytest.approx(
      1 - 2 * 2 / (3 + 3))
  assert metrics.alignment_error_rate(pred[:1], gold[:1], tl[:1], sl[:1],
                                      skip_unaligned=True) == pytest.approx(1 - 2 * 2 / (2 + 3))
  # All-zero attention (a model without attention) predicts no links: AER = 1.
  assert metrics.alignment_error_rate(np.zeros_like(pred), gold, tl, sl) == pytest.approx(1.0)


def test_attention_on_gold_hand_computed():
  pred, gold, tl, sl = aer_case()
  # Example 0 rows: 0.7, 0.3, 0.5 + 0.3; example 1 row 0: 0.6 (padding ignored).
  got = metrics.attention_on_gold(pred, gold, tl, sl)
  assert got == pytest.approx((0.7 + 0.3 + 0.8 + 0.6) / 4)
  assert metrics.attention_on_gold(gold, gold, tl, sl) == pytest.approx(1.0)
  with pytest.raises(ValueError, match="must both be"):
    metrics.attention_on_gold(pred[:, :2], gold, tl, sl)
