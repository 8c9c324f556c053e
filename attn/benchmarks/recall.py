"""Associative recall, the task variant_costs trains each attention variant on, and what it
reads from the trained model (accuracy, the query's attention weight on the gold position).

Every position but the last holds one (key, value) pair token; the last holds a query key that
occurs in exactly one pair; the label is that pair's value. The gold alignment is that pair's
position: the only position whose token says what the answer is, so one attention hop from the
query to it answers the task, and a variant that cannot see or keep that position at the query
cannot answer. The settings `s` are attn.benchmarks.variant_costs.Settings; `config_for(variant,
max_len)` builds the encoder's ModelConfig.
"""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from attn.models.config import ModelConfig
from attn.models.params import values
from attn.models.transformer_attention import attend_heads
from attn.models.transformer_layers import TransformerEncoder


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4))
def recall_batch(key, batch: int, T: int, num_keys: int, num_values: int):
  """Associative recall: (tokens [B, T] int32, labels [B] int32, gold [B] int32).

  Positions 0..T-2 hold pair tokens key * num_values + value; position T-1 holds the query
  token num_keys * num_values + q. Key q occurs at exactly one position, gold (uniform in
  [0, T-2]); the other positions draw their keys uniformly from the other num_keys - 1 keys, so
  the answer, the value at gold (the label), is unambiguous. Values are uniform.
  """
  kq, kk, kv, kg = jax.random.split(key, 4)
  query = jax.random.randint(kq, (batch, 1), 0, num_keys)
  others = jax.random.randint(kk, (batch, T - 1), 0, num_keys - 1)
  others = others + (others >= query)  # skips the query key: [B, T-1] in [0, K) \ {q}
  gold = jax.random.randint(kg, (batch,), 0, T - 1)
  keys = jnp.where(jnp.arange(T - 1) == gold[:, None], query, others)  # [B, T-1]
  vals = jax.random.randint(kv, (batch, T - 1), 0, num_values)
  tokens = jnp.concatenate([keys * num_values + vals, num_keys * num_values + query], axis=1)
  labels = jnp.take_along_axis(vals, gold[:, None], axis=1)[:, 0]
  return tokens.astype(jnp.int32), labels.astype(jnp.int32), gold.astype(jnp.int32)


class RecallModel(nnx.Module):
  """The Transformer encoder and a linear readout of the value at the last (query) position."""

  def __init__(self, cfg: ModelConfig, num_values: int, *, rngs: nnx.Rngs):
    self.encoder = TransformerEncoder(cfg, rngs=rngs, compute_dtype="float32")
    self.readout = nnx.Linear(cfg.transformer.d_model, num_values, rngs=rngs)

  def __call__(self, tokens):
    """tokens [B, T] -> value logits [B, num_values] at position T-1."""
    return self.readout(self.encoder(tokens, full_lengths(tokens))[:, -1])


def full_lengths(tokens):
  """[B] = T: every sequence is whole (no padding in either task)."""
  return jnp.full(tokens.shape[:1], tokens.shape[1], jnp.int32)


def gold_attention(encoder, tokens, gold):
  """The weight the last position puts on position `gold` in every layer and head: [B, L, H].

  The encoder's own layers, with each layer's attention run a second time through
  `attend_heads` on the layer's queries and keys (as `Attention.__call__` does) but with values
  one-hot at the gold position ([B, H, T, 1]): the context is then the gold weight itself,
  whether or not the variant forms its weights (linear, fused).
  """
  B, T = tokens.shape
  positions = jnp.arange(T)[None]  # [1, T], as TransformerEncoder.__call__
  lengths = full_lengths(tokens)
  x = encoder.embedding(tokens, positions)  # [B, T, d]
  out = []
  for layer in encoder.layers:
    a = layer.attn
    h = layer.norm_attn(x)
    kp, _ = a.keys_values(h, positions)
    probe = jnp.broadcast_to((jnp.arange(T) == gold[:, None])[:, None, :, None],
                             (B, a.num_heads, T, 1)).astype(jnp.float32)  # [B, H, T, 1]
    ctx, *_ = attend_heads(values(a.params), a.queries(h, positions), kp, probe, a.role,
                          key_lengths=lengths, bias=a.pos.bias(a.num_heads, positions, positions),
                          positions=jnp.broadcast_to(positions, (B, T)), fused=a.fused)
    out.append(ctx[:, :, -1, 0])  # [B, H]
    x = layer(x, lengths, positions)
  return jnp.stack(out, axis=1)  # [B, L, H]


