"""Evaluation of a run: perplexity, decoding a split, scoring it through the task, alignment
quality against gold links, and the result files (predictions.txt, attention.npz, results.json,
attention.png)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attn.common import files
from attn.common.files import atomic_path
from attn.common.jitting import jitted
from attn.errors import ConfigError
from attn.evaluation import metrics as metrics_lib
from attn.models import count_params
from attn.training import distributed, dtype_choice

log = logging.getLogger(__name__)

# What the model reads from a batch (src_ext / tgt_ext: with data.extended_vocab only).
BATCH_KEYS = ("src", "src_lengths", "tgt", "tgt_lengths", "src_ext", "tgt_ext",
              "src_segments", "tgt_segments", "src_positions", "tgt_positions")  # packed rows


def device_batch(batch):
  """The arrays of a data batch that go to the device (ids and lengths, no example metadata)."""
  return {k: v for k, v in batch.items() if k in BATCH_KEYS}


def eval_step(task, graphdef, params, batch):
  """Summed NLL and token count of one batch (no dropout)."""
  _, ntok, nll = task.loss(nnx.merge(graphdef, params), batch)
  return nll, ntok


def decode_batch(task, graphdef, params, batch, *, max_len, search):
  """The task's decoding of one batch (`decode_inputs`): DecodeOutput with tokens
  [B, max_len] and attention weights [B, max_len, Ts]."""
  return task.decode(nnx.merge(graphdef, params), batch, max_len=max_len, search=search)


def decode_inputs(batch) -> dict:
  """The arrays of a data batch that decoding reads."""
  return {k: jnp.asarray(batch[k]) for k in ("src", "src_lengths", "src_ext") if k in batch}


def teacher_forced_attention(task, graphdef, params, batch):
  return task.attention(nnx.merge(graphdef, params), batch)


def params_view(run):
  """(graphdef, params state) of the model alone, for eval and decoding: a copy on this
  process's first device (evaluation runs on one device of every process, without collectives;
  see attn.training.distributed). Every process must call it (model-split leaves are gathered)."""
  nnx.update((run.model, run.optimizer), run.state)
  graphdef, params = nnx.split(run.model)
  return graphdef, distributed.local_copy(params)


@dataclasses.dataclass
class Outputs:
  """Decoded outputs of a split, by example_id: text, lengths and attention [Tt, Ts] per example
  (`scores`: the raw attention scores behind the weights, when asked for and formed; `heads`:
  a multi-head model's every layer and head [L, H, Tt, Ts], asked for like the scores, which
  are then the heads' [L, H, Tt, Ts]; `tokens`: the output ids [Tt], EOS included; `extras`:
  per-step values the model reports, e.g. p_gen)."""
  text: dict
  weights: dict
  src_lengths: dict
  src_labels: dict
  tgt_labels: dict
  scores: dict = dataclasses.field(default_factory=dict)
  heads: dict = dataclasses.field(default_factory=dict)
  tokens: dict = dataclasses.field(default_factory=dict)
  extras: dict = dataclasses.field(default_factory=dict)


def check_min_len(run, role, search, max_len: int, width: int) -> None:
  """ConfigError when no output of a batch of `role` with sources `width` tokens wide could end:
  the search's min_len (train.min_decode_len) is over the most tokens decoded for it."""
  longest = getattr(run.model, "longest_output", None)
  if longest is not None:
    max_len = min(max_len, longest)
  if search.min_len > max_len:
    tc = run.tc
    raise ConfigError(
        f"min_decode_len={search.min_len} is over the {max_len} tokens decoded for the {role} "
        f"split's sources of {width} tokens (train.max_decode_ratio={tc.max_decode_ratio:g} x "
        f"{width} + 10" + (f", train.max_decode_len={tc.max_decode_len}" if tc.max_decode_len
                           else "") + (f", the model's {longest} positions" if longest else "")
        + "): no output could end; lower it or raise train.max_decode_ratio")


