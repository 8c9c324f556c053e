r"""Can a next-item recommender's attention be read as an explanation? The diagnosis of a
finished recommend run (experiments/recommend.py, attn.apps.recommend.task), asking the
seq2seq diagnosis's two questions (attn.inspection.diagnosis) of the prediction at each test
user's final position:

- agreement: Kendall tau between the final position's attention over the history (last block,
  head average: the weights results.json's attention_on_gold reads) and |gradient x input| of
  the log-probability of the item the model ranks first (its own decision, as the seq2seq
  diagnosis explains the greedy output) with respect to each history item's embedding
  (measures.kendall_tau, the same tau-b); and whether each one's largest entry is the planted
  trigger, the item the log's generator made the held-out one depend on;
- counterfactual: the final query's attention row replaced by each intervention of
  attn.inspection.interventions in every block at once (draw = the block), and, with more than
  one block, in each block alone; every other position attends as it did (causality keeps them
  blind to the final row). Reported: the output distribution's total variation / JS divergence
  and top-1 flips (measures.output_divergences), the held-out item's score and rank, HR@10 and
  NDCG@10 with the replaced weights.

    diag = diagnose(load_run(workdir))
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attn.common import files
from attn.common.tables import markdown_table
from attn.errors import ConfigError
from attn.evaluation import ranking
from attn.inspection import interventions as interventions_lib
from attn.inspection import measures
from attn.inspection.diagnosis import DiagnosisError, tau_summary
from attn.training import workdir as workdir_lib

K = 10  # HR@K, NDCG@K
BATCH = 128  # users per jitted call (the last batch padded: one compilation)
PLOTS = ("diagnose_tau.png", "diagnose_counterfactual.png")


def check_model(workdir: str, record: dict) -> None:
  """DiagnosisError (one line) for a run whose model forms no attention; record: results.json's
  `model_config` (checked before anything is loaded)."""
  from attn.apps.recommend import model as recommenders  # pylint: disable=import-outside-toplevel
  kind = record.get("kind", "?")
  if kind not in recommenders.RECOMMENDERS or not recommenders.RECOMMENDERS.get(kind).has_attention:
    raise DiagnosisError(
        f"{workdir}: model.kind={kind!r} has no attention (the history enters without weights "
        "over its items): there are none to diagnose; pick a run with model.kind=sasrec")


def load_run(workdir: str):
  """(the training loop's Run with its best checkpoint restored, the leave-one-out splits) of a
  finished recommend run; WorkdirError / DiagnosisError (one line) for a run that is not one or
  has no attention. Writes nothing."""
  import ml_collections  # pylint: disable=import-outside-toplevel
  from attn.apps.recommend import task as rec  # pylint: disable=import-outside-toplevel
  from attn.training import building, checkpoints  # pylint: disable=import-outside-toplevel
  res, why = _read(os.path.join(workdir, "results.json"))
  if res is None or "hr10" not in res:
    raise workdir_lib.WorkdirError(
        f"{workdir}: not a finished recommend run ({why or 'results.json has no hr10'}); train "
        f"it first: python -m experiments.recommend --workdir={workdir}")
  check_model(workdir, res.get("model_config") or {})
  with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
    config = ml_collections.ConfigDict(json.load(f))
  task = rec.RecommendTask()
  run = building.build_run(config, workdir, task, building.validate_config(config, task), record=False)
  checkpoints.restore_for_reading(workdir, run)
  nnx.update((run.model, run.optimizer), run.state)
  return run, run.bundle.splits


def _read(path):
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f), ""
  except (OSError, ValueError) as e:
    return None, f"{os.path.basename(path)}: {type(e).__name__}"


def _final_logits(model, inputs, lengths, **kw):
  """Scores of every item at each user's final position [B, V] float32, and the weights."""
  h, w = model(inputs, lengths, **kw)
  last = jnp.maximum(lengths - 1, 0)
  return model.logits(h[jnp.arange(inputs.shape[0]), last]).astype(jnp.float32), w


def final_row_reweigh(intervene, layers):
  """A SASRec `reweigh` hook: the final query's row (left-padded frame: position T - 1) of the
  blocks `layers` replaced by `intervene(row [B, H, 1, T], mask, draw = block)`."""

  def reweigh(w, mask, layer):
    if layer not in layers:
      return w
    row = w[:, :, -1:, :]
    new = intervene(row, jnp.broadcast_to(mask[:, :, -1:, :], row.shape), layer)
    return w.at[:, :, -1:, :].set(new.astype(w.dtype))

  return reweigh


def gradient_x_input(model, inputs, lengths, explained):
  """<d log p(explained) / d e_j, e_j> at the final position for each history item j: [B, T]
  float32 (e_j: the item's embedding, without its position; 0 past the history)."""
  e = model.items(inputs).astype(jnp.float32)  # [B, T, d]

  def f(offset):
    lp = jax.nn.log_softmax(_final_logits(model, inputs, lengths, embed_offset=offset)[0])
    return jnp.sum(jnp.take_along_axis(lp, explained[:, None], axis=1))

  g = jax.grad(f)(jnp.zeros_like(e))  # rows are independent: the sum's gradient is each row's
  valid = jnp.arange(inputs.shape[1])[None] < lengths[:, None]
  return jnp.where(valid, jnp.einsum("btd,btd->bt", g, e), 0.0)


@functools.partial(jax.jit, static_argnums=(0, 5, 6))
def analyze_batch(graphdef, params, inputs, lengths, key, interventions, num_layers):
  """Per user of one batch: logits [B, V], attention [B, T] (final position, last block, head
  average), by_block [B, L, T] (each block's), gxi [B, T], tau [B] and tau_by_block [B, L]
  (attention vs |gxi|); per intervention `name` the counterfactual logits
  `{name}/all` and, with more than one block, `{name}/layer{l}` [B, V]."""
  model = nnx.merge(graphdef, params)
  logits, w = _final_logits(model, inputs, lengths)
  rows, last = jnp.arange(inputs.shape[0]), jnp.maximum(lengths - 1, 0)
  by_block = w.mean(axis=2)[rows, :, last]  # [B, L, T]
  mask = jnp.arange(inputs.shape[1])[None] < lengths[:, None]
  gxi = gradient_x_input(model, inputs, lengths, jnp.argmax(logits, axis=-1))
  out = {"logits": logits, "attention": by_block[:, -1], "by_block": by_block, "gxi": gxi,
         "tau": measures.kendall_tau(by_block[:, -1], jnp.abs(gxi), mask),
         "tau_by_block": measures.kendall_tau(by_block, jnp.abs(gxi)[:, None], mask[:, None])}
  sets = {"all": tuple(range(num_layers))}
  if num_layers > 1:
    sets.update({f"layer{l}": (l,) for l in range(num_layers)})
  for i, name in enumerate(interventions):
    fn = interventions_lib.get(name, jax.random.fold_in(key, i))
    for label, layers in sets.items():
      out[f"{name}/{label}"] = _final_logits(model, inputs, lengths,
                                             reweigh=final_row_reweigh(fn, layers))[0]
  return out


@dataclasses.dataclass
class Diagnosis:
  """`report`: diagnose.json's content; `users`: per-user numpy arrays for the plots."""
  report: dict
  users: dict


def diagnose(loaded, *, split="test", max_examples=200, seed=0,
             interventions=interventions_lib.DEFAULT) -> Diagnosis:
  """Diagnoses the first `max_examples` users of `split` of a `load_run` result."""
  run, splits = loaded
  for name in interventions:
    interventions_lib.INTERVENTIONS.get(name)
  if split not in splits or split == "train":
    raise ConfigError(f"--split={split}: a recommend run is diagnosed on test or valid")
  sp = splits[split]
  U = min(max_examples, len(sp.lengths))
  graphdef, params = nnx.split(run.model)
  L, key, parts = run.mc.num_blocks, jax.random.PRNGKey(seed), []
  for b, lo in enumerate(range(0, U, BATCH)):
    rows = np.resize(np.arange(lo, min(lo + BATCH, U)), BATCH)
    out = analyze_batch(graphdef, params, sp.inputs[rows], sp.lengths[rows],
                        jax.random.fold_in(key, b), tuple(interventions), L)
    parts.append({k: np.asarray(v)[:min(BATCH, U - lo)] for k, v in jax.device_get(out).items()})
  users = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
  users.update(lengths=sp.lengths[:U], gold=sp.gold[:U], target=sp.last[:U])
  return Diagnosis(_report(run, split, seed, users, interventions), users)


def _ranking(logits, target) -> dict:
  r = ranking.ranks(logits, target)
  return {"hr10": ranking.hit_rate(r, K), "ndcg10": ranking.ndcg(r, K),
          "median_rank": float(np.median(r)), "ranks": r}


def _cf_summary(users, key, real) -> dict:
  cf_logits, logits, target = users[key], users["logits"], users["target"]
  tv, js, flip = (np.asarray(x) for x in measures.output_divergences(logits, cf_logits))
  cf = _ranking(cf_logits, target)
  lp = lambda z: np.asarray(jax.nn.log_softmax(z))[np.arange(len(target)), target]
  score = lambda z: z[np.arange(len(target)), target]
  return {"tv_mean": float(tv.mean()), "js_mean": float(js.mean()),
          "top1_flip_rate": float(flip.mean()),
          "target_score_change_mean": float(np.mean(score(cf_logits) - score(logits))),
          "target_logprob_change_mean": float(np.mean(lp(cf_logits) - lp(logits))),
          "median_rank": cf["median_rank"],
          "rank_worse_share": float(np.mean(cf["ranks"] > real["ranks"])),
          "hr10": cf["hr10"], "ndcg10": cf["ndcg10"],
          "hr10_change": cf["hr10"] - real["hr10"], "ndcg10_change": cf["ndcg10"] - real["ndcg10"]}


def _report(run, split, seed, users, interventions) -> dict:
  mc, real = run.mc, _ranking(users["logits"], users["target"])
  gold, n = users["gold"], users["lengths"]
  planted = gold >= 0
  hit = lambda scores: float(np.mean(np.argmax(np.abs(scores), 1)[planted] == gold[planted]))
  att, gxi = users["attention"], users["gxi"]
  return {
      "workdir": run.workdir, "experiment": "recommend", "split": split,
      "n_users": int(len(n)), "seed": seed,
      "model": {k: getattr(mc, k) for k in ("kind", "score", "normalizer", "num_blocks",
                                           "num_heads")},
      "hr10": real["hr10"], "ndcg10": real["ndcg10"], "median_rank": real["median_rank"],
      "attention": {"read": "final position, last block, head average",
                    "on_trigger_mean": float(np.mean(att[planted, gold[planted]])),
                    "argmax_is_trigger": hit(att), "n_planted": int(planted.sum()),
                    "on_trigger_by_block": [float(np.mean(b[planted, gold[planted]]))
                                            for b in np.moveaxis(users["by_block"], 1, 0)],
                    "argmax_is_trigger_by_block": [
                        hit(b) for b in np.moveaxis(users["by_block"], 1, 0)]},
      "attribution": {"method": "gradient_x_input", "input": "history item embeddings",
                      "explained": "the item ranked first at the final position",
                      "kendall_tau": tau_summary(users["tau"], n),
                      "top1_agreement": float(np.mean(np.argmax(att, 1) ==
                                                      np.argmax(np.abs(gxi), 1))),
                      "argmax_is_trigger": hit(gxi),
                      "kendall_tau_mean_by_block": [
                          float(np.nanmean(t)) for t in np.moveaxis(users["tau_by_block"], 1, 0)
                      ]},
      "counterfactual_layers": "every block's final-position row at once",
      "counterfactual": {name: _cf_summary(users, f"{name}/all", real) for name in interventions},
      "counterfactual_by_layer": None if mc.num_blocks == 1 else {
          name: [_cf_summary(users, f"{name}/layer{l}", real) for l in range(mc.num_blocks)]
          for name in interventions},
  }


def format_table(report) -> str:
  """A short plain-text summary of a recommend diagnose report."""
  a, g = report["attention"], report["attribution"]
  kt = g["kendall_tau"]
  lines = [f"{report['model']['kind']} on {report['split']}: {report['n_users']} users, HR@10 "
           f"{report['hr10']:.3f}, NDCG@10 {report['ndcg10']:.3f}",
           f"attention ({a['read']}): on the trigger {a['on_trigger_mean']:.3f}, argmax is the "
           f"trigger {a['argmax_is_trigger']:.3f}; by block, on the trigger " + ", ".join(
               f"{v:.3f}" for v in a["on_trigger_by_block"]) + ", argmax " + ", ".join(
               f"{v:.3f}" for v in a["argmax_is_trigger_by_block"]),
           f"gradient x input: argmax is the trigger {g['argmax_is_trigger']:.3f}; Kendall "
           f"tau(attention, |gxi|) mean {kt.get('mean', float('nan')):.3f} over {kt['n_steps']} "
           f"users, top-1 agreement {g['top1_agreement']:.3f}; mean tau by block " + ", ".join(
               f"{v:.3f}" for v in g["kendall_tau_mean_by_block"]), "",
           f"interventions ({report['counterfactual_layers']}):"]
  lines.append(markdown_table(
      ["intervention", "HR@10", "NDCG@10", "median rank", "target log p change", "top-1 flips",
       "mean TV"],
      [["(none)", f"{report['hr10']:.3f}", f"{report['ndcg10']:.3f}",
        f"{report['median_rank']:.0f}", "0", "0", "0"]]
      + [[name, f"{r['hr10']:.3f}", f"{r['ndcg10']:.3f}", f"{r['median_rank']:.0f}",
          f"{r['target_logprob_change_mean']:+.3f}", f"{r['top1_flip_rate']:.3f}",
          f"{r['tv_mean']:.3f}"] for name, r in report["counterfactual"].items()]))
  for name, rows in (report["counterfactual_by_layer"] or {}).items():
    lines.append(f"{name} in one block alone, HR@10: " + ", ".join(
        f"block {l + 1} {r['hr10']:.3f}" for l, r in enumerate(rows)))
  return "\n".join(lines)


def plot(diag, directory) -> list[str]:
  """PLOTS: the per-user tau histogram; HR@10 / NDCG@10 under each intervention."""
  from attn.common import plots as viz  # pylint: disable=import-outside-toplevel
  plt = viz.pyplot()
  r, u = diag.report, diag.users
  paths = [os.path.join(directory, p) for p in PLOTS]
  fig, ax = plt.subplots(figsize=(5, 3.2))
  ok = (u["lengths"] >= 3) & np.isfinite(u["tau"])
  ax.hist(u["tau"][ok], bins=40, range=(-1, 1), color="0.3")
  ax.axvline(0, color="C3", lw=0.8)
  ax.set(xlabel="Kendall tau (attention vs |gradient x input|), per user", ylabel="users",
         title=r["model"]["kind"])
  fig.tight_layout()
  fig.savefig(paths[0], dpi=110)
  plt.close(fig)
  names = ["(none)", *r["counterfactual"]]
  hr = [r["hr10"]] + [c["hr10"] for c in r["counterfactual"].values()]
  nd = [r["ndcg10"]] + [c["ndcg10"] for c in r["counterfactual"].values()]
  fig, ax = plt.subplots(figsize=(5, 3.2))
  x = np.arange(len(names))
  ax.bar(x - 0.2, hr, 0.4, label="HR@10", color="0.3")
  ax.bar(x + 0.2, nd, 0.4, label="NDCG@10", color="C0")
  ax.set_xticks(x, names)
  ax.set(ylim=(0, 1), title=f"{r['model']['kind']}: final-position attention replaced")
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(paths[1], dpi=110)
  plt.close(fig)
  return paths


def write(diag, directory) -> str:
  """diagnose.json (atomic) and PLOTS into `directory`; returns the JSON's path."""
  plot(diag, directory)
  path = os.path.join(directory, "diagnose.json")
  files.write_json(path, diag.report)
  return path


def diagnose_workdir(settings, out: str):
  """`experiments.diagnose`'s hook (attn.common.applications.App.diagnose): the diagnosis of the
  finished run in `settings.workdir` (DiagnoseSettings) written into `out`; (diagnose.json's
  path, the plot file names, the printed table)."""
  if settings.ig_steps:
    raise ConfigError(f"--ig_steps={settings.ig_steps}: integrated gradients are not "
                      "implemented for recommend runs; leave it at 0")
  diag = diagnose(load_run(settings.workdir), split=settings.split,
                  max_examples=settings.max_examples, seed=settings.seed,
                  interventions=settings.interventions)
  os.makedirs(out, exist_ok=True)
  return write(diag, out), PLOTS, format_table(diag.report)
