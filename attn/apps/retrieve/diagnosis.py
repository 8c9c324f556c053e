"""Is the attention on the gold facts what the answer uses? A counterfactual diagnosis of a trained
retriever + reader (attn.apps.retrieve.model), stage by stage.

Each stage's weights are replaced by a registered intervention (attn.inspection.interventions:
identity, permute, uniform, zero_top) while the other stages run as trained, and the answers are
scored again (as attn.inspection.diagnosis does for a seq2seq decoder's steps):

- stage `retrieval`: p(z|q) over the k retrieved stories (the scope is the mask: permute shuffles
  the weights among the k, uniform reads them equally, zero_top gives the best story weight 0).
  With a single story in scope zero_top leaves no weight anywhere, and the answer is the
  equal-weighted mixture of what was read: with k = 1, the same answer;
- stage `hop h`: the reader's hop-h weights over a story's sentences, in every story read.

Per stage and intervention: answer accuracy, the fraction of answers that changed and the mean
total variation between the real and the counterfactual answer distributions
(measures.output_divergences). `identity` is the control: it must reproduce the model's own
accuracy exactly. Per stage also where the top weight sits: the gold story for retrieval, the hop's
gold fact for a hop (attn.apps.retrieve.evaluation.hop_hits).

    report = diagnose_workdir("workdirs/retrieve", ("identity", "zero_top"))
"""

from __future__ import annotations

import dataclasses
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attn.common import files
from attn.common.tables import markdown_table
from attn.config.configurable import option
from attn.errors import ConfigError
from attn.inspection import interventions as interventions_lib
from attn.inspection import measures
from attn.apps.focus.server import RETRAIN, damaged_file, read_saved_json
from attn.apps.retrieve import data as pools
from attn.apps.retrieve import evaluation
from attn.apps.retrieve import model as retriever
from attn.apps.retrieve import sweep as retrieve

DIAGNOSIS_FILE = "diagnose.json"
DIAGNOSIS_TABLE = "diagnose.md"


@dataclasses.dataclass(frozen=True)
class RetrieveDiagnosis:
  """What `--diagnose` applies to each stage's weights."""
  interventions: tuple[str, ...] = option(
      ("identity",) + interventions_lib.DEFAULT, "Interventions applied to each stage's weights "
      "with --diagnose (registry names: " + ", ".join(interventions_lib.INTERVENTIONS.names())
      + ").")

  def __post_init__(self):
    if not self.interventions:
      raise ConfigError("--interventions: name at least one, known: "
                        + ", ".join(interventions_lib.INTERVENTIONS.names()))
    for name in self.interventions:
      interventions_lib.INTERVENTIONS.get(name)  # an unknown name fails before any work


def stages(cfg: retriever.RetrieverConfig) -> list[tuple[int, str]]:
  """(the model's `at`, a label) per stage with weights: retrieval (not for a whole-pool
  reader, which retrieves nothing), then every hop."""
  retrieval = [] if retriever.RETRIEVAL.get(cfg.mode).flat else [(0, "retrieval")]
  return retrieval + [(h, f"hop {h}") for h in range(1, cfg.hops + 1)]


@functools.partial(jax.jit, static_argnums=(0, 7))
def _counterfactual(graphdef, state, passages, mask, question, key, draw_key, name, at):
  """log p(a|q) [B, A] with stage `at` (traced: one program per intervention) read through
  intervention `name`."""
  intervene = interventions_lib.get(name, draw_key)
  return nnx.merge(graphdef, state)(passages, mask, question, key=key, intervene=intervene,
                                    at=at).log_probs


def counterfactual_log_probs(model, data: pools.PoolSet, name: str, at: int, seed: int = 0,
                             batch: int = 250) -> np.ndarray:
  """log p(a|q) [N, A] over every question of `data` with stage `at` intervened on; batches and
  model keys as evaluation.run_model, so `identity` gives its numbers."""
  graphdef, state = nnx.split(model)
  n, outs = len(data.answer), []
  for start in range(0, n, batch):
    p, m, q, _, _ = pools.batch_arrays(data, np.arange(start, min(start + batch, n)))
    key = jax.random.fold_in(jax.random.PRNGKey(seed), start)
    draw_key = jax.random.fold_in(jax.random.PRNGKey(seed + 1), start)
    outs.append(np.asarray(_counterfactual(graphdef, state, p, m, q, key, draw_key, name,
                                           jnp.int32(at))))
  return np.concatenate(outs)


