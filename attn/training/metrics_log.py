"""The run's metrics on disk: metrics.jsonl (one JSON object a line) and TensorBoard events."""

from __future__ import annotations

import json
import logging
import os

log = logging.getLogger(__name__)


class MetricsWriter:
  """Appends `{"step", "split", **values}` lines to metrics.jsonl and scalars to TensorBoard
  (tensorboardX, when installed)."""

  def __init__(self, workdir):
    self.path = os.path.join(workdir, "metrics.jsonl")
    try:
      from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
      self.tb = SummaryWriter(os.path.join(workdir, "tb"))
    except ImportError:
      log.warning("tensorboardX is not installed: metrics go to metrics.jsonl only")
      self.tb = None

  def write(self, step, split, values):
    with open(self.path, "a") as f:
      f.write(json.dumps({"step": step, "split": split, **values}) + "\n")
    if self.tb is not None:
      for k, v in values.items():
        self.tb.add_scalar(f"{split}/{k}", v, step)
      self.tb.flush()
