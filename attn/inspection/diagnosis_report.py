"""What a diagnosis leaves behind: diagnose.json, a short text summary and the plots.

    diag = diagnosis.diagnose(run)
    diagnosis_report.write(diag, run.workdir)    # diagnose.json and PLOTS (+ HEADS_PLOT)
    print(diagnosis_report.format_table(diag.report))
"""

from __future__ import annotations

import math
import os

import numpy as np

from attn.common import files
from attn.common.tables import markdown_table

PLOTS = ("diagnose_entropy.png", "diagnose_tau.png", "diagnose_counterfactual.png")
HEADS_PLOT = "diagnose_heads.png"  # multi-head models only
REPORT_FILE = "diagnose.json"


def plots_of(report) -> tuple[str, ...]:
  """The plot files `write` makes for `report`."""
  return PLOTS + ((HEADS_PLOT,) if report.get("heads") else ())


def format_table(report) -> str:
  """A short plain-text summary of a diagnose report."""
  m = report["model"]
  lines = [f"{m['decoder']}/{m['score']}/{m['normalizer']} on {report['split']}: "
           f"{report['n_examples']} examples, {report['n_steps']} output steps, "
           f"greedy exact match {report['greedy_exact_match']:.3f}",
           f"entropy (nats): mean {report['entropy']['mean']:.3f}, median "
           f"{report['entropy']['median']:.3f} (uniform would be "
           f"{report['entropy']['uniform_mean']:.3f})"]
  al = report.get("alignment")
  if al:
    shifted = ", ".join(f"{k} {v['attention_on_gold']:.3f}" for k, v in al["shifted"].items())
    lines.append(f"alignment (teacher-forced on the reference): AER {al['aer']:.3f}, "
                 f"attention on gold {al['attention_on_gold']:.3f}; on gold shifted by one: "
                 + shifted)
  for key, title in (("attribution", "gradient x input"),
                     ("integrated_gradients", "integrated gradients")):
    sec = report.get(key)
    if sec and "mean" in sec["kendall_tau"]:
      kt = sec["kendall_tau"]
      lines.append(f"Kendall tau(attention, |{title}|): mean {kt['mean']:.3f}, median "
                   f"{kt['median']:.3f} over {kt['n_steps']} steps"
                   + (f", top-1 agreement {sec['top1_agreement']:.3f}"
                      if "top1_agreement" in sec else ""))
  if report.get("heads"):
    lines += ["", *_heads_lines(report["heads"])]
  lines += ["", markdown_table(
      ["intervention", "mean TV", "median TV", "mean JS (nats)", "argmax flips"],
      [[name, f"{r['tv_mean']:.3f}", f"{r['tv_median']:.3f}", f"{r['js_mean']:.4g}",
        f"{r['flip_rate']:.3f}"] for name, r in report["counterfactual"].items()])]
  return "\n".join(lines)


def _heads_lines(heads) -> list[str]:
  """Per layer: each head's mean entropy (and attention on gold, also one target position back),
  the layer average's AER; then each intervention in one layer alone."""
  lines = ["per layer and head (greedy output: mean entropy in nats"
           + ("; teacher-forced on the reference: attention on gold, and on gold one target "
              "position back" if heads["alignment"] else "") + "):"]
  for l in range(heads["layers"]):
    cells = []
    for k in range(heads["heads"]):
      cell = f"h{k + 1} {heads['entropy_mean'][l][k]:.2f}"
      if heads["alignment"]:
        a = heads["alignment"][l][k]
        back = a["shifted"].get("target-1")
        cell += f" / {a['attention_on_gold']:.2f}" + (
            f" / {back['attention_on_gold']:.2f}" if back else "")
      cells.append(cell)
    if heads["layer_average_alignment"]:
      avg = heads["layer_average_alignment"][l]
      cells.append(f"average: AER {avg['aer']:.3f}, on gold {avg['attention_on_gold']:.3f}")
    lines.append(f"  layer {l + 1}: " + "; ".join(cells))
  for name, rows in (heads["counterfactual_by_layer"] or {}).items():
    lines.append(f"  {name} in one layer alone, mean TV (flips): " + ", ".join(
        f"layer {l + 1} {r['tv_mean']:.3f} ({r['flip_rate']:.3f})" for l, r in enumerate(rows)))
  return lines