def dispatch_split(run, role, *, search, max_sentences=None, params=None):
  """[(host batch, DecodeOutput on the device)] for `role` (or its first batches holding
  `max_sentences` examples), every batch dispatched before any output is waited for, so the
  device never idles while the host reads an earlier batch's outputs. params: the
  (graphdef, params) of `params_view(run)`, when the caller has them."""
  graphdef, params = params or params_view(run)
  out, seen = [], 0
  for batch in run.bundle.batches(role):
    max_len = run.tc.max_output_len(batch["src"].shape[1])
    check_min_len(run, role, search, max_len, batch["src"].shape[1])
    fn = jitted(decode_batch, run.task, graphdef, max_len=max_len, search=search)
    out.append((batch, fn(params, decode_inputs(batch))))
    seen += int(np.sum(batch["example_id"] >= 0))
    if max_sentences and seen >= max_sentences:
      break
  return out


def decode_split(run, role, *, search, max_sentences=None, with_scores=False) -> Outputs:
  """Decodes `role` (or its first `max_sentences` examples, in batch order).

  with_scores: also the raw attention scores of each output step, from teacher forcing the
  model along its own output (the decoder state is a function of the prefix, so this replays
  the steps the search took: the same queries, hence the same scores), and for a multi-head
  model every layer's and head's weights (`Outputs.heads`) from the same replay.
  """
  graphdef, params = params_view(run)
  src_vocab, task, bundle = run.bundle.src_vocab, run.task, run.bundle
  out = Outputs({}, {}, {}, {}, {})
  replay = jitted(teacher_forced_attention, task, graphdef)
  for batch, res in dispatch_split(run, role, search=search, max_sentences=max_sentences,
                                   params=(graphdef, params)):
    tokens, lengths, weights = map(np.asarray, (res.tokens, res.lengths, res.weights))
    extras = {k: np.asarray(v) for k, v in (res.extras or {}).items()}
    scores = heads = None
    if with_scores and run.mc.has_attention:
      forced = {"src": batch["src"], "src_lengths": batch["src_lengths"], "tgt": res.tokens,
                "tgt_lengths": res.lengths}
      if "src_ext" in batch:
        forced.update(src_ext=batch["src_ext"], tgt_ext=res.tokens)
      att = replay(params, forced)
      scores = None if att is None or att.scores is None else np.asarray(att.scores)
      heads = None if att is None or att.heads is None else np.asarray(att.heads)
    for i, ex in enumerate(batch["example_id"]):
      ex = int(ex)
      if ex < 0:
        continue  # padding rows of a partial batch
      ids = tokens[i][:lengths[i]]
      out.text[ex] = task.output_text(bundle, role, ex, tokens[i])
      out.tokens[ex] = ids
      out.extras[ex] = {k: v[i, :lengths[i]] for k, v in extras.items()}
      out.weights[ex] = weights[i, :lengths[i], :batch["src_lengths"][i]]
      out.src_lengths[ex] = int(batch["src_lengths"][i])
      # One label per attention column / row (EOS included; an output cut at max_len has none).
      out.src_labels[ex] = src_vocab.labels(batch["src"][i][:batch["src_lengths"][i]])
      out.tgt_labels[ex] = task.output_labels(bundle, role, ex, ids)
      if scores is not None:
        out.scores[ex] = scores[i][..., :lengths[i], :batch["src_lengths"][i]]
      if heads is not None:
        out.heads[ex] = heads[i][..., :lengths[i], :batch["src_lengths"][i]]
  return out


def score_outputs(run, role, hyps: Outputs) -> dict:
  return run.task.score(run.bundle, role, hyps.text, hyps.src_lengths)


def evaluate(run, role="eval", max_sentences=None) -> dict:
  """Perplexity over the split and the task's scores of greedy outputs of up to `max_sentences`."""
  graphdef, params = params_view(run)
  step = jitted(eval_step, run.task, graphdef)
  nll = ntok = 0.0
  for batch in run.bundle.batches(role):
    a, b = step(params, device_batch(batch))
    nll, ntok = nll + float(a), ntok + float(b)
  out = {"perplexity": float(np.exp(nll / max(ntok, 1.0))), "nll": nll / max(ntok, 1.0)}
  # Only the text is scored: no attention history is recorded.
  search = dataclasses.replace(run.tc.search().greedy(), attention=False)
  hyps = decode_split(run, role, search=search, max_sentences=max_sentences)
  out.update(score_outputs(run, role, hyps))
  return out


