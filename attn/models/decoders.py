"""Decoders: without attention (fixed vector), Bahdanau (RNNsearch) and Luong, on attn/ primitives.

Axis names: B batch, Ts source length, Tt target length, E embedding, He encoder output size,
D decoder hidden size, V target vocabulary.

Every decoder exposes the same pure methods, so teacher forcing and search share them:
- `memory(enc) -> dict`: per-source arrays with a leading B axis (keys prepared once, values,
  mask, the initial state); beam search tiles it like any other state.
- `recur(memory, state, y_prev, t, key, intervene=None) -> (state, features [B, F],
  StepAttention)`: the recurrent part of one step; `project(features, key) -> logits [..., V]`:
  the output layer. Teacher forcing scans `recur` and projects all steps in one matmul (the
  [D, V] output layer is most of a step's FLOPs); `step` = recur + project, for search.
- `teacher_force(memory, tgt_in, dropout_key) -> (logits [B, Tt, V], StepAttention of
  [B, Tt, Ts] arrays, or None when the fused kernel never forms the weights)`.
- `counterfactual(memory, tgt_in, intervene)`: teacher forcing that also asks, at every step,
  what the output would have been had that step's attention been `intervene`d.

`intervene(weights [B, 1, Ts], mask [B, 1, Ts], t) -> weights` replaces a step's attention
weights before the context is formed (diagnosis: permuted, uniform, top token removed).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

import attn
from attn import precision
from attn.models.dropout import dropout
from attn.models import recurrence, registries
from attn.models.layers import linear
from attn.models.params import as_params, values
from attn.data.tokens import UNK


class StepAttention(NamedTuple):
  """What a decoder's attention formed: weights [..., Ts] (zeros for decoders without attention)
  and the raw scores [..., Ts] (before temperature and normalizer, -inf where not attendable;
  None when the variant forms none, e.g. linear attention). A pointer-generator also returns the
  logit of its generation probability, p_gen = sigmoid(p_gen_logit) [...] (else None). A
  multi-layer, multi-head model (the Transformer) also returns every cross-attention it formed,
  `heads` [B, L, H, Tt, Ts] teacher-forced, [B, L, H, Ts] per decoding step; `weights` is then
  one summary of them (see attn.models.transformer.ALIGNMENT_LAYER). None for the RNNs."""
  weights: jax.Array
  scores: jax.Array | None = None
  p_gen_logit: jax.Array | None = None
  heads: jax.Array | None = None


def _step_positions(t, B):
  """[B, 1] target positions from a scalar step (teacher forcing) or per-example steps [B] (search)."""
  return jnp.broadcast_to(jnp.asarray(t).reshape(-1, 1), (B, 1))


def _with_bias(layer, y):
  """A product of `layer`'s kernel plus the layer's bias, if it has one."""
  return y if layer.bias is None else y + layer.bias[...]


def _first_query(att):
  """StepAttention of [B, 1, Ts] arrays -> of [B, Ts] (one query per decoding step)."""
  return jax.tree.map(lambda x: x[:, 0], att)


class RecurrentDecoder(nnx.Module):
  """Shared parts: embeddings, a stack of cells, the initial-state bridge, the output layer.

  Class-level facts read without building the model (no caller tests a decoder's name):
  `has_attention`, `fused_unsupported(cfg)`, `cell_input_dim(cfg)`, `readout_flops(cfg)` and,
  for attention decoders, `attention_dims(cfg)`.
  """
  has_attention = False

  @classmethod
  def fused_unsupported(cls, cfg) -> str | None:
    """Why this decoder cannot run its attention through one fused kernel call (None if it can)."""
    return (f"decoder {cfg.rnn.decoder!r} attends one step at a time inside its recurrence; "
            "fused attention needs all steps' queries at once (decoder='luong', input_feeding=False)")

  @classmethod
  def coverage_unsupported(cls, cfg) -> str | None:
    """Why this decoder cannot keep a coverage vector in its attention (None if it can)."""
    return (f"decoder {cfg.rnn.decoder!r} has no coverage mechanism; it needs attention computed "
            "step by step from the recurrent state into an additive score (decoder='bahdanau')")

  @classmethod
  def cell_input_dim(cls, cfg) -> int:
    """Size of the first cell's input at each step."""
    return cfg.rnn.emb_dim + cfg.rnn.enc_out_dim  # y_{t-1} and the context (or fixed vector)

  @classmethod
  def feature_dim(cls, cfg) -> int:
    """Size of the per-step features `recur` returns (what `project` reads): s_t, c_t, y_{t-1}."""
    return cfg.rnn.dec_hidden + cfg.rnn.enc_out_dim + cfg.rnn.emb_dim

  @classmethod
  def readout_flops(cls, cfg) -> int:
    """Matmul FLOPs per target step between the top cell and the output layer."""
    r = cfg.rnn
    return 2 * (r.dec_hidden + r.enc_out_dim + r.emb_dim) * r.dec_hidden  # deep output

  def __init__(self, cfg, d_in0, d_readout, *, rngs, compute_dtype="float32"):
    self.cfg = cfg
    self.compute_dtype = compute_dtype  # the matmuls' operand dtype (attn.models.layers)
    self.cell = registries.CELLS.get(cfg.rnn.cell)
    self.embed = nnx.Embed(cfg.tgt_vocab, cfg.rnn.emb_dim, rngs=rngs)
    D = cfg.rnn.dec_hidden
    self.cells = nnx.List([self.cell.make(d_in0 if i == 0 else D, D, rngs, compute_dtype)
                           for i in range(cfg.dec_layers)])
    self.bridge = self.linear(cfg.rnn.enc_out_dim, cfg.rnn.dec_hidden, rngs)  # s_0 = tanh(W h_enc)
    self.out = self.linear(d_readout, cfg.tgt_vocab, rngs)  # logits stay float32
    # The pointer-generator's switch reads the step's features: for Bahdanau's decoder those are
    # exactly See et al.'s (c_t, s_t, x_t), so p_gen = sigmoid(w_c c + w_s s + w_x x + b).
    self.gate = self.linear(self.feature_dim(cfg), 1, rngs) if cfg.rnn.pointer else None

  def linear(self, d_in, d_out, rngs, **kw):
    """An nnx.Linear whose matmul runs in this decoder's compute dtype (float32 parameters)."""
    return linear(d_in, d_out, compute_dtype=self.compute_dtype, rngs=rngs, **kw)

  def initial_state(self, enc):
    h0 = jnp.tanh(self.bridge(enc.final))  # [B, D]
    return {"carries": tuple(self.cell.carry_from_h(h0) for _ in range(self.cfg.dec_layers))}

  def run_cells(self, carries, x, key, products=None):
    """One time step through the stack. x: [B, d_in0] -> (carries, top output [B, D]).
    products: inside `recurrence.scan`, what forms the cells' matmuls (`cell_weights`)."""
    keys = [None] * len(carries) if key is None else list(jax.random.split(key, len(carries)))
    new = []
    for i, (cell, carry) in enumerate(zip(self.cells, carries)):
      if products is None:
        carry, x = cell(carry, x)
      else:
        xi = _with_bias(cell.dense_i, products(f"cells.{i}.dense_i", x))
        hh = _with_bias(cell.dense_h, products(f"cells.{i}.dense_h", self.cell.h_of(carry)))
        carry = self.cell.update(cell, carry, xi, hh)
        x = self.cell.h_of(carry)
      new.append(carry)
      if i + 1 < len(carries):
        x = dropout(x, self.cfg.dropout, keys[i])
    return tuple(new), x

  def cell_weights(self) -> dict:
    """The cells' input and recurrent kernels by the names `run_cells` forms products with."""
    return {f"cells.{i}.{name}": getattr(cell, name).kernel[...]
            for i, cell in enumerate(self.cells) for name in ("dense_i", "dense_h")}

  def embed_prev(self, y_prev, key):
    return dropout(self.embed(self.in_vocab(y_prev)), self.cfg.dropout, key)  # [B, E]

  def in_vocab(self, ids):
    """Ids on a source-extended vocabulary (a pointer-generator's copies of source OOVs, ids >= V)
    fed back as input: they are embedded as UNK."""
    return jnp.where(ids >= self.cfg.tgt_vocab, UNK, ids)

  def with_gate(self, att, feats):
    """`att` with the pointer-generator's p_gen logit of these features ([..., F] -> [...])."""
    if self.gate is None or att is None:
      return att
    return att._replace(p_gen_logit=self.gate(feats)[..., 0].astype(jnp.float32))

  def teacher_force(self, memory, tgt_in, dropout_key=None):
    """Scans `recur` over the target, then projects every step at once.
    tgt_in: [B, Tt] (BOS + target[:-1]). The cells' weight gradients are formed after the loop,
    one product each (attn.models.recurrence)."""
    state = self.initial_state_from_memory(memory)
    k_rec, k_out = (None, None) if dropout_key is None else jax.random.split(dropout_key)
    graphdef, params = nnx.split(self)

    def body(products, operands, state, inputs):
      params, memory, k_rec = operands
      decoder = nnx.merge(graphdef, params)
      y_prev, t = inputs
      key = None if k_rec is None else jax.random.fold_in(k_rec, t)
      state, feats, att = decoder.recur(memory, state, y_prev, t, key, products=products)
      return state, (feats, att)

    Tt = tgt_in.shape[1]
    _, (feats, att) = recurrence.scan(body, self.cell_weights(), (params, memory, k_rec), state,
                                      (tgt_in.T, jnp.arange(Tt)),
                                      dtype=precision.compute_dtype(self.compute_dtype))
    feats = jnp.swapaxes(feats, 0, 1)
    logits = self.project(feats, k_out)  # [B, Tt, V]
    att = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), att)  # [B, Tt, Ts] each
    return logits, self.with_gate(att, feats)

  def counterfactual(self, memory, tgt_in, intervene):
    """Teacher forcing along tgt_in [B, Tt] (no dropout) that, at every step t, also runs the
    step from the same state with its attention replaced by `intervene` (the prefix keeps the
    real attention, so each step's effect is measured alone, as in Jain & Wallace 2019).
    Returns (logits [B, Tt, V], counterfactual logits [B, Tt, V], StepAttention [B, Tt, Ts])."""
    state = self.initial_state_from_memory(memory)

    def body(state, inputs):
      y_prev, t = inputs
      new_state, feats, att = self.recur(memory, state, y_prev, t)
      _, feats_cf, _ = self.recur(memory, state, y_prev, t, intervene=intervene)
      return new_state, (feats, feats_cf, att)

    _, (feats, feats_cf, att) = jax.lax.scan(body, state, (tgt_in.T, jnp.arange(tgt_in.shape[1])))
    swap = lambda x: jnp.swapaxes(x, 0, 1)
    return (self.project(swap(feats)), self.project(swap(feats_cf)), jax.tree.map(swap, att))

  def step(self, memory, state, y_prev, t, key=None, intervene=None):
    """One decoding step: (state, logits [B, V], StepAttention of [B, Ts] arrays)."""
    k_rec, k_out = (None, None) if key is None else jax.random.split(key)
    state, feats, att = self.recur(memory, state, y_prev, t, k_rec, intervene=intervene)
    return state, self.project(feats, k_out), self.with_gate(att, feats)

  def project(self, feats, key=None):
    """Deep output (Cho et al. 2014 eq. 6 / Bahdanau's readout): tanh(W_r feats) -> W_o."""
    o = jnp.tanh(self.readout(feats))
    return self.out(dropout(o, self.cfg.dropout, key))

  def initial_state_from_memory(self, memory):
    return {k[len("init_"):]: v for k, v in memory.items() if k.startswith("init_")}


