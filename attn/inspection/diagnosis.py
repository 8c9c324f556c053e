r"""Can attention weights be read as an explanation? Diagnosis of a trained seq2seq model.

Jain & Wallace (2019, "Attention is not Explanation") ask two questions of attention weights:
do they agree with other measures of feature importance (gradients), and does the output change
when they are replaced (permuted, made uniform)? Wiegreffe & Pinter (2019, "Attention is not not
Explanation") add that an explanation must be tested against the model's own behaviour, not
read off a heatmap. `diagnose` measures both for a finished run, plus a check that exposes a
common misreading: an RNNsearch decoder (Bahdanau et al. 2015) scores the source with the
*previous* state s_{t-1}, so its attention can sit one target position off the gold link while
decoding perfectly (`measures.shifted_gold`).

The measures are in attn.inspection.measures, the counterfactual interventions in
attn.inspection.interventions, the files and plots in attn.inspection.diagnosis_report.

A multi-head model (the Transformer) is read two ways: its `weights` (the alignment layer's
head average, attn.models.transformer.ALIGNMENT_LAYER) go through every measure, and its
`heads` [B, L, H, Tt, Ts] get entropy and the gold-alignment scores per layer and head.

Attribution and counterfactuals are evaluated along the model's own greedy output (decode, then
teacher-force along it): the token whose probability is explained is the one the model chose.
Alignment scores are teacher-forced along the reference, as `evaluation.alignment_scores`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attn import registry
from attn.common.jitting import jitted
from attn.config.configurable import option
from attn.errors import AttnError, ConfigError
from attn.inspection import interventions as interventions_lib
from attn.inspection import measures


class DiagnosisError(AttnError, ValueError):
  """A run the diagnosis cannot read attention from (a decoder without attention, a variant
  that never forms the weights, a pointer-generator, an empty split)."""


@dataclasses.dataclass(frozen=True)
class DiagnoseSettings:
  """A diagnosis of one finished run (`python -m experiments.diagnose`); the defaults of
  `diagnose`."""
  workdir: str | None = option(None, "A finished run's directory (holds results.json).")
  out: str | None = option(None, "Directory for diagnose.json and the plots (default: the run's "
                           "directory; created if missing).")
  split: str = option("test", "Data split to diagnose.")
  max_examples: int = option(200, "Diagnose the first N examples of the split.")
  seed: int = option(0, "Seed of the random permutations.")
  ig_steps: int = option(0, "Integrated-gradients steps (0 = skip; costs N x gradient x input "
                         "in time; on the demo model 32 steps leave a median completeness gap "
                         "of 0.1%, 8 steps 30%).")
  interventions: tuple[str, ...] = option(
      interventions_lib.DEFAULT, "Counterfactual interventions to apply (registry names: "
      + ", ".join(interventions_lib.INTERVENTIONS.names()) + ").")

  def __post_init__(self):
    if self.max_examples < 1:
      raise ConfigError(f"--max_examples must be >= 1, got {self.max_examples}")
    if self.ig_steps < 0:
      raise ConfigError(f"--ig_steps must be >= 0, got {self.ig_steps}")
    for name in self.interventions:
      interventions_lib.INTERVENTIONS.get(name)  # an unknown name fails before any work


_DEFAULTS = DiagnoseSettings()


def analyze_batch(graphdef, params, batch, key, *, interventions=interventions_lib.DEFAULT,
                  ig_steps=0):
  """All per-step measures of one batch teacher-forced along batch["tgt"] (the greedy output).

  batch: src [B, Ts], src_lengths [B], tgt [B, Tt], tgt_lengths [B]. Returns a dict of arrays:
  weights [B, Tt, Ts], entropy [B, Tt], gxi [B, Tt, Ts], tau [B, Tt] (attention vs |gxi|),
  top1_agree [B, Tt] (same argmax), and per intervention name `{name}/tv`, `{name}/js`,
  `{name}/flip` [B, Tt]; with ig_steps > 0 also ig [B, Tt, Ts] and tau_ig [B, Tt]; for a
  multi-head model also head_entropy [B, Tt, L, H] and, with more than one decoder layer, each
  intervention in one layer alone, `{name}/layer{l}/tv` and `{name}/layer{l}/flip` [B, Tt].
  Jit it with graphdef, interventions and ig_steps static.
  """
  model = nnx.merge(graphdef, params)
  _, att = model.attention(batch)
  w = att.weights                                                # [B, Tt, Ts]
  mask = jnp.broadcast_to(measures.source_mask(batch)[:, None, :], w.shape)  # [B, Tt, Ts]
  gxi = measures.gradient_x_input(model, batch)
  out = {"weights": w, "entropy": measures.entropy(w, mask), "gxi": gxi,
         "tau": measures.kendall_tau(w, jnp.abs(gxi), mask),
         "top1_agree": jnp.argmax(jnp.where(mask, w, -1), -1)
         == jnp.argmax(jnp.where(mask, jnp.abs(gxi), -1), -1)}
  if att.heads is not None:  # [B, L, H, Tt, Ts] -> [B, Tt, L, H]: one row per output step
    heads_entropy = measures.entropy(att.heads, mask[:, None, None])  # [B, L, H, Tt]
    out["head_entropy"] = jnp.moveaxis(heads_entropy, -1, 1)
  if ig_steps:
    ig = measures.integrated_gradients(model, batch, ig_steps)
    out.update(ig=ig, tau_ig=measures.kendall_tau(w, jnp.abs(ig), mask))
  for i, name in enumerate(interventions):
    fn = interventions_lib.get(name, jax.random.fold_in(key, i))
    real, cf, _ = model.counterfactual(batch, fn)
    tv, js, flip = measures.output_divergences(real, cf)
    out.update({f"{name}/tv": tv, f"{name}/js": js, f"{name}/flip": flip})
  L = 0 if att.heads is None else att.heads.shape[1]
  for layer in range(L if L > 1 else 0):  # which layer's reading the output depends on
    for i, name in enumerate(interventions):
      fn = interventions_lib.get(name, jax.random.fold_in(key, i))
      real, cf, _ = model.counterfactual(batch, fn, layers=(layer,))
      tv, _, flip = measures.output_divergences(real, cf)
      out.update({f"{name}/layer{layer}/tv": tv, f"{name}/layer{layer}/flip": flip})
  return out


def _greedy(task, graphdef, params, src, src_lengths, *, max_len):
  from attn.training.task import Search  # pylint: disable=import-outside-toplevel
  return task.decode(nnx.merge(graphdef, params), {"src": src, "src_lengths": src_lengths},
                     max_len=max_len, search=Search(beam_size=1, length_penalty=0.0))


def _reference_attention(graphdef, params, batch):
  """Teacher-forced (weights [B, Tt, Ts], heads [B, L, H, Tt, Ts] or None)."""
  att = nnx.merge(graphdef, params).attention(batch)[1]
  return att.weights, att.heads


def analysis_model(run):
  """run.model, or for a fused model (which never forms the weights) the same parameters in the
  unfused variant. Raises DiagnosisError for a decoder without attention, a scope that never
  forms weights (linear attention) or a pointer-generator (see `check_model`)."""
  mc = run.mc
  check_model(run.workdir, mc)
  if not mc.has_attention:
    raise DiagnosisError(
        f"{run.workdir}: decoder {mc.variant['decoder']!r} has no attention (the source enters "
        "through one "
        "fixed vector): there are no weights to diagnose; pick a run with decoder=bahdanau or "
        "luong")
  scope = mc.variant["scope"]
  if registry.get(scope, "scope").full_attention:
    raise DiagnosisError(f"{run.workdir}: scope {scope!r} never forms attention weights "
                         "(its feature map replaces the softmax): there are none to diagnose")
  if not mc.fused:
    return run.model
  model = run.task.build_model(mc.replace(fused=False), seed=0)
  nnx.update(model, nnx.state(run.model))
  return model


def check_model(workdir, mc) -> None:
  """DiagnosisError for a model whose output the measures do not describe: a pointer-generator
  emits p_gen P_vocab + (1 - p_gen) x (the attention weights summed per source word), while the
  attribution and the counterfactuals explain the vocabulary distribution alone, and a
  counterfactual attention would change the copy term too; reading them as this model's would
  mislead. mc: a ModelConfig, or the `model_config` record of results.json (a dict: checked
  before the run is loaded)."""
  if isinstance(mc, dict):
    pointer = (mc.get("rnn") or {}).get("pointer")
  else:
    pointer = mc.rnn.pointer
  if pointer:
    raise DiagnosisError(
        f"{workdir}: a pointer-generator run (model.rnn.pointer=True) cannot be diagnosed: its "
        "output also copies the attention weights (p_gen mixes them in), and the diagnosis "
        "explains the vocabulary distribution alone; `python -m experiments.inspect` shows its "
        "attention")


def _round_up(n: int, k: int = 8) -> int:
  return -(-n // k) * k


@dataclasses.dataclass
class Diagnosis:
  """`report`: the JSON summary (diagnose.json). `steps`: pooled per-step numpy arrays of the
  valid output steps (entropy, normalized_entropy, tau, ..., `{intervention}/tv`) for plots."""
  report: dict
  steps: dict

def diagnose(run, *, split=_DEFAULTS.split, max_examples=_DEFAULTS.max_examples,
             seed=_DEFAULTS.seed, interventions=_DEFAULTS.interventions,
             ig_steps=_DEFAULTS.ig_steps) -> Diagnosis:
  """Diagnoses the attention of a loaded run (`attn.training.load_run`) on the first
  `max_examples` examples of `split` (batch order): greedy-decodes them, then measures entropy,
  gradient x input agreement (Kendall tau) and the counterfactual interventions along the
  greedy output, and, where the task has gold alignments, AER / attention-on-gold teacher-forced
  along the reference (with the one-position-shifted readings)."""
  for name in interventions:
    interventions_lib.INTERVENTIONS.get(name)  # unknown names fail before any work
  if split not in run.bundle.splits:
    raise DiagnosisError(f"split {split!r} not in this run's data (have: "
                         f"{', '.join(run.bundle.splits)})")
  graphdef, params = nnx.split(analysis_model(run))
  key = jax.random.PRNGKey(seed)
  pooled: dict[str, list] = {}
  align = {"w": [], "gold": [], "tl": [], "sl": []}
  n_examples = n_exact = 0
  for b, batch in enumerate(run.bundle.batches(split)):
    if n_examples >= max_examples:
      break
    use = batch["example_id"] >= 0
    use &= np.cumsum(use) <= max_examples - n_examples
    n_examples += int(use.sum())
    if run.bundle.has_alignments and "alignments" in batch:
      _collect_reference(align, graphdef, params, batch, use)
    greedy, tokens = _greedy_output(run, graphdef, params, batch, use)
    analyze = jitted(analyze_batch, graphdef, interventions=tuple(interventions),
                     ig_steps=ig_steps)
    out = jax.device_get(analyze(params, greedy, jax.random.fold_in(key, b)))
    n_exact += _exact_matches(tokens, np.asarray(greedy["tgt_lengths"]), batch, use)
    _pool_steps(pooled, out, greedy, batch, use)
  if n_examples == 0:
    raise DiagnosisError(f"split {split!r} has no examples to diagnose")
  steps = {k: np.concatenate(v) for k, v in pooled.items()}
  n = steps["n_src"].astype(np.float64)
  with np.errstate(divide="ignore", invalid="ignore"):
    steps["normalized_entropy"] = np.where(n > 1, steps["entropy"] / np.log(n), np.nan)
  report = _report(run, split, seed, n_examples, n_exact / n_examples, steps, align,
                   interventions, ig_steps)
  return Diagnosis(report, steps)


def _collect_reference(align, graphdef, params, batch, use):
  """Appends the batch's teacher-forced attention along the reference (rows `use`) and its gold
  links to `align`."""
  ref = {k: jnp.asarray(batch[k]) for k in ("src", "src_lengths", "tgt", "tgt_lengths")}
  w_ref, heads_ref = jax.device_get(jitted(_reference_attention, graphdef)(params, ref))
  align["w"].append(w_ref[use])
  if heads_ref is not None:
    align.setdefault("heads", []).append(heads_ref[use])
  align["gold"].append(batch["alignments"][use])
  align["tl"].append(batch["tgt_lengths"][use])
  align["sl"].append(batch["src_lengths"][use])


def _greedy_output(run, graphdef, params, batch, use):
  """(the batch with its greedy output as the target, the decoded tokens [B, max_len]). The
  batch: src [B, Ts], src_lengths [B], tgt [B, T], tgt_lengths [B]; T is the longest output
  among the rows `use`, rounded up to a multiple of 8 (fewer shapes to jit)."""
  src, src_len = jnp.asarray(batch["src"]), jnp.asarray(batch["src_lengths"])
  max_len = run.tc.max_output_len(src.shape[1])
  dec = jitted(_greedy, run.task, graphdef, max_len=max_len)(params, src, src_len)
  tokens, lengths = np.asarray(dec.tokens), np.asarray(dec.lengths)
  T = min(_round_up(int(lengths[use].max(initial=1))), tokens.shape[1])
  return {"src": src, "src_lengths": src_len, "tgt": jnp.asarray(tokens[:, :T]),
          "tgt_lengths": jnp.asarray(lengths)}, tokens


def _exact_matches(tokens, lengths, batch, use) -> int:
  """How many rows `use` decoded exactly to their reference (tokens [B, T], lengths [B])."""
  n = 0
  for i in np.flatnonzero(use):
    tl, ref_len = int(lengths[i]), int(batch["tgt_lengths"][i])
    n += tl == ref_len and np.array_equal(tokens[i, :tl], batch["tgt"][i, :ref_len])
  return n


def _pool_steps(pooled, out, greedy, batch, use):
  """Appends the per-step measures of `out` at the valid output steps of the rows `use` (and each
  step's number of valid source tokens, n_src) to `pooled`."""
  lengths = np.asarray(greedy["tgt_lengths"])
  T = greedy["tgt"].shape[1]
  step_ok = use[:, None] & (np.arange(T)[None, :] < lengths[:, None])  # [B, T]
  n_src = np.broadcast_to(np.asarray(batch["src_lengths"])[:, None], step_ok.shape)
  for k, v in out.items():
    if v.ndim == 2 or k == "head_entropy":  # one value (or one per layer and head) per step
      pooled.setdefault(k, []).append(v[step_ok])
  pooled.setdefault("n_src", []).append(n_src[step_ok])


def _report(run, split, seed, n_examples, exact_match, steps, align, interventions,
            ig_steps) -> dict:
  """diagnose.json's content from the pooled per-step measures."""
  mc = run.mc
  report = {
      "workdir": run.workdir, "split": split, "n_examples": n_examples,
      "n_steps": int(steps["entropy"].size), "seed": seed,
      "model": {k: mc.variant[k] for k in ("decoder", "score", "normalizer", "temperature",
                                           "scope")},
      "greedy_exact_match": exact_match,
      "entropy": _entropy_summary(steps),
      "alignment": None,
      "attribution": {"method": "gradient_x_input",
                      "kendall_tau": tau_summary(steps["tau"], steps["n_src"]),
                      "top1_agreement": float(np.mean(steps["top1_agree"]))},
      "integrated_gradients": None,
      "counterfactual": {name: _cf_summary(steps, name) for name in interventions},
  }
  if ig_steps:
    report["integrated_gradients"] = {"steps": ig_steps, "baseline": "zero embedding",
                                      "kendall_tau": tau_summary(steps["tau_ig"], steps["n_src"])}
  if align["w"]:
    report["alignment"] = _alignment_pooled(align)
  if "head_entropy" in steps:
    report["heads"] = _heads_report(steps, align, interventions)
  return report


def _histogram(values, bins, range_):
  counts, edges = np.histogram(values, bins=bins, range=range_)
  return {"edges": [float(e) for e in edges], "counts": [int(c) for c in counts]}


def _entropy_summary(steps) -> dict:
  h, n = steps["entropy"], steps["n_src"]
  hn = steps["normalized_entropy"]
  hi = float(np.log(max(int(n.max()), 2)))
  return {"mean": float(h.mean()), "median": float(np.median(h)),
          "uniform_mean": float(np.mean(np.log(np.maximum(n, 1)))),  # log n: no preference at all
          "normalized_mean": float(np.nanmean(hn)) if np.isfinite(hn).any() else None,
          "histogram": _histogram(h, 20, (0.0, hi))}


def tau_summary(tau, n_src, min_tokens=3) -> dict:
  """Kendall tau over the steps with at least `min_tokens` valid source tokens and a defined tau."""
  long_enough = n_src >= min_tokens
  ok = long_enough & np.isfinite(tau)
  t = tau[ok]
  out = {"n_steps": int(ok.sum()), "n_skipped_short": int((~long_enough).sum()),
         "n_undefined": int((long_enough & ~np.isfinite(tau)).sum()), "min_tokens": min_tokens}
  if t.size:
    out.update(mean=float(t.mean()), median=float(np.median(t)),
               quantiles={str(q): float(np.quantile(t, q)) for q in (0.1, 0.25, 0.75, 0.9)},
               share_positive=float(np.mean(t > 0)),
               histogram=_histogram(t, 20, (-1.0, 1.0)))
  return out


def _cf_summary(steps, name) -> dict:
  tv, js, flip = steps[f"{name}/tv"], steps[f"{name}/js"], steps[f"{name}/flip"]
  return {"tv_mean": float(tv.mean()), "tv_median": float(np.median(tv)),
          "js_mean": float(js.mean()), "flip_rate": float(flip.mean()), "n_steps": int(tv.size)}


def _pad_concat(arrays):
  """[N_i, ..., Tt_i, Ts_i] arrays zero-padded on the last two axes and concatenated."""
  Tt = max(x.shape[-2] for x in arrays)
  Ts = max(x.shape[-1] for x in arrays)
  lead = lambda x: [(0, 0)] * (x.ndim - 2)
  return np.concatenate([np.pad(x, lead(x) + [(0, Tt - x.shape[-2]), (0, Ts - x.shape[-1])])
                         for x in arrays])


def _alignment_pooled(align) -> dict:
  return measures.alignment_report(_pad_concat(align["w"]), _pad_concat(align["gold"]),
                          np.concatenate(align["tl"]), np.concatenate(align["sl"]))


def _heads_report(steps, align, interventions) -> dict:
  """Per layer and head (nested lists [L][H]): mean entropy and entropy / log(n valid) over
  the greedy output's steps, and, with gold alignments, each head's and each layer's head
  average's `alignment_report` teacher-forced along the reference; per layer (more than one),
  each intervention applied in that layer alone: mean TV and argmax flip rate."""
  h = steps["head_entropy"]  # [N, L, H]
  n = steps["n_src"].astype(np.float64)[:, None, None]
  with np.errstate(divide="ignore", invalid="ignore"):
    hn = np.where(n > 1, h / np.log(n), np.nan)
  L, H = h.shape[1:]
  out = {"layers": L, "heads": H, "entropy_mean": h.mean(0).tolist(),
         "normalized_entropy_mean": np.nanmean(hn, 0).tolist() if np.isfinite(hn).any() else None,
         "alignment": None, "layer_average_alignment": None,
         "counterfactual_by_layer": None}
  if any(f"{name}/layer0/tv" in steps for name in interventions):
    out["counterfactual_by_layer"] = {
        name: [{"tv_mean": float(steps[f"{name}/layer{l}/tv"].mean()),
                "flip_rate": float(steps[f"{name}/layer{l}/flip"].mean())} for l in range(L)]
        for name in interventions}
  if align.get("heads"):
    w = _pad_concat(align["heads"])  # [N, L, H, Tt, Ts]
    g = _pad_concat(align["gold"])
    tl, sl = np.concatenate(align["tl"]), np.concatenate(align["sl"])
    out["alignment"] = [[measures.alignment_report(w[:, l, k], g, tl, sl) for k in range(H)]
                        for l in range(L)]
    out["layer_average_alignment"] = [measures.alignment_report(w[:, l].mean(1), g, tl, sl)
                                      for l in range(L)]
  return out

