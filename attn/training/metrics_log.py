"""The run's metrics on disk: metrics.jsonl (one JSON object a line) and TensorBoard events."""

from __future__ import annotations

import json
import logging
import os

from attn.training import distributed
from attn.common.files import write_text

log = logging.getLogger(__name__)


class MetricsWriter:
  """Appends `{"step", "split", **values}` lines to metrics.jsonl and scalars to TensorBoard
  (tensorboardX, when installed). In a run over several processes only process 0 writes (every
  process computes the same replicated metrics); on the others `write` does nothing."""

  def __init__(self, workdir, resumed_step=None):
    """resumed_step: the step a resumed run restarts from; rows written after it by the previous
    process (steps it will run again) are dropped, so every step appears once."""
    self.path = os.path.join(workdir, "metrics.jsonl")
    self.active = distributed.is_primary()
    self.tb = None
    if not self.active:
      return
    if resumed_step is not None and os.path.exists(self.path):
      self._truncate_after(resumed_step)
    try:
      from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
      self.tb = SummaryWriter(os.path.join(workdir, "tb"))
    except ImportError:
      log.warning("tensorboardX is not installed: metrics go to metrics.jsonl only")
      self.tb = None

  def _truncate_after(self, step):
    kept = []
    with open(self.path) as f:
      for line in f:
        try:
          row = json.loads(line)
        except ValueError:
          continue  # a line cut short by a killed process
        if row.get("step", 0) <= step:
          kept.append(json.dumps(row) + "\n")
    write_text(self.path, "".join(kept))

  def write(self, step, split, values):
    if not self.active:
      return
    with open(self.path, "a") as f:
      f.write(json.dumps({"step": step, "split": split, **values}) + "\n")
    if self.tb is not None:
      for k, v in values.items():
        self.tb.add_scalar(f"{split}/{k}", v, step)
      self.tb.flush()