@registries.DECODERS.register("none")
class NoAttentionDecoder(RecurrentDecoder):
  """Cho et al. (2014): the encoder summary c is the initial state and is fed at every step;
  it is the only source information (the fixed-vector bottleneck)."""

  def __init__(self, cfg, *, rngs, compute_dtype="float32"):
    De = cfg.rnn.enc_out_dim
    super().__init__(cfg, self.cell_input_dim(cfg), cfg.rnn.dec_hidden, rngs=rngs,
                     compute_dtype=compute_dtype)
    self.readout = self.linear(cfg.rnn.dec_hidden + De + cfg.rnn.emb_dim, cfg.rnn.dec_hidden, rngs)

  def memory(self, enc):
    init = self.initial_state(enc)
    return {"c": enc.final, "mask": enc.mask, **{"init_" + k: v for k, v in init.items()}}

  def recur(self, memory, state, y_prev, t, key=None, intervene=None, products=None):
    del intervene  # nothing to intervene on: the source enters only through the fixed vector
    k1, k2 = (None, None) if key is None else jax.random.split(key)
    emb, c = self.embed_prev(y_prev, k1), memory["c"]
    carries, h = self.run_cells(state["carries"], jnp.concatenate([emb, c], -1), k2, products)
    feats = jnp.concatenate([h, c, emb], -1)
    return {"carries": carries}, feats, StepAttention(jnp.zeros(memory["mask"].shape, jnp.float32))


