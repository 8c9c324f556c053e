"""Summarization: attention, pointer-generator and coverage on AESLC and other jsonl/TFDS
corpora; ROUGE against annotations and subject. Entry point: experiments/summarize.py."""

from attn.common.applications import APPS, App

APPS.add("summarize", App("experiments.summarize",
                          "summarization: attention, pointer-generator, coverage",
                          task="attn.apps.summarize.task:SummarizationTask"))
