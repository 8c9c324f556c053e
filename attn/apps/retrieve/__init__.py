"""Retrieval, then read: two-hop questions in pools of distractor stories, one retriever +
reader per retrieval mode and pool size. Entry point: experiments/retrieve.py."""

from attn.common.applications import APPS, App


def _task():
  """The task class, imported when first asked for (listing applications imports no model
  code)."""
  from attn.apps.retrieve.task import RetrieveTask  # pylint: disable=import-outside-toplevel
  return RetrieveTask


APPS.add("retrieve", App("experiments.retrieve", "retrieval, then read: recall@k and accuracy",
                         task=_task,
                         launchable=False, results_file="retrieve.json"))