def alignment_scores(run, role="test") -> dict:
  """Teacher-forced attention against the gold alignments of a built-in task: AER of the argmax
  links and the attention mass on gold links, pooled over the split."""
  graphdef, params = params_view(run)
  forward = jitted(teacher_forced_attention, run.task, graphdef)
  preds, golds, tl, sl = [], [], [], []
  for batch in run.bundle.batches(role):
    att = forward(params, device_batch(batch))
    if att is None:
      return {}  # the fused kernel never forms the weights
    w = att.weights
    keep = batch["example_id"] >= 0
    preds.append(np.asarray(w)[keep])
    golds.append(batch["alignments"][keep])
    tl.append(batch["tgt_lengths"][keep])
    sl.append(batch["src_lengths"][keep])
  Tt = max(p.shape[1] for p in preds)
  Ts = max(p.shape[2] for p in preds)
  pad = lambda x: np.pad(x, ((0, 0), (0, Tt - x.shape[1]), (0, Ts - x.shape[2])))
  w, g = np.concatenate([pad(p) for p in preds]), np.concatenate([pad(x) for x in golds])
  tl, sl = np.concatenate(tl), np.concatenate(sl)
  return {"aer": metrics_lib.alignment_error_rate(
              w, g, tl, sl, skip_unaligned=run.task.aer_skips_unaligned),
          "attention_on_gold": metrics_lib.attention_on_gold(w, g, tl, sl)}


def renormalizes(weights, scores, normalizer, temperature, tol=1e-3) -> bool:
  """Whether `weights` [..., Tt, Ts] are normalizer(scores / temperature) over the finite scores: what
  a viewer re-normalizing the scores at another temperature assumes (false under local-p's
  Gaussian gain, or if the replayed steps drifted from the search's)."""
  from attn import core  # pylint: disable=import-outside-toplevel
  s = np.asarray(scores, np.float32)
  w = core.normalize(jnp.asarray(np.where(np.isfinite(s), s, 0.0)), jnp.asarray(np.isfinite(s)),
                     kind=normalizer, temperature=temperature)
  return bool(np.max(np.abs(np.asarray(w) - weights), initial=0.0) <= tol)


def write_attention(run, role, hyps: Outputs, sample) -> None:
  """attention.npz for the examples `sample` (ids): per example the weights of each output step
  `weights_{id}` [Tt, Ts], or [L, H, Tt, Ts] for a multi-head model (every layer's and head's
  cross-attention, `Outputs.heads`), the raw scores `scores_{id}` of the same shape
  (-inf = not attendable; only when the weights re-normalize from them, see `renormalizes`),
  the token labels
  `src_tokens_{id}` [Ts] and `tgt_tokens_{id}` [Tt]; per sample `example_ids`, `sources`,
  `predictions`, `references`; and the run's `decoder`, `score`, `normalizer`, `scope` and
  `temperature`; and whatever arrays the task adds (`Task.attention_arrays`: a caption run's
  `image_{id}` and `regions_{id}`). Rows are output tokens (EOS included), columns source
  tokens (EOS included) or the regions of an image."""
  v = run.mc.variant
  multi = bool(sample) and all(i in hyps.heads for i in sample)
  weights = hyps.heads if multi else hyps.weights
  with_scores = all(i in hyps.scores and renormalizes(
      weights[i], hyps.scores[i], v["normalizer"], v["temperature"]) for i in sample)
  if run.mc.has_attention and hyps.scores and not with_scores:
    log.warning("attention.npz: the weights are not normalizer(scores / temperature) for this "
                f"variant (scope {v['scope']!r}), so no raw scores are stored")
  sources, refs = run.bundle.sources(role), run.bundle.references(role)
  arrays = {}
  for i in sample:
    arrays[f"weights_{i}"] = weights[i]
    arrays[f"src_tokens_{i}"] = np.array(hyps.src_labels[i], dtype=str)
    arrays[f"tgt_tokens_{i}"] = np.array(hyps.tgt_labels[i], dtype=str)
    if with_scores:
      arrays[f"scores_{i}"] = hyps.scores[i]
  arrays.update(run.task.attention_arrays(run.bundle, role, sample))
  with atomic_path(os.path.join(run.workdir, "attention.npz"), suffix=".npz") as tmp:
    np.savez_compressed(
        tmp, **arrays, example_ids=np.array(sample, dtype=np.int64),
        sources=np.array([sources[i] for i in sample]),
        predictions=np.array([hyps.text[i] for i in sample]),
        references=np.array([refs[i] for i in sample]),
        decoder=v["decoder"], score=v["score"], normalizer=v["normalizer"], scope=v["scope"],
        temperature=np.float32(v["temperature"]))


