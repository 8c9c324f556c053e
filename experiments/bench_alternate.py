r"""Commands timed in alternation across checkouts: how a regression between two commits is
measured on a host whose run-to-run noise is larger than the regression.

    git worktree add /tmp/old 7b2bdee^
    python -m experiments.bench_alternate --rounds=5 \
        --checkouts='{"before the one loop": "/tmp/old", "now": "."}' \
        --commands='{"focus": "python -m experiments.focus --workdir={workdir}",
                     "retrieve": "python -m experiments.retrieve --workdir={workdir}"}'

Each round runs every command once in every checkout, in the given orders (`{workdir}`: a fresh
temporary directory each time; the working directory is the checkout's, so `python -m` imports
its `attn`). --env is added to every command's environment; its default turns the compilation
cache off, so every run compiles as a first run does. Prints one line a run and a table (mean,
median and range of wall seconds, mean CPU seconds, the mean against the first checkout's), and
writes <out>/timings.jsonl (each run as it ends) and <out>/summary.md. Run it with the machine
otherwise idle. (attn.benchmarks.alternation holds the logic.)
"""

import dataclasses
import os

from absl import flags

from attn.benchmarks import alternation, harness
from attn.config.configurable import option
from attn.launching import cli

FLAGS = flags.FLAGS


@dataclasses.dataclass(frozen=True)
class Settings:
  """The alternation's settings."""
  commands: str = option("", "JSON object: name -> shell command ({workdir}: a fresh temporary "
                         "directory).")
  checkouts: str = option('{"now": "."}', "JSON object: name -> a checkout's directory (git "
                          "worktree add), the first being the baseline of the last column.")
  rounds: int = option(3, "Rounds; each runs every command in every checkout once.")
  env: str = option('{"ATTN_COMPILE_CACHE": "off"}', "JSON object: environment variables added "
                    "to every command's.")
  out: str = option("workdirs/bench_alternate", "Where timings.jsonl and summary.md are written.")


def main(argv):
  del argv
  s = cli.settings_from_flags(Settings)
  commands = alternation.named_strings(s.commands, "commands")
  checkouts = {k: os.path.abspath(v)
               for k, v in alternation.named_strings(s.checkouts, "checkouts").items()}
  env = alternation.named_strings(s.env, "env") if s.env not in ("", "{}") else {}
  alternation.check_checkouts(checkouts)
  os.makedirs(s.out, exist_ok=True)
  print(f"load average at start: {harness.loadavg()} ({os.cpu_count()} CPUs); "
        f"{harness.cpu_line()}", flush=True)
  timings = alternation.alternate(commands, checkouts, s.rounds, env=env,
                                  record_path=os.path.join(s.out, "timings.jsonl"))
  table = alternation.summary(timings)
  with open(os.path.join(s.out, "summary.md"), "w", encoding="utf-8") as f:
    f.write(table + "\n")
  print(table)
  print(f"load average at end: {harness.loadavg()}")


if __name__ == "__main__":
  cli.define_settings_flags(Settings)
  cli.run(main)
