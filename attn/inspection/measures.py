r"""Per-step measures of a seq2seq model's attention: how peaked it is, whether it agrees with
gradient attributions, how far the output moves when it is replaced, and how it sits against
gold alignments (attn.inspection.diagnosis runs them over a finished run).

Axis names: B batch, Tt target (output) steps, Ts source tokens, E source embedding, V vocabulary.
All array measures are pure, jit-clean and batched:
- `entropy(weights, mask)` [B, Tt]: nats over the valid source positions.
- `kendall_tau(x, y, mask)` [...]: Kendall tau-b (ties handled as scipy's default) between two
  scores over the valid positions, NaN where undefined.
- `gradient_x_input(model, batch)` [B, Tt, Ts]: <d log p(y_t) / d x_s, x_s> per source token.
- `integrated_gradients(model, batch, steps)` [B, Tt, Ts]: the same path-integrated from a zero
  embedding (Sundararajan et al. 2017).
- `output_divergences(logits, logits_cf)`: total variation, Jensen-Shannon divergence (nats,
  at most log 2) and whether the argmax token flips, per step.
- `shifted_gold`, `alignment_report` (numpy): AER and attention-on-gold, also against the gold
  links moved one position, the off-by-one reading an RNNsearch decoder invites (it scores the
  source with the *previous* state s_{t-1}).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attn.evaluation import metrics as metrics_lib

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


def source_mask(batch):
  """True at the valid source positions: [B, Ts] bool."""
  return jnp.arange(batch["src"].shape[1])[None, :] < batch["src_lengths"][:, None]


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
  return jnp.where(source_mask(batch)[:, None, :], a, 0.0)


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
  return jnp.where(source_mask(batch)[:, None, :], a, 0.0)


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