def eval_seconds(workdir) -> float:
  """Seconds the run spent in its evaluations during training, over every resume: the sum of
  metrics.jsonl's eval rows' `eval_s` (training time, `wall_s`, leaves them out)."""
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return 0.0
  total = 0.0
  with open(path) as f:
    for line in f:
      try:
        row = json.loads(line)
      except ValueError:
        continue  # a line cut short by a killed process
      if row.get("split") == "eval":
        total += float(row.get("eval_s", 0.0))
  return total


def write_results(run, ckpt, role="test") -> dict:
  """Decodes `role` with the best checkpoint (else the last) and writes the result files;
  results.json comes last, so its presence means every other file is complete. Every process
  decodes (the same outputs); process 0 alone writes, and every process returns the results."""
  # The counters of the whole run, not those stored with the best checkpoint: results report
  # how long the run trained, whichever step decodes.
  whole = run.progress
  if "eval" in run.bundle.splits and ckpt.best.latest_step() is not None:
    ckpt.restore(ckpt.best, run)
    log.info(f"restored best checkpoint (step {run.progress.step}, eval "
             + ", ".join(f"{v:.3f}" for v in run.progress.best_score) + ")")
  best_step = run.progress.step
  run.progress = p = dataclasses.replace(run.progress, step=whole.step, wall_s=whole.wall_s,
                                         train_tokens=whole.train_tokens)
  if role not in run.bundle.splits:
    role = "eval"
  t0 = time.time()
  hyps = decode_split(run, role, search=run.tc.search(), with_scores=True)
  decode_s = time.time() - t0
  scores = score_outputs(run, role, hyps)
  scores.update(run.task.analysis(run.bundle, role, hyps))
  if run.bundle.has_alignments and run.mc.has_attention:
    scores.update(alignment_scores(run, role))
  if run.tc.beam_size > 1:  # the greedy figure too, for comparison with beam search
    greedy = score_outputs(run, role, decode_split(run, role, search=run.tc.search().greedy()))
    scores.update({f"{k}_greedy": v for k, v in greedy.items() if isinstance(v, float)})
  ids = sorted(hyps.text)
  sample = ids[:run.tc.attention_samples]
  primary = distributed.is_primary()
  if primary:
    files.write_text(os.path.join(run.workdir, "predictions.txt"),
                           "".join(hyps.text[i] + "\n" for i in ids))
    write_attention(run, role, hyps, sample)
  if primary and run.mc.has_attention and sample:
    from attn.common import plots  # pylint: disable=import-outside-toplevel
    i = max(sample, key=lambda j: hyps.src_lengths[j])  # the longest sampled source
    plots.heatmap(hyps.weights[i], hyps.src_labels[i], hyps.tgt_labels[i],
                os.path.join(run.workdir, "attention.png"),
                title=f"{run.mc.variant['decoder']}/{run.mc.variant['score']}: example {i}")
  results = {
      "split": role, **scores, "params": count_params(run.model), "step": p.step,
      "best_step": best_step, "tokens_per_sec": p.train_tokens / max(p.wall_s, 1e-9),
      "wall_s": p.wall_s, "decode_s": decode_s, "beam_size": run.tc.beam_size,
      "eval_s": eval_seconds(run.workdir),
      **{k: run.mc.variant[k] for k in ("decoder", "score", "normalizer")},
      "model_config": run.mc.record(),
  }
  if p.window_rates:  # (none when this process only decoded a run that had finished training)
    # steady state: median over logging windows, the first (compilation) left out
    results["tokens_per_sec_steady"] = float(np.median(p.window_rates[1:] or p.window_rates))
  if p.best_eval:
    results["best_eval"] = p.best_eval  # the eval that chose the decoded checkpoint
  results.update(dtype_choice.figures(run))  # the compute dtype that ran, and what chose it
  if primary:
    files.write_json(os.path.join(run.workdir, "results.json"), results)
  return results
