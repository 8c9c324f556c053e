r"""Retrieval, then read (the idea under RAG): two-hop bAbI-style questions ("Where is the
apple?") whose story is hidden in a pool of distractor stories; a dot-product retriever keeps the
top-k stories (attn's `topk` scope) and a two-hop reader answers from them. Trained per retrieval
mode (learned, random k, whole pool) and number of distractors; the page shows both stages'
weights.

    python -m experiments.retrieve --workdir=workdirs/retrieve                # the sweep, minutes
    python -m experiments.retrieve --workdir=workdirs/retrieve --serve_only --port=8000
    python -m experiments.retrieve --distractors=0,4 --steps=200 --train_size=500   # tiny
    python -m experiments.retrieve --workdir=workdirs/retrieve --serve_only --diagnose

Each model trains through the one training loop (attn.training.loop) in its own workdir,
<workdir>/runs/<mode>_d<distractors>/: Ctrl-C saves the current step, rerunning the same command
resumes the sweep where it stopped, and a diverging loss stops it before anything after it is
saved. A rerun with other training settings (another --train_size, --seed, ...: trained_with.json
records them) is refused in one line; use another --workdir.

Writes retrieve.json, retrieve.md (recall@k, answer accuracy and hop hits per mode and number of
distractors, training time), retrieve.png (the same against distractors), retriever.npz and
model.json (the model the page serves) and retrieve.html into the workdir. With --port > 0 it
then serves the page on http://127.0.0.1:PORT/ until Ctrl-C. Every field of
attn.apps.retrieve.sweep.RetrieveConfig (and of its stories section) is a flag: --top_k, --hops,
--retrieval_loss, --modes, ...

--diagnose (after training, or with --serve_only on the model already saved in --workdir, without
retraining) asks whether the answer uses the weights: the served model's retrieval weights over
its top-k stories and each reader hop's weights over sentences are replaced in turn by each of
--interventions (attn.inspection.interventions; `identity` reproduces the model's accuracy) on the
run's own test pools, and diagnose.json and diagnose.md (accuracy, answers changed, and where each
stage's top weight sits) are written into the workdir (attn.apps.retrieve.diagnosis).
"""

import os

import attn.apps  # noqa: F401  (registers the built-in applications)
from attn.apps.retrieve.sweep import RetrieveConfig
from attn.apps.retrieve.diagnosis import RetrieveDiagnosis
from attn.apps.retrieve.server import RetrieveServing
from attn.launching import cli

WEB_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "web")


def define_flags():
  """One flag per field of RetrieveConfig and RetrieveServing (defined on demand, so tests can
  import this module next to other flag-defining ones)."""
  cli.define_settings_flags(RetrieveConfig)
  cli.define_settings_flags(RetrieveServing)
  cli.define_settings_flags(RetrieveDiagnosis)


def main(argv):
  del argv
  # pylint: disable-next=import-outside-toplevel  (after flag parsing)
  from attn.apps.focus import server as focus_server
  from attn.apps.retrieve import sweep as retrieve
  from attn.apps.retrieve import diagnosis as retrieve_diagnosis
  from attn.apps.retrieve import server as retrieve_server
  cfg = cli.settings_from_flags(RetrieveConfig)
  serving = cli.settings_from_flags(RetrieveServing)
  diagnosis = cli.settings_from_flags(RetrieveDiagnosis)
  page = focus_server.inline_page(WEB_DIR)
  if not serving.serve_only:
    results = retrieve.train_and_evaluate(cfg, serving.workdir, page=page)
    print("\n" + retrieve.results_table(results))
    print(f"wrote {serving.workdir}/{{{retrieve.RESULTS_FILE},{retrieve.TABLE_FILE},"
          f"{retrieve.PLOT_FILE},{retrieve.PAGE_FILE}}}")
  if serving.diagnose:
    report = retrieve_diagnosis.diagnose_workdir(serving.workdir, diagnosis.interventions)
    print("\n" + retrieve_diagnosis.diagnosis_table(report))
    print(f"wrote {serving.workdir}/{{{retrieve_diagnosis.DIAGNOSIS_FILE},"
          f"{retrieve_diagnosis.DIAGNOSIS_TABLE}}}")
  if serving.port:
    service = retrieve_server.RetrieveService.from_workdir(serving.workdir)
    cli.serve(lambda: focus_server.make_server(service, page, serving.port), serving.port)


if __name__ == "__main__":
  define_flags()
  cli.run(main)
