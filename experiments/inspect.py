r"""The run viewer: one self-contained HTML page of a finished run's outputs and attention.

    python -m experiments.inspect --workdir=workdirs/demo/decoder=bahdanau \
        --compare=workdirs/demo/decoder=none --port=8000

Writes WORKDIR/inspect.html (or --out: a file, or a directory for inspect.html): opened from disk
it needs no network (scripts, style and data are inlined). A run directory that cannot be written
to (an archived run, a colleague's) is refused before anything is read, in one line saying to
pass --out. With --port, also serves the page's directory on http://127.0.0.1:PORT/ until
Ctrl-C. --compare puts another run on the same data (e.g. the no-attention baseline) side by side.
A missing or mismatched file exits with status 2 and one `error:` line.
"""

import os

from absl import flags

import attn.apps  # noqa: F401  (registers the built-in applications)
from attn.config import configurable
from attn.inspection.viewer import ViewerSettings
from attn.launching import cli

FLAGS = flags.FLAGS
WEB_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "web")  # template, JS, CSS


def define_flags():
  """One flag per field of ViewerSettings; --port by hand (an integer flag whose default, None,
  means: do not serve). Defined on demand, so tests can import this module next to other
  flag-defining ones."""
  cli.define_settings_flags(ViewerSettings, skip=("port",))
  flags.DEFINE_integer("port", ViewerSettings.port, configurable.help_of(ViewerSettings)["port"])
  flags.mark_flags_as_required(["workdir"])


def main(argv):
  del argv
  settings = cli.settings_from_flags(ViewerSettings, port=FLAGS.port)
  # pylint: disable-next=import-outside-toplevel  (after flag parsing)
  from attn.inspection import viewer
  path = viewer.write_page(settings.workdir, WEB_DIR, compare=settings.compare, out=settings.out)
  print(f"wrote {path}")
  if settings.port is None:
    return
  cli.serve(lambda: viewer.make_server(os.path.dirname(os.path.abspath(path)), settings.port),
            settings.port, os.path.basename(path))


if __name__ == "__main__":
  define_flags()
  cli.run(main)
