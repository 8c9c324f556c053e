r"""The recommendation runs side by side: a markdown table and a figure by history length.

    python -m experiments.recommend_report --out=docs/img/recommend.png \
        --workdirs=workdirs/recommend/kind=sasrec,workdirs/recommend/kind=meanpool,workdirs/recommend/kind=gru

Prints the table (HR@10, NDCG@10, attention on the planted trigger, parameters, wall time) and
writes the figure (attention on the planted trigger, and HR@10 of each model, by history
length) to --out. A run without results.json is refused in one `error:` line.
"""

import dataclasses

from attn.config.configurable import option
from attn.launching import cli


@dataclasses.dataclass(frozen=True)
class ReportSettings:
  """What experiments.recommend_report reads and writes."""
  workdirs: tuple[str, ...] = option((), "Finished recommend runs, one per model.")
  out: str = option("recommend.png", "Where the figure goes (PNG).")


def main(argv):
  del argv
  settings = cli.settings_from_flags(ReportSettings)
  # pylint: disable-next=import-outside-toplevel  (after flag parsing)
  from attn.apps.recommend import report
  rows = report.load(settings.workdirs)
  print(report.results_table(rows))
  report.figure(rows, settings.out)
  print(f"wrote {settings.out}")


if __name__ == "__main__":
  cli.define_settings_flags(ReportSettings)
  cli.run(main)