def jit_step(graphdef, loss_fn, *, update: bool):
  """A jitted pure step over nnx.split state (JAX notes: lower overhead than nnx.jit).
  update: the state is (model, optimizer) and the step applies the gradients; else the state is
  a module, and the step returns the loss and the gradients of its parameters and inputs."""

  def train(state, *batch):
    model, opt = nnx.merge(graphdef, state)
    loss, grads = nnx.value_and_grad(loss_fn)(model, *batch)
    opt.update(model, grads)
    return nnx.state((model, opt)), loss

  def fwd_bwd(state, *inputs):
    module = nnx.merge(graphdef, state)
    return nnx.value_and_grad(loss_fn, argnums=tuple(range(1 + len(inputs))))(module, *inputs)

  return jax.jit(train if update else fwd_bwd)


def train_recall(s, cfg: ModelConfig, T: int):
  """Trains the encoder (of `cfg`) + readout on associative recall at length T for
  s.train_steps Adam steps on fresh batches; cfg.max_src_len is the longest T the model will be
  tested at (a learned position table's size). Returns (model, {final_train_loss,
  train_seconds})."""
  model = RecallModel(cfg, s.num_values, rngs=nnx.Rngs(s.seed))
  graphdef, state = nnx.split((model, nnx.Optimizer(model, optax.adam(s.learning_rate),
                                                    wrt=nnx.Param)))

  def loss_fn(m, tokens, labels):
    return optax.softmax_cross_entropy_with_integer_labels(m(tokens), labels).mean()

  step = jit_step(graphdef, loss_fn, update=True)
  key = jax.random.PRNGKey(s.seed)
  batch_at = jax.jit(lambda i: recall_batch(jax.random.fold_in(key, i), s.train_batch, T,
                                            s.num_keys, s.num_values)[:2])
  t0 = time.perf_counter()
  loss = None
  for i in range(s.train_steps):
    state, loss = step(state, *batch_at(i))
  info = {"train_T": T, "final_train_loss": None if loss is None else round(float(loss), 4),
          "train_seconds": time.perf_counter() - t0}
  return nnx.merge(graphdef, state)[0], info


def evaluate_recall(s, model, T: int) -> dict:
  """Test accuracy at length T and the query's mean weight on the gold position per layer and
  head ([L, H]), with the best (layer, head) picked out (1-based)."""
  graphdef, state = nnx.split(model)

  @jax.jit
  def evaluate(state, tokens, labels, gold):
    m = nnx.merge(graphdef, state)
    correct = jnp.argmax(m(tokens), -1) == labels  # [B]
    return correct, gold_attention(m.encoder, tokens, gold)  # [B], [B, L, H]

  # Test examples from a key no training batch uses, run in equal chunks (one compilation)
  # that keep a [chunk, H, T, T] score tensor near 256 MiB; the last chunk is padded.
  E = s.eval_examples
  tokens, labels, gold = recall_batch(jax.random.fold_in(jax.random.PRNGKey(s.seed + 1), T), E,
                                      T, s.num_keys, s.num_values)
  chunk = max(1, min(E, 2 ** 26 // (s.heads * T * T)))
  pad = -E % chunk
  tokens, labels, gold = (jnp.concatenate([x, x[:pad]]) if pad else x
                          for x in (tokens, labels, gold))
  correct, weights = [], []
  for i in range(0, E + pad, chunk):
    c, w = evaluate(state, tokens[i:i + chunk], labels[i:i + chunk], gold[i:i + chunk])
    correct.append(np.asarray(c))
    weights.append(np.asarray(w))
  gold_w = np.concatenate(weights)[:E].mean(0)  # [L, H]
  layer, head = np.unravel_index(int(np.argmax(gold_w)), gold_w.shape)
  return {"accuracy": float(np.concatenate(correct)[:E].mean()),
          "gold_weight": float(gold_w[layer, head]), "gold_layer": int(layer) + 1,
          "gold_head": int(head) + 1, "gold_weight_by_layer_head": gold_w.tolist()}


def quality_sweep(s, config_for, log) -> list[dict]:
  """One row per (variant, T in s.quality_lengths): trained at T, or once per variant at
  s.train_length and tested at every T. config_for(variant, max_len) -> the ModelConfig."""
  rows = []
  lengths = sorted(s.quality_lengths)
  max_len = max(lengths + [s.train_length])
  for variant in s.variants:
    model = None
    for T in lengths:
      if model is None or not s.train_length:
        model, info = train_recall(s, config_for(variant, max_len), s.train_length or T)
        log(f"quality {variant:<7} trained at T={info['train_T']}: {s.train_steps} steps, "
            f"final loss {info['final_train_loss']} ({info['train_seconds']:.0f} s)")
      rows.append({"variant": variant, "T": T, **info, **evaluate_recall(s, model, T)})
      r = rows[-1]
      log(f"quality {variant:<7} T={T:<6} accuracy {r['accuracy']:.3f}  gold weight "
          f"{r['gold_weight']:.3f} (L{r['gold_layer']}H{r['gold_head']})")
  return rows
