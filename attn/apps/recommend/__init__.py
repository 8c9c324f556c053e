"""Next-item recommendation on a generated interaction log with planted triggers: SASRec-style
self-attention against mean-pooling and a GRU. Entry point: experiments/recommend.py."""

from attn.common.applications import APPS, App


def _task():
  """The task class, imported when first asked for (listing applications imports no model
  code)."""
  from attn.apps.recommend.task import RecommendTask  # pylint: disable=import-outside-toplevel
  return RecommendTask


def _diagnose():
  """The diagnosis hook of a finished run, imported when first asked for."""
  # pylint: disable-next=import-outside-toplevel
  from attn.apps.recommend.diagnosis import diagnose_workdir
  return diagnose_workdir


APPS.add("recommend", App("experiments.recommend",
                          "next-item recommendation: self-attention, mean-pooling, GRU",
                          task=_task,
                          diagnose=_diagnose))
