r"""The reading-focus demo: a one-hop attention reader answers "Where is Mary?" about a short
bAbI-style story; a page highlights the sentences by attention weight, with a focus-strength
(temperature) slider and a choice of normalizer.

    python -m experiments.focus --workdir=workdirs/focus --port=8000     # train (~10 s), serve
    python -m experiments.focus --workdir=workdirs/focus --serve_only --port=8000
    python -m experiments.focus --normalizers=softmax,sparsemax --score=general --port=0

Writes focus.json, focus.md (evidence hit rate and answer accuracy per normalizer and inference
temperature, training time), reader_<normalizer>.npz, model.json and focus.html into the workdir.
Each reader trains through the one training loop (attn.training.loop) in its own run,
<workdir>/runs/<normalizer>/: rerunning the same command resumes an interrupted demo from its
last checkpoint (Ctrl-C saves the current step first), and a loss that diverges stops it. A
rerun with other training settings (another --train_size, --seed, ...: trained_with.json records
them) is refused in one line; use another --workdir.
With --port > 0 it then serves the page on http://127.0.0.1:PORT/ until Ctrl-C. Every field of
attn.apps.focus.sweep.FocusConfig (and of its stories section) is a flag: --dim, --train_size,
--object_questions, ...
"""

import os

import attn.apps  # noqa: F401  (registers the built-in applications)
from attn.apps.focus.sweep import FocusConfig
from attn.apps.focus.server import FocusServing
from attn.launching import cli

WEB_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "web")


def define_flags():
  """One flag per field of FocusConfig (what is trained) and FocusServing (where it goes, how it
  is served). Defined on demand, so tests can import this module next to other flag-defining
  ones."""
  cli.define_settings_flags(FocusConfig)
  cli.define_settings_flags(FocusServing)


def main(argv):
  del argv
  # pylint: disable-next=import-outside-toplevel  (after flag parsing)
  from attn.apps.focus import sweep as focus
  from attn.apps.focus import server as focus_server
  cfg = cli.settings_from_flags(FocusConfig)
  serving = cli.settings_from_flags(FocusServing)
  page = focus_server.inline_page(WEB_DIR)
  if not serving.serve_only:
    results = focus.train_and_evaluate(cfg, serving.workdir, page=page)
    print("\n" + focus.results_table(results))
    print(f"wrote {serving.workdir}/{{{focus.RESULTS_FILE},{focus.TABLE_FILE},{focus.PAGE_FILE}}}")
  if serving.port:
    service = focus_server.FocusService.from_workdir(serving.workdir)
    cli.serve(lambda: focus_server.make_server(service, page, serving.port), serving.port)


if __name__ == "__main__":
  define_flags()
  cli.run(main)