def plot(diag, directory) -> list[str]:
  """Writes the three PLOTS of a `diagnosis.Diagnosis` (and HEADS_PLOT for a multi-head model)
  into `directory`; returns their paths."""
  from attn.common import plots as viz  # pylint: disable=import-outside-toplevel
  plt = viz.pyplot()
  s, r = diag.steps, diag.report
  title = f"{r['model']['decoder']}/{r['model']['score']}"
  paths = [os.path.join(directory, p) for p in PLOTS]

  fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
  hi = float(np.log(max(int(s["n_src"].max()), 2)))
  axes[0].hist(s["entropy"], bins=30, range=(0, hi), color="0.3")
  axes[0].axvline(r["entropy"]["uniform_mean"], color="C3", ls="--", label="uniform (mean log n)")
  axes[0].set(xlabel="attention entropy (nats)", ylabel="output steps", title=title)
  axes[0].legend(fontsize=7)
  hn = s["normalized_entropy"]
  axes[1].hist(hn[np.isfinite(hn)], bins=30, range=(0, 1), color="0.3")
  axes[1].set(xlabel="entropy / log(n valid)", title="normalized (0 = one-hot, 1 = uniform)")
  fig.tight_layout()
  fig.savefig(paths[0], dpi=110)
  plt.close(fig)

  fig, ax = plt.subplots(figsize=(5, 3.2))
  ok = (s["n_src"] >= 3) & np.isfinite(s["tau"])
  ax.hist(s["tau"][ok], bins=40, range=(-1, 1), color="0.3", label="gradient x input")
  if "tau_ig" in s:
    ok_ig = (s["n_src"] >= 3) & np.isfinite(s["tau_ig"])
    ax.hist(s["tau_ig"][ok_ig], bins=40, range=(-1, 1), histtype="step", color="C0",
            label="integrated gradients")
    ax.legend(fontsize=7)
  ax.axvline(0, color="C3", lw=0.8)
  ax.set(xlabel="Kendall tau (attention vs |attribution|), per step", ylabel="output steps",
         title=title)
  fig.tight_layout()
  fig.savefig(paths[1], dpi=110)
  plt.close(fig)

  names = list(r["counterfactual"])
  fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
  axes[0].boxplot([s[f"{n}/tv"] for n in names], showfliers=False)
  axes[0].set_xticks(range(1, len(names) + 1), names)
  axes[0].set(ylabel="TV distance to the real output", ylim=(0, 1), title=title)
  x = np.arange(len(names))
  axes[1].bar(x - 0.2, [r["counterfactual"][n]["flip_rate"] for n in names], 0.4,
              label="argmax flips", color="0.3")
  axes[1].bar(x + 0.2, [r["counterfactual"][n]["js_mean"] / math.log(2) for n in names], 0.4,
              label="mean JS / log 2", color="C0")
  axes[1].set_xticks(x, names)
  axes[1].set(ylim=(0, 1), ylabel="share / normalized divergence")
  axes[1].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(paths[2], dpi=110)
  plt.close(fig)
  if r.get("heads"):
    paths.append(_plot_heads(plt, r["heads"], title, os.path.join(directory, HEADS_PLOT)))
  return paths


def _plot_heads(plt, heads, title, path) -> str:
  """Layer x head maps (normalized entropy; attention on gold where gold links exist) and a
  layer x intervention map of argmax flips with the intervention in that layer alone."""
  L, H = heads["layers"], heads["heads"]
  head_names = [f"h{k + 1}" for k in range(H)]
  panels = [("entropy / log(n valid)", heads["normalized_entropy_mean"] or heads["entropy_mean"],
             head_names)]
  if heads["alignment"]:
    panels.append(("attention on gold", [[a["attention_on_gold"] for a in row]
                                          for row in heads["alignment"]], head_names))
  by_layer = heads["counterfactual_by_layer"]
  if by_layer:
    panels.append(("flips, this layer alone", [[by_layer[n][l]["flip_rate"] for n in by_layer]
                                               for l in range(L)], list(by_layer)))
  widths = [len(p[2]) for p in panels]
  fig, axes = plt.subplots(1, len(panels), figsize=(1.5 + 1.1 * sum(widths) + 0.8 * len(panels),
                                                    1.2 + 0.7 * L),
                           squeeze=False, gridspec_kw={"width_ratios": widths})
  for ax, (name, grid, xlabels) in zip(axes[0], panels):
    grid = np.asarray(grid, np.float64)
    im = ax.imshow(grid, cmap="viridis", vmin=0, vmax=1, aspect="auto")
    for (l, k), v in np.ndenumerate(grid):
      ax.text(k, l, f"{v:.2f}", ha="center", va="center", fontsize=7,
              color="white" if v < 0.6 else "black")
    ax.set_xticks(range(len(xlabels)), xlabels, fontsize=7)
    ax.set_yticks(range(L), [f"layer {l + 1}" for l in range(L)])
    ax.set_title(name, fontsize=8)
  fig.colorbar(im, ax=axes[0].tolist(), fraction=0.03)
  fig.suptitle(title, fontsize=9, y=1.04)
  fig.savefig(path, dpi=110, bbox_inches="tight")
  plt.close(fig)
  return path


def write(diag, directory) -> str:
  """diagnose.json (atomic) and the plots (`plots_of`) into `directory`; returns the JSON's path."""
  plot(diag, directory)
  path = os.path.join(directory, REPORT_FILE)
  files.write_json(path, diag.report)
  return path
