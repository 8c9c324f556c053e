"""The sitting's table (attn.benchmarks.peer_sitting): each figure for JoeyNMT before ours, ours,
JoeyNMT after, and ours against the mean of the two peer brackets, with the load averages at the
start of the three stages it comes from; and for each of our bench_train rows, its matmul rate's
share of the machine's ceiling at the dtype it ran: the better of XLA's (bench_train's own) and
torch's (the peer_ceiling stage), naming which. XLA's alone says what our code reaches of what
XLA reaches; the better of the two says what it reaches of what this machine reaches."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable

from attn.common.tables import markdown_table


@dataclasses.dataclass(frozen=True)
class Measure:
  """How a kind of figure is written, and ours against the peers' mean (mean, ours) -> text."""
  fmt: Callable[[float], str]
  versus: Callable[[float, float], str]


MEASURES = {
    # higher is better: ours' rate over the peer's
    "rate": Measure(lambda v: f"{v:,.0f}", lambda mean, ours: f"{ours / mean:.2f}x"),
    # lower is better: the peer's time over ours, so that this too reads "x as fast"
    "seconds": Measure(lambda v: f"{v:.1f}", lambda mean, ours: f"{mean / ours:.2f}x"),
    # a score: the difference
    "score": Measure(lambda v: f"{v:.2f}",
                     lambda mean, ours: f"{round(ours - mean, 2) + 0.0:+.2f}"),  # no "-0.00"
}


@dataclasses.dataclass(frozen=True)
class Row:
  """One figure: the stages it is read from (peer before, ours, peer after) and the key path of
  the figure in the peer's and in our stage's figures."""
  label: str
  stages: tuple[str, str, str]
  peer: tuple[str, ...]
  ours: tuple[str, ...]
  measure: str = "rate"
  # Whether `ours` is a bench_train row (its parent holds gflops, xla_ceiling and dtype), whose
  # share of the better ceiling the table gives.
  share: bool = False


def rows_for(compute_dtypes, beam_sizes, steps: int, transformer: bool) -> list[Row]:
  """The table's rows, in order."""
  rnn = ("peer_rnn", "ours_rnn_bench", "peer_rnn_again")
  dec = ("peer_rnn_decode", "ours_rnn_decode", "peer_rnn_decode_again")
  rows = [Row(f"RNN training, target tokens/s (ours: bench_train, {d})", rnn,
              ("tokens_per_s",), (d, "tokens_per_s"), share=True) for d in compute_dtypes]
  rows.append(Row("RNN training, target tokens/s, training loops with data loading (ours: "
                  "experiments.translate, steady)", ("peer_rnn", "ours_rnn_train",
                                                     "peer_rnn_again"),
                  ("tokens_per_s",), ("tokens_per_s_steady",)))
  rows += [Row(f"RNN decoding the test split, {'greedy' if k == 1 else f'beam {k}'}: seconds",
               dec, (f"beam{k}", "decode_s"), (f"beam{k}", "decode_s"), "seconds")
           for k in beam_sizes]
  rows += [Row(f"RNN test BLEU after {steps:,} steps, {'greedy' if k == 1 else f'beam {k}'}",
               dec, (f"beam{k}", "bleu"), (f"beam{k}", "bleu"), "score") for k in beam_sizes]
  if transformer:
    tfm = ("peer_tfm", "ours_tfm_bench", "peer_tfm_again")
    rows += [Row(f"Transformer training, target tokens/s (ours: bench_train, {d})", tfm,
                 ("tokens_per_s",), (d, "tokens_per_s"), share=True) for d in compute_dtypes]
    packed = ("peer_tfm", "ours_tfm_packed_bench", "peer_tfm_again")
    rows += [Row(f"Transformer training on packed rows, target tokens/s (ours: bench_train, "
                 f"data.pack, {d})", packed, ("tokens_per_s",), (d, "tokens_per_s"), share=True)
             for d in compute_dtypes]
  return rows


def _get(figures: dict, path: tuple[str, ...]):
  for key in path:
    if not isinstance(figures, dict) or key not in figures:
      return None
    figures = figures[key]
  return figures


def _load1(record: dict) -> str:
  return record["load_before"].split()[0]


CEILING_STAGE = "peer_ceiling"  # torch's matmul ceiling (peers/torch_ceiling.py)


def ceiling_share(ours: dict, torch: dict | None) -> dict | None:
  """Our bench_train row `ours` ({gflops, xla_ceiling, dtype}) against the better of XLA's
  ceiling and torch's (`torch`: {dtype: GFLOP/s}, the peer_ceiling stage's figures; None: not
  measured) at the dtype the row ran: {dtype, gflops, ceiling, of: "XLA" | "torch", share};
  None where the row has no matmul rate or neither ceiling was measured."""
  if not isinstance(ours, dict) or ours.get("gflops") is None:
    return None
  dtype = ours.get("dtype")
  found = {"XLA": ours.get("xla_ceiling"), "torch": (torch or {}).get(dtype)}
  found = {k: v for k, v in found.items() if isinstance(v, (int, float)) and v > 0}
  if not found:
    return None
  of = max(found, key=found.get)  # XLA first where they tie
  return {"dtype": dtype, "gflops": ours["gflops"], "ceiling": found[of], "of": of,
          "share": ours["gflops"] / found[of]}


def evaluate(rows: list[Row], records: dict) -> list[dict]:
  """Each row whose three stages have its figure: the values, the peers' mean, ours against it
  and the 1-minute load averages at the start of the three stages; for a bench_train row, its
  share of the better ceiling (`ceiling_share`; the dtype an auto row ran joins its label)."""
  out = []
  for row in rows:
    if not all(name in records for name in row.stages):
      continue
    before, ours, after = (_get(records[name]["figures"], path) for name, path in
                           zip(row.stages, (row.peer, row.ours, row.peer)))
    if None in (before, ours, after):
      continue
    mean = statistics.mean([before, after])
    label, ceiling = row.label, None
    if row.share:
      entry = _get(records[row.stages[1]]["figures"], row.ours[:-1])
      torch = records[CEILING_STAGE]["figures"] if CEILING_STAGE in records else None
      ceiling = ceiling_share(entry, torch)
      ran = entry.get("dtype") if isinstance(entry, dict) else None
      if ran and ran != row.ours[0]:
        label += f", ran {ran}"
    out.append({"figure": label, "measure": row.measure, "peer_before": before,
                "ours": ours, "peer_after": after, "peer_mean": mean,
                "versus": MEASURES[row.measure].versus(mean, ours),
                "load": [_load1(records[name]) for name in row.stages], "ceiling": ceiling})
  return out


def share_text(ceiling: dict | None) -> str:
  """e.g. `249 GFLOP/s: 74% of torch's 336 (float32)`; '' for no share."""
  if not ceiling:
    return ""
  return (f"{ceiling['gflops']:.0f} GFLOP/s: {ceiling['share']:.0%} of {ceiling['of']}'s "
          f"{ceiling['ceiling']:.0f} ({ceiling['dtype']})")


def markdown(evaluated: list[dict]) -> str:
  header = ["figure", "JoeyNMT before", "ours", "JoeyNMT after", "ours vs mean(JoeyNMT)",
            "load (1 min) before / ours / after",
            "ours' matmuls: share of the better ceiling (XLA's, torch's)"]
  cells = []
  for r in evaluated:
    fmt = MEASURES[r["measure"]].fmt
    cells.append([r["figure"], fmt(r["peer_before"]), fmt(r["ours"]), fmt(r["peer_after"]),
                  r["versus"], " / ".join(r["load"]), share_text(r.get("ceiling"))])
  return markdown_table(header, cells)
