"""Pictures of what attention learned: alignment heatmaps (matplotlib, Agg backend), and the
pyplot every figure of the project is drawn with. Below training, launching, the benchmarks and
the look-inside tools, which all draw with it; it imports nothing of attn but the joiner mark."""

from __future__ import annotations

import numpy as np

from attn.common.joiner import JOINER


def pyplot():
  """matplotlib.pyplot on the non-interactive Agg backend (runs headless; import on demand)."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  return plt


def display_label(token) -> str:
  """A token as the reader sees it in the text: the word tokenizer's joiner mark (attn.common.
  joiner.JOINER: "no space on this side", a glyph plot fonts lack) removed."""
  text = str(token)
  return text.replace(JOINER, "")


def heatmap(weights, src_labels, tgt_labels, path, *, title="", gold=None):
  """Saves a [Tt, Ts] attention matrix as a PNG with token labels (`display_label`).

  weights: [Tt, Ts]; src_labels / tgt_labels: at least Ts / Tt strings (extra are cut);
  gold: optional [Tt, Ts] gold alignment, drawn as red boxes.
  """
  plt = pyplot()
  w = np.asarray(weights, np.float32)
  Tt, Ts = w.shape
  fig, ax = plt.subplots(figsize=(max(3.0, 0.32 * Ts + 1.5), max(2.5, 0.32 * Tt + 1.2)))
  im = ax.imshow(w, cmap="Greys", vmin=0.0, vmax=max(float(w.max()), 1e-6), aspect="auto")
  ax.set_xticks(range(Ts), [display_label(t) for t in list(src_labels)[:Ts]], rotation=90,
                fontsize=7)
  ax.set_yticks(range(Tt), [display_label(t) for t in list(tgt_labels)[:Tt]], fontsize=7)
  if gold is not None:
    for i, j in zip(*np.nonzero(np.asarray(gold)[:Tt, :Ts])):
      ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", lw=0.8))
  ax.set_xlabel("source")
  ax.set_ylabel("output")
  if title:
    ax.set_title(title, fontsize=8)
  fig.colorbar(im, ax=ax, fraction=0.04)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
