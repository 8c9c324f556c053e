"""Image captioning: digit strips captioned by a region CNN and an attending recurrent decoder.
Entry point: experiments/caption.py."""

from attn.common.applications import APPS, App

APPS.add("caption", App("experiments.caption", "image captioning: attention over image regions",
                        task="attn.apps.caption.task:CaptionTask"))
