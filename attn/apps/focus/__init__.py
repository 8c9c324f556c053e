"""The reading-focus demo: memory-network readers trained with each normalizer on bAbI-style
stories, and the page that shows where they look. Entry point: experiments/focus.py."""

from attn.common.applications import APPS, App

APPS.add("focus", App("experiments.focus", "the reading-focus demo: readers per normalizer",
                      task="attn.apps.focus.task:FocusTask", launchable=False,
                      results_file="focus.json"))