class AttentionMixin:
  """Score/scope parameters and one attention call over the prepared memory."""
  has_attention = True

  @classmethod
  def attention_dims(cls, cfg) -> tuple[int, int, int]:
    """(query size, key size the score sees, FLOPs per source token projecting keys to it)."""
    return cfg.rnn.dec_hidden, cfg.rnn.enc_out_dim, 0

  def init_attention(self, d_query, rngs):
    cfg = self.cfg
    key = rngs.params()
    self.score_params = as_params(attn.init_score(
        cfg.rnn.score, key, d_query, self.d_keys, d_attn=cfg.rnn.d_attn, max_len=cfg.max_src_len))
    self.scope_params = as_params(attn.init_scope(
        cfg.rnn.scope, jax.random.fold_in(key, 1), d_query, d_attn=cfg.rnn.d_attn))

  def attend(self, memory, q, positions, t=None, intervene=None, keys=None):
    """q: [B, Tq, dq]; positions: [B, Tq] target positions (local-m centres); keys: prepared keys
    replacing memory["keys"] (coverage adds to them). Returns context [B, Tq, He] and
    StepAttention of [B, Tq, Ts] arrays. With `intervene`, the context is formed from
    intervene(weights, mask, t) and those weights are returned."""
    cfg = self.cfg
    mask = memory["mask"][:, None, :]
    # Recomputed in the backward pass rather than saved: the additive score's tanh tensor is
    # [B, Tq, Ts, d_attn] a step (52 MB a batch at the multi30k preset's B=128, Ts=Tt=20),
    # written and read back for the gradient, while recomputing it costs ~1% of the step's
    # FLOPs; the train step got ~7-11% faster (docs/journal/speed.md). Values are unchanged.
    run = jax.checkpoint(functools.partial(
        attn.attend, score=cfg.rnn.score, normalizer=cfg.rnn.normalizer,
        temperature=cfg.rnn.temperature,
        scope=cfg.rnn.scope, half_width=cfg.rnn.half_width, top_k=cfg.rnn.top_k,
        keys_prepared=True, return_scores=True))
    keys = memory["keys"] if keys is None else keys
    ctx, w, e = run(values(self.score_params), q, keys, memory["values"], mask=mask,
                    scope_params=values(self.scope_params), positions=positions)
    if intervene is not None:
      w = intervene(w, mask, t)
      ctx = jnp.einsum("bqk,bkd->bqd", w, memory["values"].astype(w.dtype)).astype(ctx.dtype)
    return ctx, StepAttention(w, e)