def diagnose(model, data: pools.PoolSet, max_sentences: int, interventions, seed: int = 0) -> dict:
  """The model's accuracy on `data` and, per stage: where its top weight sits (`top_on_gold`)
  and per intervention {accuracy, changed, tv} (see the module docstring)."""
  out = evaluation.run_model(model, data, seed)
  answer = out.log_probs.argmax(-1)
  flat = retriever.RETRIEVAL.get(model.cfg.mode).flat
  hits = evaluation.hop_hits(out, data, max_sentences, flat)
  top_story = float(np.mean(out.passage_weights.argmax(-1) == data.gold))
  rows = []
  for at, label in stages(model.cfg):
    row = {"stage": label, "top_on_gold": hits[at - 1] if at else top_story}
    for name in interventions:
      cf = counterfactual_log_probs(model, data, name, at, seed)
      tv, _, changed = measures.output_divergences(out.log_probs, cf)
      row[name] = {"accuracy": float(np.mean(cf.argmax(-1) == data.answer)),
                   "changed": float(np.mean(changed)), "tv": float(np.mean(tv))}
    rows.append(row)
  return {"questions": int(len(data.answer)), "passages": int(data.pool.shape[1]),
          "accuracy": float(np.mean(answer == data.answer)), "stages": rows,
          "interventions": list(interventions)}


def diagnosis_table(report: dict) -> str:
  """Markdown: one row per stage; per intervention accuracy / answers changed."""
  names = report["interventions"]
  header = ["stage", "top weight on gold"] + [f"{n}: accuracy / changed" for n in names]
  rows = [[r["stage"], f"{r['top_on_gold']:.3f}"]
          + [f"{r[n]['accuracy']:.3f} / {r[n]['changed']:.3f}" for n in names]
          for r in report["stages"]]
  return "\n".join([
      f"{report['mode']} model trained with {report['distractors']} distractors; "
      f"{report['questions']} test questions, {report['passages']} stories per pool; accuracy "
      f"{report['accuracy']:.3f}. Top weight on gold: retrieval, the gold story; hop 1, the "
      "pick-up; hop 2, the holder's last move. changed: answers that differ from the model's own.",
      "", markdown_table(header, rows)]) + "\n"


def load(workdir: str):
  """The model the page serves and its test pools, rebuilt as the training run built them ->
  (model, test PoolSet, the run's results). One ConfigError line when the workdir lacks them or
  when its retrieve.json or model.json is damaged (attn.apps.focus.server.damaged_file)."""
  # pylint: disable-next=import-outside-toplevel  (the page's module loads the saved model)
  from attn.apps.retrieve.server import RetrieveService
  service = RetrieveService.from_workdir(workdir)
  path = os.path.join(workdir, retrieve.RESULTS_FILE)
  if not os.path.exists(path):
    raise ConfigError(f"no {retrieve.RESULTS_FILE} in {workdir}: {RETRAIN}")
  results = read_saved_json(path)
  with damaged_file(path):  # every field diagnose_workdir reads, checked before any work
    test_size, seed = int(results["config"]["test_size"]), int(results["config"]["seed"])
    results["modes"].get(service.cfg.mode, [])
  model_file = os.path.join(workdir, retrieve.MODEL_FILE)
  saved = read_saved_json(model_file)
  with damaged_file(model_file):
    distractors = int(saved["trained_distractors"])
  test = pools.held_out_pools(test_size, distractors, seed, service.story_config, service.vocab)
  return nnx.merge(*service.model), test, results


def diagnose_workdir(workdir: str, interventions) -> dict:
  """Diagnoses the model saved in `workdir` on the run's own test pools; writes diagnose.json
  and diagnose.md there and returns the report. `reported_accuracy` is the run's own figure for
  that model (retrieve.json), which `identity` must reproduce."""
  model, test, results = load(workdir)
  d = int(test.pool.shape[1]) - 1
  report = diagnose(model, test, model.cfg.max_sentences, interventions, results["config"]["seed"])
  rows = results["modes"].get(model.cfg.mode, [])
  report.update(mode=model.cfg.mode, distractors=d, reported_accuracy=next(
      (r["answer_accuracy"] for r in rows if r["distractors"] == d), None))
  files.write_text(os.path.join(workdir, DIAGNOSIS_TABLE),
                   "# Retrieval, then read: counterfactual diagnosis\n\n" + diagnosis_table(report))
  files.write_json(os.path.join(workdir, DIAGNOSIS_FILE), report)
  return report
