"""The reading-focus demo: memory-network readers trained with each normalizer on bAbI-style
stories, and the page that shows where they look. Entry point: experiments/focus.py."""

from attn.common.applications import APPS, App


def _task():
  """The task class, imported when first asked for (listing applications imports no model
  code)."""
  from attn.apps.focus.task import FocusTask  # pylint: disable=import-outside-toplevel
  return FocusTask


APPS.add("focus", App("experiments.focus", "the reading-focus demo: readers per normalizer",
                      task=_task, launchable=False,
                      results_file="focus.json"))