@registries.DECODERS.register("bahdanau")
class BahdanauDecoder(AttentionMixin, RecurrentDecoder):
  """RNNsearch (Bahdanau et al. 2015): e_tj = a(s_{t-1}, h_j) from the previous state, the context
  c_t enters the recurrence s_t = f(s_{t-1}, y_{t-1}, c_t), deep output from (s_t, c_t, y_{t-1})."""

  @classmethod
  def coverage_unsupported(cls, cfg) -> str | None:
    if not attn.get(cfg.rnn.score, "score").additive_keys:
      return (f"the coverage vector enters the additive score's key term (U h_i + w_c c_i); "
              f"score={cfg.rnn.score!r} has none: use score='additive'")
    return None

  def __init__(self, cfg, *, rngs, compute_dtype="float32"):
    De = cfg.rnn.enc_out_dim
    super().__init__(cfg, self.cell_input_dim(cfg), cfg.rnn.dec_hidden, rngs=rngs,
                     compute_dtype=compute_dtype)
    self.d_keys = De
    self.init_attention(cfg.rnn.dec_hidden, rngs)
    self.readout = self.linear(cfg.rnn.dec_hidden + De + cfg.rnn.emb_dim, cfg.rnn.dec_hidden, rngs)
    # w_c starts at zero: switched on when resuming a run trained without coverage, the model
    # computes what it computed before, and learns to use the coverage from there.
    self.w_cov = nnx.Param(jnp.zeros((cfg.rnn.d_attn,), jnp.float32)) if cfg.rnn.coverage else None

  def memory(self, enc):
    init = self.initial_state(enc)
    if self.w_cov is not None:
      init["coverage"] = jnp.zeros(enc.mask.shape, jnp.float32)  # c^0 = 0: [B, Ts]
    # U h_j, once per source
    keys = attn.prepare_keys(self.cfg.rnn.score, values(self.score_params), enc.outputs)
    return {"keys": keys, "values": enc.outputs, "mask": enc.mask,
            **{"init_" + k: v for k, v in init.items()}}

  def recur(self, memory, state, y_prev, t, key=None, intervene=None, products=None):
    k1, k2 = (None, None) if key is None else jax.random.split(key)
    emb = self.embed_prev(y_prev, k1)
    s_prev = self.cell.h_of(state["carries"][-1])  # s_{t-1}: [B, D]
    positions = _step_positions(t, y_prev.shape[0])
    keys = None
    if self.w_cov is not None:  # e_ti = v^T tanh(W s + U h_i + w_c c^t_i + b), See et al. eq. 11
      keys = memory["keys"] + state["coverage"][..., None] * self.w_cov[...].astype(
          memory["keys"].dtype)
    c, att = self.attend(memory, s_prev[:, None, :], positions, t, intervene, keys)  # [B, 1, He]
    c, att = c[:, 0], _first_query(att)
    carries, s = self.run_cells(state["carries"], jnp.concatenate([emb, c], -1), k2, products)
    new_state = {"carries": carries}
    if self.w_cov is not None:
      new_state["coverage"] = state["coverage"] + att.weights.astype(jnp.float32)
    return new_state, jnp.concatenate([s, c, emb], -1), att


