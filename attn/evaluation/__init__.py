"""Scoring outputs: corpus BLEU and chrF, multi-reference ROUGE, alignment error rate (`metrics`)."""
