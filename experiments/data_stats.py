r"""Data statistics: examples, lengths, buckets, padding fraction and pipeline throughput.

    python -m experiments.data_stats --data_dir=../shared/data/multi30k
    python -m experiments.data_stats --config=experiments/configs/data.py:dates --config.train_size=20000
    python -m experiments.data_stats --config=experiments/configs/data.py:aeslc --data_dir=../shared/data/aeslc

Prints one table; the figures in docs/data.md come from the first command.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
import time

import numpy as np
from ml_collections import config_flags

from attn.config.configurable import option
from attn.data import pipeline
from attn.launching import cli

_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs", "data.py"),
    "data config file[:preset]", lock_config=True)


@dataclasses.dataclass(frozen=True)
class Settings:
  """The flags besides --config."""
  data_dir: str | None = option(None, "overrides data.dir")
  workdir: str | None = option(None, "vocabularies and caches (default: a temp dir)")
  batches: int = option(300, "training batches timed for the throughput")


def lengths_table(bundle: pipeline.DataBundle) -> list[str]:
  lines = ["split  examples  src p50/p90/p99/max  tgt p50/p90/p99/max  padding"]
  for role, sp in bundle.splits.items():
    ps = np.percentile(sp.src_len, [50, 90, 99, 100]).astype(int).tolist()
    pt = np.percentile(sp.tgt_len, [50, 90, 99, 100]).astype(int).tolist()
    lines.append(f"{role:5s}  {len(sp):8d}  {'/'.join(map(str, ps)):>19s}  "
                 f"{'/'.join(map(str, pt)):>19s}  {bundle.padding_fraction(role):7.1%}")
  lines.append("widths include EOS; padding = PAD share of src+tgt slots over one epoch / one pass")
  return lines


def bucket_table(bundle: pipeline.DataBundle) -> list[str]:
  train = bundle.splits["train"]
  if bundle.pack_widths:  # the buckets batch evaluation only; training batches are packed rows
    ts, tt = bundle.pack_widths
    examples = np.mean([np.count_nonzero(rows >= 0) for _, _, rows in
                        bundle.train_epoch_batches(0)])
    return [f"training: packed rows of ({ts}, {tt}), {bundle.train_batch_sizes[0]} a batch, "
            f"{examples:.1f} examples a batch on average",
            "bucket  (Ts, Tt)  eval/test"] + [f"{k:6d}  ({s:3d},{t:3d})"
                                             for k, (s, t) in enumerate(bundle.shapes)]
  lines = ["bucket  (Ts, Tt)   B  train examples"]
  for k, (ts, tt) in enumerate(bundle.shapes):
    lines.append(f"{k:6d}  ({ts:3d},{tt:3d})  {bundle.train_batch_sizes[k]:3d}  "
                 f"{int((train.bucket == k).sum()):14d}")
  return lines


def throughput(bundle: pipeline.DataBundle, n: int) -> tuple[float, float]:
  """(batches/s, target tokens/s) of the training iterator over n batches after 20 warm-up."""
  it = bundle.train_iter()
  for _ in range(20):
    next(it)
  tokens = 0
  t0 = time.perf_counter()
  for _ in range(n):
    tokens += int(next(it)["tgt_lengths"].sum())
  dt = time.perf_counter() - t0
  return n / dt, tokens / dt


def main(argv):
  del argv
  s = cli.settings_from_flags(Settings)
  cfg = _CONFIG.value
  if s.data_dir:
    cfg.dir = s.data_dir
  if s.workdir:
    report(cfg, s.workdir, s.batches)
  else:
    with tempfile.TemporaryDirectory(prefix="attn_data_stats_") as workdir:
      report(cfg, workdir, s.batches)


def report(cfg, workdir: str, batches: int) -> None:
  """Loads the data twice (cold, then reusing `workdir`) and prints the tables and throughput;
  a DataError (an AttnError) ends the run as one line."""
  t0 = time.perf_counter()
  bundle = pipeline.load(cfg, workdir)
  cold = time.perf_counter() - t0
  t0 = time.perf_counter()
  bundle = pipeline.load(cfg, workdir)
  warm = time.perf_counter() - t0
  print(bundle.summary())
  print("\n".join(lengths_table(bundle)))
  print("\n".join(bucket_table(bundle)))
  bps, tps = throughput(bundle, batches)
  print(f"load: {cold:.1f} s first, {warm:.2f} s again (reusing workdir); "
        f"train iterator: {bps:.0f} batches/s, {tps:,.0f} target tokens/s "
        f"({bundle.config.num_threads} grain threads, {os.cpu_count()} CPUs)")


if __name__ == "__main__":
  # The pipeline's INFO lines would repeat the summary printed here.
  logging.getLogger("attn.data").setLevel(logging.WARNING)
  cli.define_settings_flags(Settings)
  cli.run(main)
