"""Tables and plots of `attn.training.scoring` rows: every run on every test split, BLEU by
source length (Bahdanau et al. 2015, Fig. 2) and BLEU against training wall time."""

from __future__ import annotations

import os

from attn.common import files
from attn.common.tables import markdown_table

BY_LENGTH_PLOT = "bleu_by_src_words.png"
BY_WALL_PLOT = "bleu_vs_wall.png"


def _label(row) -> str:
  return os.path.basename(os.path.normpath(row["workdir"]))


def _runs(rows) -> list[tuple[str, str]]:
  """(workdir, checkpoint) in first-seen order."""
  return list(dict.fromkeys((r["workdir"], r["checkpoint"]) for r in rows))


def splits_table(rows, metrics=("bleu",)) -> str:
  """One line per (run, checkpoint): its step, training minutes and each of `metrics` on each
  split (blank where a row lacks it)."""
  splits = list(dict.fromkeys(r["split"] for r in rows))
  cell = {(r["workdir"], r["checkpoint"], r["split"]): r for r in rows}
  lines = []
  for wd, ck in _runs(rows):
    first = next(r for r in rows if r["workdir"] == wd and r["checkpoint"] == ck)
    lines.append([_label(first), ck, first["step"], f"{first['wall_s'] / 60:.1f}",
                  *(f"{cell[wd, ck, s][m]:.2f}" if m in cell.get((wd, ck, s), {}) else ""
                    for s in splits for m in metrics)])
  beams = sorted({r["beam_size"] for r in rows})
  return markdown_table(["run", "checkpoint", "step", "training min",
                         *(f"{s} {m} (beam {'/'.join(map(str, beams))})" for s in splits
                           for m in metrics)],
                        lines)


def tuning_table(rows, settings, metrics) -> str:
  """One line per run and decoding setting tried (`settings`: the row fields that vary), with
  `metrics` on the split that chose among them."""
  lines = [[_label(r), r["split"], *(f"{r[n]:g}" for n in settings),
            *(f"{r[m]:.2f}" if m in r else "" for m in metrics)] for r in rows]
  return markdown_table(["run", "split", *settings, *metrics], lines)


def length_table(rows, split: str) -> str:
  """BLEU per source-length bucket (words) of each run's best/ on `split`, with counts."""
  chosen = [r for r in rows if r["split"] == split and r["checkpoint"] == "best"
            and "bleu_by_src_words" in r]
  if not chosen:
    return ""
  buckets = sorted({b for r in chosen for b in r["bleu_by_src_words"]},
                   key=lambda b: int(b.split("-")[0]))
  counts = {b: next(r["bleu_by_src_words"][b]["sentences"] for r in chosen
                    if b in r["bleu_by_src_words"]) for b in buckets}
  lines = [[_label(r), *(f"{r['bleu_by_src_words'][b]['bleu']:.2f}"
                         if b in r["bleu_by_src_words"] else "" for b in buckets)]
           for r in chosen]
  return markdown_table(["run", *(f"{b} words ({counts[b]})" for b in buckets)], lines)


def _line_plot(series, *, xlabel: str, ylabel: str, title: str, path: str) -> None:
  """One line with markers per (label, xs, ys) of `series`, saved as a PNG at `path`."""
  from attn.common.plots import pyplot  # pylint: disable=import-outside-toplevel
  plt = pyplot()
  fig, ax = plt.subplots(figsize=(6, 4))
  for label, xs, ys in series:
    ax.plot(xs, ys, marker="o", label=label)
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  ax.set_title(title)
  ax.legend()
  ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def plot_by_length(rows, split: str, path: str) -> bool:
  """BLEU against source length (bucket midpoints), one line per run's best/; False if none."""
  chosen = [r for r in rows if r["split"] == split and r["checkpoint"] == "best"
            and "bleu_by_src_words" in r]
  if not chosen:
    return False
  series = []
  for r in chosen:
    b = r["bleu_by_src_words"]
    keys = sorted(b, key=lambda k: int(k.split("-")[0]))
    series.append((_label(r), [sum(map(int, k.split("-"))) / 2 for k in keys],
                   [b[k]["bleu"] for k in keys]))
  _line_plot(series, xlabel="source sentence length (words, bucket midpoint)",
             ylabel=f"BLEU (beam {chosen[0]['beam_size']})",
             title=f"BLEU by source length, {split}", path=path)
  return True


def plot_vs_wall(rows, split: str, path: str) -> bool:
  """BLEU against training minutes, one line per run over its kept marks; False if none."""
  marked = [r for r in rows if r["split"] == split and r["checkpoint"].startswith("wall_")
            and "bleu" in r]
  if not marked:
    return False
  series = []
  for wd in dict.fromkeys(r["workdir"] for r in marked):
    mine = sorted((r for r in marked if r["workdir"] == wd), key=lambda r: r["wall_s"])
    series.append((_label(mine[0]), [r["wall_s"] / 60 for r in mine], [r["bleu"] for r in mine]))
  _line_plot(series, xlabel="training wall time (min, evaluations left out)",
             ylabel=f"BLEU (beam {marked[0]['beam_size']})",
             title=f"BLEU against training time, {split}", path=path)
  return True


def write(rows, out: str, metrics=("bleu",), tuning=(), settings=()) -> tuple[str, list[str]]:
  """scores.md (the tables), scores.json (the rows) and the plots in `out`: (the tables' text,
  the plots written). The plots read the first split. tuning: the rows of decoding settings
  tried on a tuning split (scoring.tune_search; also in tuning.json), `settings` the fields
  they vary."""
  os.makedirs(out, exist_ok=True)
  first = rows[0]["split"]
  parts = ["## Every run on every split\n", splits_table(rows, metrics)]
  if tuning:
    parts += [f"\n## Decoding settings tried on {tuning[0]['split']} (best/; the highest "
              f"{metrics[0]} chose each run's)\n", tuning_table(tuning, settings, metrics)]
  lengths = length_table(rows, first)
  if lengths:
    parts += [f"\n## BLEU by source length in words, {first} (sentences per bucket)\n", lengths]
  text = "\n".join(parts) + "\n"
  files.write_text(os.path.join(out, "scores.md"), text)
  files.write_json(os.path.join(out, "scores.json"), rows)
  if tuning:
    files.write_json(os.path.join(out, "tuning.json"), list(tuning))
  plots = [name for name, fn in ((BY_LENGTH_PLOT, plot_by_length), (BY_WALL_PLOT, plot_vs_wall))
           if fn(rows, first, os.path.join(out, name))]
  return text, plots
