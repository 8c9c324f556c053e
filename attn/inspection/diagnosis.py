r"""Can attention weights be read as an explanation? Measures for a trained seq2seq model.

Jain & Wallace (2019, "Attention is not Explanation") ask two questions of attention weights:
do they agree with other measures of feature importance (gradients), and does the output change
when they are replaced (permuted, made uniform)? Wiegreffe & Pinter (2019, "Attention is not not
Explanation") add that an explanation must be tested against the model's own behaviour, not
read off a heatmap. This module measures both for a finished run (`diagnose`), plus a check
that exposes a common misreading: an RNNsearch decoder (Bahdanau et al. 2015) scores the
source with the *previous* state s_{t-1}, so its attention can sit one target position off the
gold link while decoding perfectly (`shifted_gold`).

Axis names: B batch, Tt target (output) steps, Ts source tokens, E source embedding, V vocabulary.

Per-step measures (pure, jit-clean, batched):
- `entropy(weights, mask)` [B, Tt]: nats over the valid source positions.
- `kendall_tau(x, y, mask)` [...]: Kendall tau-b (ties handled as scipy's default) between two
  scores over the valid positions, NaN where undefined.
- `gradient_x_input(model, batch)` [B, Tt, Ts]: <d log p(y_t) / d x_s, x_s> per source token.
- `integrated_gradients(model, batch, steps)` [B, Tt, Ts]: the same path-integrated from a zero
  embedding (Sundararajan et al. 2017), optional (`--ig_steps`).
- `output_divergences(logits, logits_cf)`: total variation, Jensen-Shannon divergence (nats,
  at most log 2) and whether the argmax token flips, per step.
- interventions (`INTERVENTIONS`): `identity`, `permute`, `uniform`, `zero_top`, each a factory
  `make(key) -> intervene(weights [..., 1, Ts], mask [..., 1, Ts] bool, draw) -> weights'` for
  the models' `counterfactual` (`Seq2Seq`: one attention per step, draw = t; `Transformer`:
  every layer's and head's cross-attention row at step t, [B, H, 1, Ts], a draw per layer).

A multi-head model (the Transformer) is read two ways: its `weights` (the alignment layer's
head average, attn.models.transformer.ALIGNMENT_LAYER) go through every measure above, and its
`heads` [B, L, H, Tt, Ts] get entropy and the gold-alignment scores per layer and head.

Attribution and counterfactuals are evaluated along the model's own greedy output (decode, then
teacher-force along it): the token whose probability is explained is the one the model chose.
Alignment scores are teacher-forced along the reference, as `evaluation.alignment_scores`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attn.evaluation import metrics as metrics_lib
from attn import registry
from attn.errors import AttnError


class DiagnosisError(AttnError, ValueError):
  """A run the diagnosis cannot read attention from (a decoder without attention, a variant
  that never forms the weights, an empty split)."""


# ----------------------------------------------------------------------------- per-step measures

def entropy(weights, mask):
  """Shannon entropy in nats of each attention distribution over its valid source positions.

  weights: [..., Ts] (rows sum to 1 over the valid positions); mask: [..., Ts] bool, True =
  valid. Returns [...] in float32 (float64 for float64 input); 0 log 0 = 0, so a one-hot row
  gives 0, a uniform row over n valid positions log n, a row without valid positions 0.
  """
  w = jnp.asarray(weights)
  w = w.astype(jnp.promote_types(w.dtype, jnp.float32))
  keep = jnp.asarray(mask) & (w > 0)
  return -jnp.sum(jnp.where(keep, w * jnp.log(jnp.where(keep, w, 1.0)), 0.0), axis=-1)


def kendall_tau(x, y, mask):
  """Kendall's tau-b between x and y over the positions where `mask` is True.

  x, y: [..., N]; mask: [..., N] bool. Returns [...] float32 (float64 for float64 input):
  tau_b = sum_{i<j} sign(x_i - x_j) sign(y_i - y_j) / sqrt(n_x n_y), n_x (n_y) the number of
  valid pairs not tied in x (y), which equals scipy.stats.kendalltau's default (variant 'b',
  (P - Q) / sqrt((P + Q + T)(P + Q + U))). NaN where undefined: fewer than 2 valid positions or
  a constant x or y. O(N^2) memory per row.
  """
  x, y = jnp.asarray(x), jnp.asarray(y)
  dt = jnp.promote_types(jnp.promote_types(x.dtype, y.dtype), jnp.float32)
  x, y = x.astype(dt), y.astype(dt)
  m = jnp.asarray(mask)
  pair = m[..., :, None] & m[..., None, :]                        # [..., N, N]
  pair = pair & (jnp.arange(x.shape[-1])[:, None] < jnp.arange(x.shape[-1])[None, :])  # i < j
  sx = jnp.where(pair, jnp.sign(x[..., :, None] - x[..., None, :]), 0)  # [..., N, N]
  sy = jnp.where(pair, jnp.sign(y[..., :, None] - y[..., None, :]), 0)
  num = jnp.sum(sx * sy, axis=(-2, -1))
  den = jnp.sqrt(jnp.sum(jnp.abs(sx), axis=(-2, -1)) * jnp.sum(jnp.abs(sy), axis=(-2, -1)))
  return jnp.where(den > 0, num / jnp.where(den > 0, den, 1), jnp.nan)


def output_divergences(logits, logits_cf):
  """How far the counterfactual output distribution is from the real one, per step.

  logits, logits_cf: [..., V]. Returns (tv, js, flipped), each [...]: total variation
  1/2 sum |p - q| in [0, 1]; Jensen-Shannon divergence 1/2 KL(p || m) + 1/2 KL(q || m),
  m = (p + q) / 2, in nats, in [0, log 2]; flipped: argmax p != argmax q (bool). Float32.
  """
  lp = jax.nn.log_softmax(jnp.asarray(logits, jnp.float32))
  lq = jax.nn.log_softmax(jnp.asarray(logits_cf, jnp.float32))
  p, q = jnp.exp(lp), jnp.exp(lq)
  tv = 0.5 * jnp.sum(jnp.abs(p - q), axis=-1)
  m = 0.5 * (p + q)
  # log of the probabilities themselves (not the log-softmax), so p == q gives exactly 0
  log = lambda a: jnp.log(jnp.where(a > 0, a, 1.0))
  kl = lambda a: jnp.sum(jnp.where(a > 0, a * (log(a) - log(m)), 0.0), axis=-1)
  js = jnp.maximum(0.5 * kl(p) + 0.5 * kl(q), 0.0)  # rounding can go a hair below 0
  return tv, js, jnp.argmax(lp, -1) != jnp.argmax(lq, -1)


def _token_log_probs(model, batch, embed_offset):
  """log p(y_t = batch["tgt"][b, t]) teacher-forced along batch["tgt"]: [B, Tt] float32."""
  logits, _ = model.attention(batch, embed_offset=embed_offset)  # [B, Tt, V]
  lp = jax.nn.log_softmax(logits.astype(jnp.float32))
  return jnp.take_along_axis(lp, batch["tgt"][..., None], axis=-1)[..., 0]


def _step_gradients(model, batch, embed_offset):
  """d log p(y_t) / d x for every step at once: [B, Tt, Ts, E] (embed_offset: [B, Ts, E], the
  point x + offset where the gradient is taken). Rows of the batch are independent, so the
  gradient of the batch sum of step t is each row's own gradient; the Tt backward passes are
  one vmapped pass over one-hot cotangents (the forward does not depend on them, so vmap runs it
  once). nnx.grad / nnx.vmap rather than jax.grad: the encoder's RNNs draw their initial carry
  from an nnx RNG counter, which nnx refuses to update inside a plain jax transform."""
  Tt = batch["tgt"].shape[1]

  def step_grad(onehot, m):  # onehot: [Tt] -> [B, Ts, E]
    f = lambda off, m: jnp.sum(_token_log_probs(m, batch, off).sum(0) * onehot)
    return nnx.grad(f, argnums=0)(embed_offset, m)

  jac = nnx.vmap(step_grad, in_axes=(0, None))(jnp.eye(Tt, dtype=jnp.float32), model)
  return jnp.moveaxis(jac, 0, 1)  # [Tt, B, Ts, E] -> [B, Tt, Ts, E]


def _source_mask(batch):
  return jnp.arange(batch["src"].shape[1])[None, :] < batch["src_lengths"][:, None]  # [B, Ts]


def gradient_x_input(model, batch):
  """Gradient x input attribution of each output step to each source token.

  model: a Seq2Seq; batch: src [B, Ts], src_lengths [B], tgt [B, Tt], tgt_lengths [B] (the
  tokens whose log-probability is explained: pass the model's own output to explain its
  decisions). Returns [B, Tt, Ts] float32: a[b, t, s] = <d log p(tgt[b, t] | tgt[b, :t], src) /
  d x[b, s], x[b, s]>, x = the source embeddings [B, Ts, E]; 0 at padded source positions. Steps
  past tgt_lengths are computed like the others (mask them yourself).
  """
  x = model.encoder.embed(batch["src"]).astype(jnp.float32)  # [B, Ts, E]
  grads = _step_gradients(model, batch, jnp.zeros_like(x))     # [B, Tt, Ts, E]
  a = jnp.einsum("btse,bse->bts", grads, x)                    # [B, Tt, Ts]
  return jnp.where(_source_mask(batch)[:, None, :], a, 0.0)


def integrated_gradients(model, batch, steps: int = 16):
  """Integrated gradients (Sundararajan et al. 2017) from the all-zero source embedding.

  Same inputs and output layout as `gradient_x_input` ([B, Tt, Ts] float32), with the gradient
  averaged over `steps` midpoints alpha = (k + 1/2) / steps of the path alpha x (Riemann
  midpoint rule). Completeness: the sum over s approaches log p(y_t | x) - log p(y_t | 0) as
  steps grows. Costs `steps` times `gradient_x_input` in time, its memory once.
  """
  x = model.encoder.embed(batch["src"]).astype(jnp.float32)  # [B, Ts, E]
  alphas = (jnp.arange(steps, dtype=jnp.float32) + 0.5) / steps
  graphdef, state = nnx.split(model)

  def body(carry, alpha):  # one alpha at a time: memory of one gradient_x_input, not `steps`
    total, state = carry  # the state rides in the carry so nnx sees it at the scan's trace level
    g = _step_gradients(nnx.merge(graphdef, state), batch, (alpha - 1.0) * x)  # at alpha x
    return (total + g, state), None

  B, Ts, E = x.shape
  zeros = jnp.zeros((B, batch["tgt"].shape[1], Ts, E), jnp.float32)
  (total, _), _ = jax.lax.scan(body, (zeros, state), alphas)  # [B, Tt, Ts, E]
  a = jnp.einsum("btse,bse->bts", total / steps, x)
  return jnp.where(_source_mask(batch)[:, None, :], a, 0.0)


# ----------------------------------------------------------------------------- interventions

# name -> factory(key) -> intervene(weights [B, 1, Ts], mask [B, 1, Ts], t) -> weights [B, 1, Ts].
# (A local table: attn.registry's kinds are fixed; the same refuse-duplicates rule applies.)
INTERVENTIONS: dict[str, Callable] = {}


def register_intervention(name: str):
  def decorator(make):
    if name in INTERVENTIONS:
      raise ValueError(f"intervention {name!r} is already registered")
    INTERVENTIONS[name] = make
    return make
  return decorator


def get_intervention(name: str, key=None):
  """The intervene function `name` (seeded with `key` where it draws randomness)."""
  if name not in INTERVENTIONS:
    raise DiagnosisError(f"unknown intervention {name!r}; known: "
                         f"{', '.join(sorted(INTERVENTIONS))}")
  return INTERVENTIONS[name](jax.random.PRNGKey(0) if key is None else key)


@register_intervention("identity")
def identity(key):
  """The real weights (a control: the counterfactual output must equal the real one)."""
  del key
  return lambda weights, mask, t: weights


@register_intervention("permute")
def permute(key):
  """The weights randomly permuted over the valid source positions (Jain & Wallace 2019 sec. 4):
  the same multiset of weights, masked positions kept at 0. One permutation per row and step,
  drawn from fold_in(key, t)."""

  def intervene(weights, mask, t):
    u = jax.random.uniform(jax.random.fold_in(key, t), weights.shape)
    order = jnp.argsort(jnp.where(mask, u, jnp.inf), axis=-1)  # valid positions, shuffled, first
    rank = jnp.cumsum(mask, axis=-1) - 1                         # a valid position's rank
    src = jnp.take_along_axis(order, jnp.maximum(rank, 0), axis=-1)  # where its weight comes from
    return jnp.where(mask, jnp.take_along_axis(weights, src, axis=-1), 0.0).astype(weights.dtype)

  return intervene


@register_intervention("uniform")
def uniform(key):
  """Uniform weights 1/n over the n valid source positions (0 where masked)."""
  del key

  def intervene(weights, mask, t):
    n = jnp.sum(mask, axis=-1, keepdims=True)
    return jnp.where(mask, 1.0 / jnp.maximum(n, 1), 0.0).astype(weights.dtype)

  return intervene


@register_intervention("zero_top")
def zero_top(key):
  """The top-weighted valid position set to 0 and the rest renormalized to sum 1. If the rest
  carries no mass, uniform over the other valid positions; with one valid position, all 0 (the
  context is then zero)."""
  del key

  def intervene(weights, mask, t):
    top = jax.nn.one_hot(jnp.argmax(jnp.where(mask, weights, -jnp.inf), axis=-1),
                         weights.shape[-1], dtype=bool)  # [B, 1, Ts]
    keep = mask & ~top
    rest = jnp.where(keep, weights, 0.0)
    total = jnp.sum(rest, axis=-1, keepdims=True)
    n = jnp.sum(keep, axis=-1, keepdims=True)
    fallback = jnp.where(keep, 1.0 / jnp.maximum(n, 1), 0.0)
    return jnp.where(total > 0, rest / jnp.where(total > 0, total, 1.0), fallback).astype(
        weights.dtype)

  return intervene


DEFAULT_INTERVENTIONS = ("permute", "uniform", "zero_top")


# ----------------------------------------------------------------------------- gold alignments

def shifted_gold(gold, tgt_lengths, src_lengths, shift: int, axis: str = "target"):
  """Gold links moved by `shift` positions, to test an off-by-one reading of the attention.

  gold: [B, Tt, Ts]; tgt_lengths, src_lengths: [B]. axis="target": row t takes the links of
  target token t + shift (shift=-1: "step t attends to the source of the token just emitted");
  axis="source": every link (t, s) moves to (t, s + shift) (shift=+1: "one source position right
  of the gold one"). On a reversal the two readings coincide: target-1 = source+1. Links moved
  outside the valid region are dropped (those rows count as unaligned). Returns [B, Tt, Ts]
  numpy float32.
  """
  if axis not in ("target", "source"):
    raise ValueError(f"axis must be 'target' or 'source', got {axis!r}")
  gold = np.asarray(gold, np.float32)
  B, Tt, Ts = gold.shape
  if axis == "target":
    ax, n, lengths, idx = 1, Tt, tgt_lengths, np.arange(Tt) + shift  # row t reads row t + shift
  else:
    ax, n, lengths, idx = 2, Ts, src_lengths, np.arange(Ts) - shift  # column s reads s - shift
  ok = (idx[None, :] >= 0) & (idx[None, :] < np.asarray(lengths)[:, None])  # [B, n]
  moved = np.take(gold, np.clip(idx, 0, n - 1), axis=ax)
  return np.where(np.expand_dims(ok, 2 if ax == 1 else 1), moved, 0.0).astype(np.float32)


def alignment_report(weights, gold, tgt_lengths, src_lengths) -> dict:
  """AER and attention-on-gold of teacher-forced weights [B, Tt, Ts] against gold, and the same
  against the gold shifted one position along the target and the source (`shifted_gold`)."""
  out = {"aer": metrics_lib.alignment_error_rate(weights, gold, tgt_lengths, src_lengths),
         "attention_on_gold": metrics_lib.attention_on_gold(weights, gold, tgt_lengths,
                                                            src_lengths),
         "shifted": {}}
  for axis in ("target", "source"):
    for shift in (-1, 1):
      g = shifted_gold(gold, tgt_lengths, src_lengths, shift, axis)
      if not (g > 0).any():
        continue
      out["shifted"][f"{axis}{shift:+d}"] = {
          "aer": metrics_lib.alignment_error_rate(weights, g, tgt_lengths, src_lengths),
          "attention_on_gold": metrics_lib.attention_on_gold(weights, g, tgt_lengths,
                                                             src_lengths)}
  return out


# ----------------------------------------------------------------------------- a run

def analyze_batch(graphdef, params, batch, key, *, interventions=DEFAULT_INTERVENTIONS,
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
  mask = jnp.broadcast_to(_source_mask(batch)[:, None, :], w.shape)  # [B, Tt, Ts]
  gxi = gradient_x_input(model, batch)
  out = {"weights": w, "entropy": entropy(w, mask), "gxi": gxi,
         "tau": kendall_tau(w, jnp.abs(gxi), mask),
         "top1_agree": jnp.argmax(jnp.where(mask, w, -1), -1)
         == jnp.argmax(jnp.where(mask, jnp.abs(gxi), -1), -1)}
  if att.heads is not None:  # [B, L, H, Tt, Ts] -> [B, Tt, L, H]: one row per output step
    out["head_entropy"] = jnp.moveaxis(entropy(att.heads, mask[:, None, None]), -1, 1)
  if ig_steps:
    ig = integrated_gradients(model, batch, ig_steps)
    out.update(ig=ig, tau_ig=kendall_tau(w, jnp.abs(ig), mask))
  for i, name in enumerate(interventions):
    fn = get_intervention(name, jax.random.fold_in(key, i))
    real, cf, _ = model.counterfactual(batch, fn)
    tv, js, flip = output_divergences(real, cf)
    out.update({f"{name}/tv": tv, f"{name}/js": js, f"{name}/flip": flip})
  L = 0 if att.heads is None else att.heads.shape[1]
  for layer in range(L if L > 1 else 0):  # which layer's reading the output depends on
    for i, name in enumerate(interventions):
      fn = get_intervention(name, jax.random.fold_in(key, i))
      real, cf, _ = model.counterfactual(batch, fn, layers=(layer,))
      tv, _, flip = output_divergences(real, cf)
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


@functools.lru_cache(maxsize=None)
def _jit(fn, *bound, **static):
  return jax.jit(functools.partial(fn, *bound, **static))


def analysis_model(run):
  """run.model, or for a fused model (which never forms the weights) the same parameters in the
  unfused variant. Raises DiagnosisError for a decoder without attention or a scope that never
  forms weights (linear attention)."""
  mc = run.mc
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


def _round_up(n: int, k: int = 8) -> int:
  return -(-n // k) * k


@dataclasses.dataclass
class Diagnosis:
  """`report`: the JSON summary (diagnose.json). `steps`: pooled per-step numpy arrays of the
  valid output steps (entropy, normalized_entropy, tau, ..., `{intervention}/tv`) for plots."""
  report: dict
  steps: dict


def diagnose(run, *, split="test", max_examples=200, seed=0,
             interventions=DEFAULT_INTERVENTIONS, ig_steps=0) -> Diagnosis:
  """Diagnoses the attention of a loaded run (`attn.training.load_run`) on the first
  `max_examples` examples of `split` (batch order): greedy-decodes them, then measures entropy,
  gradient x input agreement (Kendall tau) and the counterfactual interventions along the
  greedy output, and, where the task has gold alignments, AER / attention-on-gold teacher-forced
  along the reference (with the one-position-shifted readings)."""
  for name in interventions:
    get_intervention(name)  # unknown names fail before any work
  if split not in run.bundle.splits:
    raise DiagnosisError(f"split {split!r} not in this run's data (have: "
                         f"{', '.join(run.bundle.splits)})")
  model = analysis_model(run)
  graphdef, params = nnx.split(model)
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
    src, src_len = jnp.asarray(batch["src"]), jnp.asarray(batch["src_lengths"])
    if run.bundle.has_alignments and "alignments" in batch:
      ref = {k: jnp.asarray(batch[k]) for k in ("src", "src_lengths", "tgt", "tgt_lengths")}
      w_ref, heads_ref = jax.device_get(_jit(_reference_attention, graphdef)(params, ref))
      align["w"].append(w_ref[use])
      if heads_ref is not None:
        align.setdefault("heads", []).append(heads_ref[use])
      align["gold"].append(batch["alignments"][use])
      align["tl"].append(batch["tgt_lengths"][use])
      align["sl"].append(batch["src_lengths"][use])
    max_len = run.tc.max_output_len(src.shape[1])
    dec = _jit(_greedy, run.task, graphdef, max_len=max_len)(params, src, src_len)
    tokens, lengths = np.asarray(dec.tokens), np.asarray(dec.lengths)
    T = min(_round_up(int(lengths[use].max(initial=1))), tokens.shape[1])  # fewer shapes to jit
    greedy = {"src": src, "src_lengths": src_len, "tgt": jnp.asarray(tokens[:, :T]),
              "tgt_lengths": jnp.asarray(lengths)}
    analyze = _jit(analyze_batch, graphdef, interventions=tuple(interventions), ig_steps=ig_steps)
    out = jax.device_get(analyze(params, greedy, jax.random.fold_in(key, b)))
    for i in np.flatnonzero(use):
      tl, ref_len = int(lengths[i]), int(batch["tgt_lengths"][i])
      n_exact += tl == ref_len and np.array_equal(tokens[i, :tl], batch["tgt"][i, :ref_len])
    step_ok = use[:, None] & (np.arange(T)[None, :] < lengths[:, None])  # [B, T]
    n_src = np.broadcast_to(np.asarray(batch["src_lengths"])[:, None], step_ok.shape)
    for k, v in out.items():
      if v.ndim == 2 or k == "head_entropy":  # one value (or one per layer and head) per step
        pooled.setdefault(k, []).append(v[step_ok])
    pooled.setdefault("n_src", []).append(n_src[step_ok])
  if n_examples == 0:
    raise DiagnosisError(f"split {split!r} has no examples to diagnose")
  steps = {k: np.concatenate(v) for k, v in pooled.items()}
  n = steps["n_src"].astype(np.float64)
  with np.errstate(divide="ignore", invalid="ignore"):
    steps["normalized_entropy"] = np.where(n > 1, steps["entropy"] / np.log(n), np.nan)
  mc = run.mc
  report = {
      "workdir": run.workdir, "split": split, "n_examples": n_examples,
      "n_steps": int(steps["entropy"].size), "seed": seed,
      "model": {k: mc.variant[k] for k in ("decoder", "score", "normalizer", "temperature",
                                           "scope")},
      "greedy_exact_match": n_exact / n_examples,
      "entropy": _entropy_summary(steps),
      "alignment": None,
      "attribution": {"method": "gradient_x_input",
                      "kendall_tau": _tau_summary(steps["tau"], steps["n_src"]),
                      "top1_agreement": float(np.mean(steps["top1_agree"]))},
      "integrated_gradients": None,
      "counterfactual": {name: _cf_summary(steps, name) for name in interventions},
  }
  if ig_steps:
    report["integrated_gradients"] = {"steps": ig_steps, "baseline": "zero embedding",
                                      "kendall_tau": _tau_summary(steps["tau_ig"], steps["n_src"])}
  if align["w"]:
    report["alignment"] = _alignment_pooled(align)
  if "head_entropy" in steps:
    report["heads"] = _heads_report(steps, align, interventions)
  return Diagnosis(report, steps)


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


def _tau_summary(tau, n_src, min_tokens=3) -> dict:
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
  return alignment_report(_pad_concat(align["w"]), _pad_concat(align["gold"]),
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
    out["alignment"] = [[alignment_report(w[:, l, k], g, tl, sl) for k in range(H)]
                        for l in range(L)]
    out["layer_average_alignment"] = [alignment_report(w[:, l].mean(1), g, tl, sl)
                                      for l in range(L)]
  return out


# ----------------------------------------------------------------------------- outputs

PLOTS = ("diagnose_entropy.png", "diagnose_tau.png", "diagnose_counterfactual.png")
HEADS_PLOT = "diagnose_heads.png"  # multi-head models only


def format_table(report) -> str:
  """A short plain-text summary of a diagnose report."""
  m = report["model"]
  lines = [f"{m['decoder']}/{m['score']}/{m['normalizer']} on {report['split']}: "
           f"{report['n_examples']} examples, {report['n_steps']} output steps, "
           f"greedy exact match {report['greedy_exact_match']:.3f}",
           f"entropy (nats): mean {report['entropy']['mean']:.3f}, median "
           f"{report['entropy']['median']:.3f} (uniform would be "
           f"{report['entropy']['uniform_mean']:.3f})"]
  al = report.get("alignment")
  if al:
    shifted = ", ".join(f"{k} {v['attention_on_gold']:.3f}" for k, v in al["shifted"].items())
    lines.append(f"alignment (teacher-forced on the reference): AER {al['aer']:.3f}, "
                 f"attention on gold {al['attention_on_gold']:.3f}; on gold shifted by one: "
                 + shifted)
  for key, title in (("attribution", "gradient x input"),
                     ("integrated_gradients", "integrated gradients")):
    sec = report.get(key)
    if sec and "mean" in sec["kendall_tau"]:
      kt = sec["kendall_tau"]
      lines.append(f"Kendall tau(attention, |{title}|): mean {kt['mean']:.3f}, median "
                   f"{kt['median']:.3f} over {kt['n_steps']} steps"
                   + (f", top-1 agreement {sec['top1_agreement']:.3f}"
                      if "top1_agreement" in sec else ""))
  heads = report.get("heads")
  if heads:
    lines += ["", "per layer and head (greedy output: mean entropy in nats"
              + ("; teacher-forced on the reference: attention on gold, and on gold one target "
                 "position back" if heads["alignment"] else "") + "):"]
    for l in range(heads["layers"]):
      cells = []
      for k in range(heads["heads"]):
        cell = f"h{k + 1} {heads['entropy_mean'][l][k]:.2f}"
        if heads["alignment"]:
          a = heads["alignment"][l][k]
          back = a["shifted"].get("target-1")
          cell += f" / {a['attention_on_gold']:.2f}" + (
              f" / {back['attention_on_gold']:.2f}" if back else "")
        cells.append(cell)
      if heads["layer_average_alignment"]:
        avg = heads["layer_average_alignment"][l]
        cells.append(f"average: AER {avg['aer']:.3f}, on gold {avg['attention_on_gold']:.3f}")
      lines.append(f"  layer {l + 1}: " + "; ".join(cells))
    for name, rows in (heads["counterfactual_by_layer"] or {}).items():
      lines.append(f"  {name} in one layer alone, mean TV (flips): " + ", ".join(
          f"layer {l + 1} {r['tv_mean']:.3f} ({r['flip_rate']:.3f})" for l, r in enumerate(rows)))
  lines += ["", "| intervention | mean TV | median TV | mean JS (nats) | argmax flips |",
            "|---|---|---|---|---|"]
  for name, r in report["counterfactual"].items():
    lines.append(f"| {name} | {r['tv_mean']:.3f} | {r['tv_median']:.3f} | {r['js_mean']:.4g} | "
                 f"{r['flip_rate']:.3f} |")
  return "\n".join(lines)


def plot(diag: Diagnosis, directory) -> list[str]:
  """Writes the three PLOTS (and HEADS_PLOT for a multi-head model) into `directory`; returns
  their paths."""
  from attn.inspection import plots as viz  # pylint: disable=import-outside-toplevel
  plt = viz.pyplot()
  s, r = diag.steps, diag.report
  title = f"{r['model']['decoder']}/{r['model']['score']}"
  paths = [os.path.join(directory, p) for p in PLOTS]

  fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
  hi = float(np.log(max(int(s["n_src"].max()), 2)))
  axes[0].hist(s["entropy"], bins=30, range=(0, hi), color="0.3")
  axes[0].axvline(r["entropy"]["uniform_mean"], color="C3", ls="--", label="uniform (mean log n)")
  axes[0].set(xlabel="attention entropy (nats)", ylabel="output steps", title=title)
  axes[0].legend(fontsize=7)
  hn = s["normalized_entropy"]
  axes[1].hist(hn[np.isfinite(hn)], bins=30, range=(0, 1), color="0.3")
  axes[1].set(xlabel="entropy / log(n valid)", title="normalized (0 = one-hot, 1 = uniform)")
  fig.tight_layout()
  fig.savefig(paths[0], dpi=110)
  plt.close(fig)

  fig, ax = plt.subplots(figsize=(5, 3.2))
  ok = (s["n_src"] >= 3) & np.isfinite(s["tau"])
  ax.hist(s["tau"][ok], bins=40, range=(-1, 1), color="0.3", label="gradient x input")
  if "tau_ig" in s:
    ok_ig = (s["n_src"] >= 3) & np.isfinite(s["tau_ig"])
    ax.hist(s["tau_ig"][ok_ig], bins=40, range=(-1, 1), histtype="step", color="C0",
            label="integrated gradients")
    ax.legend(fontsize=7)
  ax.axvline(0, color="C3", lw=0.8)
  ax.set(xlabel="Kendall tau (attention vs |attribution|), per step", ylabel="output steps",
         title=title)
  fig.tight_layout()
  fig.savefig(paths[1], dpi=110)
  plt.close(fig)

  names = list(r["counterfactual"])
  fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
  axes[0].boxplot([s[f"{n}/tv"] for n in names], showfliers=False)
  axes[0].set_xticks(range(1, len(names) + 1), names)
  axes[0].set(ylabel="TV distance to the real output", ylim=(0, 1), title=title)
  x = np.arange(len(names))
  axes[1].bar(x - 0.2, [r["counterfactual"][n]["flip_rate"] for n in names], 0.4,
              label="argmax flips", color="0.3")
  axes[1].bar(x + 0.2, [r["counterfactual"][n]["js_mean"] / math.log(2) for n in names], 0.4,
              label="mean JS / log 2", color="C0")
  axes[1].set_xticks(x, names)
  axes[1].set(ylim=(0, 1), ylabel="share / normalized divergence")
  axes[1].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(paths[2], dpi=110)
  plt.close(fig)
  if r.get("heads"):
    paths.append(_plot_heads(plt, r["heads"], title, os.path.join(directory, HEADS_PLOT)))
  return paths


def _plot_heads(plt, heads, title, path) -> str:
  """Layer x head maps (normalized entropy; attention on gold where gold links exist) and a
  layer x intervention map of argmax flips with the intervention in that layer alone."""
  L, H = heads["layers"], heads["heads"]
  head_names = [f"h{k + 1}" for k in range(H)]
  panels = [("entropy / log(n valid)", heads["normalized_entropy_mean"] or heads["entropy_mean"],
             head_names)]
  if heads["alignment"]:
    panels.append(("attention on gold", [[a["attention_on_gold"] for a in row]
                                          for row in heads["alignment"]], head_names))
  by_layer = heads["counterfactual_by_layer"]
  if by_layer:
    panels.append(("flips, this layer alone", [[by_layer[n][l]["flip_rate"] for n in by_layer]
                                               for l in range(L)], list(by_layer)))
  widths = [len(p[2]) for p in panels]
  fig, axes = plt.subplots(1, len(panels), figsize=(1.5 + 1.1 * sum(widths) + 0.8 * len(panels),
                                                    1.2 + 0.7 * L),
                           squeeze=False, gridspec_kw={"width_ratios": widths})
  for ax, (name, grid, xlabels) in zip(axes[0], panels):
    grid = np.asarray(grid, np.float64)
    im = ax.imshow(grid, cmap="viridis", vmin=0, vmax=1, aspect="auto")
    for (l, k), v in np.ndenumerate(grid):
      ax.text(k, l, f"{v:.2f}", ha="center", va="center", fontsize=7,
              color="white" if v < 0.6 else "black")
    ax.set_xticks(range(len(xlabels)), xlabels, fontsize=7)
    ax.set_yticks(range(L), [f"layer {l + 1}" for l in range(L)])
    ax.set_title(name, fontsize=8)
  fig.colorbar(im, ax=axes[0].tolist(), fraction=0.03)
  fig.suptitle(title, fontsize=9, y=1.04)
  fig.savefig(path, dpi=110, bbox_inches="tight")
  plt.close(fig)
  return path


def write(diag: Diagnosis, directory) -> str:
  """diagnose.json (atomic) and the PLOTS into `directory`; returns the JSON's path."""
  from attn.training import results as results_lib  # pylint: disable=import-outside-toplevel
  plot(diag, directory)
  path = os.path.join(directory, "diagnose.json")
  results_lib.write_json(path, diag.report)
  return path
