"""What every experiment entry point shares: logging set-up and one-line errors for user mistakes.

    if __name__ == "__main__":
      cli.run(main)

A user mistake (`attn.errors.AttnError`: a config value, a data file, a workdir) ends the run
with one `error: ...` line on stderr and exit status 2; any other exception is a bug and keeps
its traceback.
"""

import logging
import sys

from absl import app

from attn.errors import AttnError

USAGE_ERROR = 2


def run(main):
  """`absl.app.run(main)` with the project's conventions (see the module docstring)."""

  def guarded(argv):
    # Library code logs through stdlib loggers (attn.*), which absl's handler prints; orbax logs
    # through absl's own logger at INFO on every save, so that one is kept to warnings.
    logging.getLogger("absl").setLevel(logging.WARNING)
    try:
      return main(argv)
    except AttnError as e:
      print(f"error: {e}", file=sys.stderr)
      sys.exit(USAGE_ERROR)

  app.run(guarded)
