"""Summarization: attention, pointer-generator and coverage on AESLC and other jsonl/TFDS
corpora; ROUGE against annotations and subject. Entry point: experiments/summarize.py."""

from attn.common.applications import APPS, App


def _task():
  """The task class, imported when first asked for (listing applications imports no model
  code)."""
  from attn.apps.summarize.task import SummarizationTask  # pylint: disable=import-outside-toplevel
  return SummarizationTask


APPS.add("summarize", App("experiments.summarize",
                          "summarization: attention, pointer-generator, coverage",
                          task=_task))
