"""Translation: seq2seq (RNN or Transformer) on text corpora and the built-in tasks; BLEU,
chrF, exact match and gold-alignment scores. Entry point: experiments/translate.py."""

from attn.common.applications import APPS, App

APPS.add("translate", App("experiments.translate", "seq2seq translation",
                          task="attn.apps.translate.task:TranslationTask"))
