"""Image captioning: digit strips captioned by a region CNN and an attending recurrent decoder.
Entry point: experiments/caption.py."""

from attn.common.applications import APPS, App


def _task():
  """The task class, imported when first asked for (listing applications imports no model
  code)."""
  from attn.apps.caption.task import CaptionTask  # pylint: disable=import-outside-toplevel
  return CaptionTask


APPS.add("caption", App("experiments.caption", "image captioning: attention over image regions",
                        task=_task))
