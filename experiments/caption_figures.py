r"""The captioning figures of docs/results.md, from two finished runs of experiments.caption.

    python -m experiments.caption_figures --attention=workdirs/caption/bahdanau \
        --baseline=workdirs/caption/none --out=docs/img

Writes OUT/caption_by_digits.png (exact match and digit accuracy by number of digits in the
image, attention vs no attention, from each run's results.json) and OUT/caption_alignment.png
(one test image of the attention run with each output step's attention over its cells, the gold
cell of each digit boxed, from attention.npz: the first sampled example with the most digits).
"""

import json
import os

from absl import app, flags

from attn.launching import cli

flags.DEFINE_string("attention", None, "A finished caption run with attention.")
flags.DEFINE_string("baseline", None, "A finished caption run without attention (decoder=none).")
flags.DEFINE_string("out", "docs/img", "Directory the two PNGs go to.")
flags.mark_flags_as_required(["attention", "baseline"])
FLAGS = flags.FLAGS


def _results(workdir):
  path = os.path.join(workdir, "results.json")
  if not os.path.exists(path):
    cli.fail(f"{workdir}: no results.json (not a finished caption run)")
  with open(path) as f:
    res = json.load(f)
  if "exact_match_by_digits" not in res:
    cli.fail(f"{workdir}: results.json has no exact_match_by_digits (not a caption run)")
  return res


def by_digits(runs, path):
  """runs: [(label, results)]: two panels, exact match and digit accuracy by digit count."""
  from attn.common.plots import pyplot  # pylint: disable=import-outside-toplevel
  plt = pyplot()
  fig, axes = plt.subplots(1, 2, figsize=(8, 3.2))
  for ax, key, name in zip(axes, ("exact_match_by_digits", "digit_accuracy_by_digits"),
                           ("exact match", "digit accuracy")):
    for label, res in runs:
      ks = sorted(res[key], key=int)
      ax.plot([int(k) for k in ks], [res[key][k] for k in ks], "o-", label=label)
    ax.set_xlabel("digits in the image")
    ax.set_ylabel(name)
    ax.set_ylim(0, 1.03)
    ax.set_xticks([int(k) for k in ks])
    ax.grid(alpha=0.3)
  axes[0].legend(loc="lower left", fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def alignment(workdir, path):
  """The image above its [Tt, R] attention, columns under their cells, gold cells boxed."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  from attn.common.plots import pyplot  # pylint: disable=import-outside-toplevel
  with np.load(os.path.join(workdir, "attention.npz")) as npz:
    ids = [int(i) for i in npz["example_ids"]]
    if f"image_{ids[0]}" not in npz:
      cli.fail(f"{workdir}: attention.npz stores no images (not a caption run)")
    refs = [str(r) for r in npz["references"]]
    n = max(range(len(ids)), key=lambda k: len(refs[k].split()))
    i = ids[n]
    img, boxes = npz[f"image_{i}"], npz[f"regions_{i}"]
    w, rows = npz[f"weights_{i}"], [str(t) for t in npz[f"tgt_tokens_{i}"]]
    pred = str(npz["predictions"][n])
  plt = pyplot()
  P, W = img.shape
  fig, (top, bottom) = plt.subplots(2, 1, figsize=(6, 1.2 + 0.45 * len(rows)),
                                    gridspec_kw={"height_ratios": [P, P * len(rows) / 1.6]})
  top.imshow(img, cmap="gray", extent=(0, W, P, 0))
  top.set_xticks([])
  top.set_yticks([])
  top.set_title(f"test image {i}: reference \"{refs[n]}\", output \"{pred}\"", fontsize=9)
  left = boxes[:, 1]
  edges = np.r_[left, left[-1] + boxes[-1, 3]]
  bottom.pcolormesh(edges, np.arange(len(rows) + 1), w, cmap="Blues", vmin=0, vmax=1)
  bottom.invert_yaxis()
  bottom.set_yticks(np.arange(len(rows)) + 0.5, rows)
  bottom.set_xticks(left + boxes[:, 3] / 2, [f"#{r + 1}" for r in range(len(left))])
  bottom.set_xlim(0, W)
  gold = _gold_cells(os.path.join(workdir, "attention.npz"), i, len(refs[n].split()))
  for t, r in enumerate(gold):  # the gold cell of digit t (reading order)
    bottom.add_patch(plt.Rectangle((edges[r], t), edges[r + 1] - edges[r], 1, fill=False,
                                   edgecolor="red", linewidth=1.5))
  bottom.set_xlabel("cell (region); red: the cell holding the digit being emitted")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def _gold_cells(npz_path, i, n_digits):
  """The cells of example i's digits in reading order, from its source description."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  from attn.apps.caption import glyphs  # pylint: disable=import-outside-toplevel
  with np.load(npz_path) as npz:
    k = [int(x) for x in npz["example_ids"]].index(i)
    cells = str(npz["sources"][k]).split()
  gold = [r for r, c in enumerate(cells) if c in glyphs.DIGITS]
  assert len(gold) == n_digits
  return gold


def main(argv):
  del argv
  runs = [("attention (bahdanau)", _results(FLAGS.attention)),
          ("no attention (mean of regions)", _results(FLAGS.baseline))]
  os.makedirs(FLAGS.out, exist_ok=True)
  a = os.path.join(FLAGS.out, "caption_by_digits.png")
  b = os.path.join(FLAGS.out, "caption_alignment.png")
  by_digits(runs, a)
  alignment(FLAGS.attention, b)
  print(f"wrote {a} and {b}")


if __name__ == "__main__":
  app.run(main)
