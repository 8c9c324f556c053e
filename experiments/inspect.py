r"""The run viewer: one self-contained HTML page of a finished run's outputs and attention.

    python -m experiments.inspect --workdir=workdirs/demo/decoder=bahdanau \
        --compare=workdirs/demo/decoder=none --port=8000

Writes WORKDIR/inspect.html (or --out): opened from disk it needs no network (scripts, style and
data are inlined). With --port, also serves the page's directory on http://127.0.0.1:PORT/ until
Ctrl-C. --compare puts another run on the same data (e.g. the no-attention baseline) side by side.
A missing or mismatched file exits with status 2 and one `error:` line.
"""

import os

from absl import flags

from attn.launching import cli

FLAGS = flags.FLAGS
WEB_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "web")  # template, JS, CSS


def define_flags():
  """Defined on demand, so tests can import this module next to other flag-defining ones."""
  flags.DEFINE_string("workdir", None, "A finished run's directory (results.json, attention.npz).")
  flags.DEFINE_string("compare", None, "Another run on the same data, shown side by side.")
  flags.DEFINE_string("out", None, "Where the page goes (default WORKDIR/inspect.html).")
  flags.DEFINE_integer("port", None, "Serve the page's directory on 127.0.0.1:PORT until Ctrl-C.")
  flags.mark_flags_as_required(["workdir"])


def main(argv):
  del argv
  from attn.inspection import viewer as inspect_page  # pylint: disable=import-outside-toplevel  (after flag parsing)
  path = inspect_page.write_page(FLAGS.workdir, WEB_DIR, compare=FLAGS.compare, out=FLAGS.out)
  print(f"wrote {path}")
  if FLAGS.port is None:
    return
  cli.serve(lambda: inspect_page.make_server(os.path.dirname(os.path.abspath(path)), FLAGS.port),
            FLAGS.port, os.path.basename(path))


if __name__ == "__main__":
  define_flags()
  cli.run(main)
