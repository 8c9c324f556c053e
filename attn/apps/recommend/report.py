"""The recommendation runs side by side: one table (HR@10, NDCG@10, attention on the planted
trigger, parameters, wall time) and one figure with two panels, by history length: the final
position's attention on the planted trigger (models with attention), and HR@10 of every model.
Reads each run's results.json (attn.apps.recommend.evaluation)."""

from __future__ import annotations

import os

from attn.common import files
from attn.common.tables import format_cell, markdown_table
from attn.errors import ConfigError, DataError
from attn.common.plots import pyplot


def load(workdirs) -> list[tuple[str, dict]]:
  """(model name, results) of each finished run; DataError naming a run without results.json."""
  if not workdirs:
    raise ConfigError("--workdirs: give at least one finished recommend run")
  rows = []
  for wd in workdirs:
    res = files.read_json(os.path.join(wd, "results.json"))
    if not isinstance(res, dict) or "hr10_by_length" not in res:
      raise DataError(f"{wd}: no results.json of a recommend run (train it first: python -m "
                      f"experiments.recommend --workdir={wd})")
    rows.append((res.get("model", os.path.basename(os.path.normpath(wd))), res))
  return rows


def results_table(rows) -> str:
  """A markdown table of (name, results) pairs: HR@10, NDCG@10, parameters, wall time."""
  cols = ("hr10", "ndcg10", "attention_on_gold", "params", "wall_s")
  return markdown_table(["model", *cols], [[name] + [format_cell(r.get(c, "")) for c in cols]
                                           for name, r in rows])


def figure(rows, path: str) -> None:
  """Saves the two-panel figure (see the module docstring) as a PNG at `path`."""
  plt = pyplot()
  fig, (ax_att, ax_hr) = plt.subplots(1, 2, figsize=(10, 3.8))
  for name, res in rows:
    labels = list(res["hr10_by_length"])
    x = range(len(labels))
    ax_hr.plot(x, [res["hr10_by_length"][k] for k in labels], marker="o", label=name)
    ax_hr.set_xticks(x, labels)
    layers = res.get("attention_on_gold_by_layer_and_length") or (
        [res["attention_on_gold_by_length"]] if "attention_on_gold_by_length" in res else [])
    for l, att in enumerate(layers):
      ax_att.plot(x, [att[k] for k in labels], marker="os^v"[l % 4],
                  label=f"{name}, layer {l + 1} of {len(layers)}")
      ax_att.set_xticks(x, labels)
  if rows:
    ax_hr.axhline(rows[0][1]["random_hr10"], color="grey", ls=":", label="random")
    # What a weight spread evenly over the history would put on the trigger: 1 / length.
    labels = list(rows[0][1]["hr10_by_length"])
    mids = [sum(int(v) for v in label.split("-")) / 2 for label in labels]
    ax_att.plot(range(len(labels)), [1 / m for m in mids], color="grey", ls=":",
                label="uniform over the history")
  ax_att.set(title="final position's weight on the planted trigger", xlabel="history length",
             ylabel="attention (mean over heads and users)", ylim=(0, 1))
  ax_hr.set(title="HR@10 of the held-out item", xlabel="history length", ylabel="HR@10",
            ylim=(0, 1.02))
  for ax in (ax_att, ax_hr):
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
  fig.tight_layout()
  with files.atomic_path(path, suffix=".png") as tmp:
    fig.savefig(tmp, dpi=110)
  plt.close(fig)
