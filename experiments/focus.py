r"""The reading-focus demo: a one-hop attention reader answers "Where is Mary?" about a short
bAbI-style story; a page highlights the sentences by attention weight, with a focus-strength
(temperature) slider and a choice of normalizer.

    python -m experiments.focus --workdir=workdirs/focus --port=8000     # train (~10 s), serve
    python -m experiments.focus --workdir=workdirs/focus --serve_only --port=8000
    python -m experiments.focus --normalizers=softmax,sparsemax --score=general --port=0

Writes focus.json, focus.md (evidence hit rate and answer accuracy per normalizer and inference
temperature, training time), reader_<normalizer>.npz, model.json and focus.html into the workdir.
With --port > 0 it then serves the page on http://127.0.0.1:PORT/ until Ctrl-C.
"""

import math
import os

from absl import flags

from attn.launching import cli

FLAGS = flags.FLAGS
WEB_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "web")


def define_flags():
  """Defined on demand, so tests can import this module next to other flag-defining ones."""
  flags.DEFINE_list("normalizers", ["softmax", "sparsemax", "entmax15"],
                    "Normalizers to train a reader with (registry names).")
  flags.DEFINE_string("score", "dot", "Attention score (registry name).")
  flags.DEFINE_integer("steps", 3000, "Adam steps per normalizer (batch 64).")
  flags.DEFINE_integer("seed", 0, "Random seed (stories and initialization).")
  flags.DEFINE_list("temperatures", ["0.1", "0.3", "1", "3", "10"],
                    "Inference temperatures to evaluate.")
  flags.DEFINE_float("object_questions", 0.0,
                     "Fraction of 'Where is the apple?' questions (two supporting facts).")
  flags.DEFINE_string("workdir", "workdirs/focus", "Where results, parameters and the page go.")
  flags.DEFINE_integer("port", 0, "Serve the page on 127.0.0.1:PORT after training (0: don't).")
  flags.DEFINE_bool("serve_only", False, "Serve the reader saved in --workdir without training.")


def config_from_flags():
  """The FocusConfig the flags describe; bad values raise ConfigError (one line at the CLI)."""
  from attn.inspection import focus
  from attn.inspection import stories  # pylint: disable=import-outside-toplevel
  from attn.errors import ConfigError  # pylint: disable=import-outside-toplevel
  temperatures = []
  for t in FLAGS.temperatures:
    try:
      temperatures.append(float(t))
    except ValueError:
      raise ConfigError(f"--temperatures: {t!r} is not a number") from None
    if not math.isfinite(temperatures[-1]):
      raise ConfigError(f"--temperatures: {t!r} is not finite")
  if not 0 <= FLAGS.port <= 65535:
    raise ConfigError(f"--port must be in 0..65535, got {FLAGS.port}")
  if FLAGS.serve_only and FLAGS.port == 0:
    raise ConfigError("--serve_only needs --port (a port to serve on)")
  return focus.FocusConfig(
      stories=stories.StoryConfig(object_questions=FLAGS.object_questions),
      score=FLAGS.score, normalizers=tuple(FLAGS.normalizers), temperatures=tuple(temperatures),
      steps=FLAGS.steps, seed=FLAGS.seed)


def main(argv):
  del argv
  from attn.inspection import focus  # pylint: disable=import-outside-toplevel  (after flag parsing)
  cfg = config_from_flags()
  page = focus.inline_page(WEB_DIR)
  if not FLAGS.serve_only:
    results = focus.train_and_evaluate(cfg, FLAGS.workdir, page=page)
    print("\n" + focus.results_table(results))
    print(f"wrote {FLAGS.workdir}/{{{focus.RESULTS_FILE},{focus.TABLE_FILE},{focus.PAGE_FILE}}}")
  if FLAGS.port:
    service = focus.FocusService.from_workdir(FLAGS.workdir)
    cli.serve(lambda: focus.make_server(service, page, FLAGS.port), FLAGS.port)


if __name__ == "__main__":
  define_flags()
  cli.run(main)