@registries.DECODERS.register("luong")
class LuongDecoder(AttentionMixin, RecurrentDecoder):
  """Luong et al. (2015): h_t = RNN(h_{t-1}, [y_{t-1}; h~_{t-1}]) (input feeding optional),
  c_t = attend(h_t, source), h~_t = tanh(W_c [c_t; h_t]) (eq. 5), p(y_t) = softmax(W_s h~_t)."""

  @classmethod
  def fused_unsupported(cls, cfg) -> str | None:
    if cfg.rnn.input_feeding:
      return ("decoder 'luong' with input_feeding=True feeds each step's attention into the next; "
              "set model.input_feeding=False to attend for all steps in one fused call")
    return None

  @classmethod
  def cell_input_dim(cls, cfg) -> int:
    return cfg.rnn.emb_dim + (cfg.rnn.dec_hidden if cfg.rnn.input_feeding else 0)

  @classmethod
  def readout_flops(cls, cfg) -> int:
    return 2 * (cfg.rnn.enc_out_dim + cfg.rnn.dec_hidden) * cfg.rnn.dec_hidden  # W_c

  @classmethod
  def feature_dim(cls, cfg) -> int:
    return cfg.rnn.dec_hidden  # h~_t = tanh(W_c [c_t; h_t])

  @staticmethod
  def _projects_keys(cfg) -> bool:
    # Parameter-free scores compare h_t with the keys directly: project the source to D first.
    return attn.get(cfg.rnn.score, "score").init is None

  @classmethod
  def attention_dims(cls, cfg) -> tuple[int, int, int]:
    De, D = cfg.rnn.enc_out_dim, cfg.rnn.dec_hidden
    return (D, D, 2 * De * D) if cls._projects_keys(cfg) else (D, De, 0)

  def __init__(self, cfg, *, rngs, compute_dtype="float32"):
    De, D = cfg.rnn.enc_out_dim, cfg.rnn.dec_hidden
    super().__init__(cfg, self.cell_input_dim(cfg), D, rngs=rngs, compute_dtype=compute_dtype)
    needs_proj = self._projects_keys(cfg)
    self.key_proj = self.linear(De, D, rngs, use_bias=False) if needs_proj else None
    self.d_keys = D if needs_proj else De
    self.init_attention(D, rngs)
    self.W_c = self.linear(De + D, D, rngs, use_bias=False)

  def memory(self, enc):
    init = self.initial_state(enc)
    init["h_tilde"] = jnp.zeros(enc.final.shape[:1] + (self.cfg.rnn.dec_hidden,), enc.final.dtype)
    keys = enc.outputs if self.key_proj is None else self.key_proj(enc.outputs)
    keys = attn.prepare_keys(self.cfg.rnn.score, values(self.score_params), keys)
    return {"keys": keys, "values": enc.outputs, "mask": enc.mask,
            **{"init_" + k: v for k, v in init.items()}}

  def attentional_state(self, c, h):
    return jnp.tanh(self.W_c(jnp.concatenate([c, h], -1)))  # h~_t, eq. 5

  def project(self, h_tilde, key=None):
    return self.out(dropout(h_tilde, self.cfg.dropout, key))  # eq. 6

  def recur(self, memory, state, y_prev, t, key=None, intervene=None, products=None):
    k1, k2 = (None, None) if key is None else jax.random.split(key)
    x = self.embed_prev(y_prev, k1)
    if self.cfg.rnn.input_feeding:
      x = jnp.concatenate([x, state["h_tilde"]], -1)
    carries, h = self.run_cells(state["carries"], x, k2, products)
    positions = _step_positions(t, y_prev.shape[0])
    c, att = self.attend(memory, h[:, None, :], positions, t, intervene)
    h_tilde = self.attentional_state(c[:, 0], h)
    return {"carries": carries, "h_tilde": h_tilde}, h_tilde, _first_query(att)

  def teacher_force(self, memory, tgt_in, dropout_key=None):
    if self.cfg.rnn.input_feeding:
      return super().teacher_force(memory, tgt_in, dropout_key)
    # Without input feeding the recurrence does not see the attention: run it over all target
    # steps, then attend for all of them in one batched call (or one fused kernel call).
    k1, k2, k3 = (None, None, None) if dropout_key is None else jax.random.split(dropout_key, 3)
    B, Tt = tgt_in.shape
    emb = dropout(self.embed(tgt_in), self.cfg.dropout, k1)  # [B, Tt, E]

    def body(carries, inputs):
      x, t = inputs
      key = None if k2 is None else jax.random.fold_in(k2, t)
      return self.run_cells(carries, x, key)

    init = self.initial_state_from_memory(memory)
    _, H = jax.lax.scan(body, init["carries"], (jnp.swapaxes(emb, 0, 1), jnp.arange(Tt)))
    H = jnp.swapaxes(H, 0, 1)  # [B, Tt, D]
    if self.cfg.fused:
      cfg = self.cfg
      lengths = jnp.sum(memory["mask"], axis=-1).astype(jnp.int32)
      C, _ = attn.attend(values(self.score_params), H, memory["keys"], memory["values"],
                         score=cfg.rnn.score, temperature=cfg.rnn.temperature, key_lengths=lengths,
                         keys_prepared=True, fused=cfg.fused)  # the weights are never formed
      att = None
    else:
      C, att = self.attend(memory, H, jnp.broadcast_to(jnp.arange(Tt), (B, Tt)))
    feats = self.attentional_state(C, H)
    return self.project(feats, k3), self.with_gate(att, feats)
