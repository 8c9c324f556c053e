"""Translation: seq2seq (RNN or Transformer) on text corpora and the built-in tasks; BLEU,
chrF, exact match and gold-alignment scores. Entry point: experiments/translate.py."""

from attn.common.applications import APPS, App


def _task():
  """The task class, imported when first asked for (listing applications imports no model
  code)."""
  from attn.apps.translate.task import TranslationTask  # pylint: disable=import-outside-toplevel
  return TranslationTask


APPS.add("translate", App("experiments.translate", "seq2seq translation",
                          task=_task))
