"""The Transformer encoder-decoder (Vaswani et al. 2017) on this repo's attention primitives.

`model.arch=transformer`: the same interface as `Seq2Seq` (`attention`, `__call__`, `step_fn`,
`initial_decode_state`, `cfg`), so the training loop, evaluation and `attn.decoding` run it as
they run the RNNs.

Axis names: B batch, Ts source length, Tt target length, d = d_model, H heads, dh = d / H head
size, L decoder layers, V target vocabulary, C the decoding cache length.

- Every attention holds `attn.init_multihead`'s parameters (wq, wk, wv [d, H, dh], wo [H, dh, d],
  per-head score/scope parameters) and runs `core.attend` once per head (vmapped, as
  `attn.multihead` does) or all heads through `core.fused_heads`. It is not one `multihead()`
  call because three things happen between the projections and the score: RoPE rotates the
  queries and keys, decoding caches the keys, and ALiBi adds a score bias.
- Three attention roles, each with its own variant (`model.enc_self`, `model.dec_self`,
  `model.cross`: score, normalizer, temperature, scope). `model.fused=True` sends a role through
  the kernels when they cover its variant (`fused_unsupported`) and runs the others unfused;
  the one-query decoding steps always run unfused (one query per step is no kernel's case).
- Pre-LayerNorm residual blocks x + Dropout(F(LN(x))) (Wang et al. 2019; Xiong et al. 2020: no
  warm-up-critical post-LN gradients), a final LayerNorm on each stack, ReLU/GELU feed-forward.
  Dropout on the embeddings and on every sublayer's output (Vaswani et al. sec. 5.4); none on the
  attention weights, which neither `core.attend` nor the kernels take.
- Matmuls (projections, feed-forward, output layer) take operands in the compute dtype with
  float32 accumulation (attn.models.layers / attn.precision); attention itself runs in float32.
- Incremental decoding: the state holds, per decoder layer, a preallocated self-attention key /
  value cache [B, H, C, dh] written at the step's position, and the cross-attention keys and
  values computed once from the encoder output; one new query per step.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

import attn
from attn import banded, core, precision, registry
from attn.errors import ConfigError
from attn.models import registries
from attn.models.config import ModelConfig
from attn.models.decoders import StepAttention
from attn.models.encoder import dropout
from attn.models.layers import linear
from attn.models.params import as_params, values
from attn.models.positions import PositionalEncoding
from attn.models.seq2seq import shift_right

# The decoder layer whose head-averaged cross-attention is `StepAttention.weights` (what AER,
# heatmaps and the coverage penalty read); `heads` keeps every layer and head. Garg et al. (2019)
# found the penultimate of six layers' head average the best aligner on German-English AER; we
# take the last layer: the models trained here have one to three decoder layers, where the
# penultimate is often the first (or absent), and the last layer's attention is the one that
# feeds the output distribution directly. Index into the L axis (negative counts from the top).
ALIGNMENT_LAYER = -1

ACTIVATIONS = {"relu": jax.nn.relu, "gelu": jax.nn.gelu}


class HeadAttention(NamedTuple):
  """What one multi-head attention formed: weights [B, H, Tq, Tk] float32 and the raw scores
  behind them [B, H, Tq, Tk] (before temperature and normalizer, -inf where not attendable)."""
  weights: jax.Array
  scores: jax.Array


class Role(NamedTuple):
  """One of the three attentions: its config field, and how it is masked and positioned."""
  field: str
  self_attention: bool  # queries and keys on one axis: positional rotation and bias apply
  causal: bool
  key_len: str  # the config field bounding its key length (a `location` score's max_len)


ROLES = {r.field: r for r in (Role("enc_self", True, False, "max_src_len"),
                              Role("dec_self", True, True, "max_tgt_len"),
                              Role("cross", False, False, "max_src_len"))}

# Registered scopes whose restriction places query i at row i of the scores (the registry's
# `window`), run as their equivalent at explicit query positions: a cached decoding step has one
# query row at position t. In teacher forcing (positions 0..T-1) the two are the same mask.
_AT_POSITIONS = {"window": "local_m"}


def _dense(x, w, compute_dtype):
  """x [..., K] @ w [K, N] with operands in `compute_dtype`, accumulated in float32 (as
  attn.models.layers does for nnx.Linear). Returns [..., N] float32."""
  dtype = precision.compute_dtype(compute_dtype)
  if precision.is_reduced(dtype):
    return precision.matmul(x, w, dtype)
  return jnp.einsum("...k,kn->...n", x, w, preferred_element_type=precision.accum_dtype(x, w))


def _head_axis(p):
  return None if p is None else 0  # per-head parameters carry a leading H axis


def prepare_heads(score, score_params, k):
  """The score's key-side work for every head: k [B, H, Tk, dh] -> [B, H, Tk, dk']."""
  return jax.vmap(functools.partial(core.prepare_keys, score),
                  in_axes=(_head_axis(score_params), -3), out_axes=-3)(score_params, k)


def attend_heads(params, q, kp, v, role, *, key_lengths=None, mask=None, causal=False, bias=None,
                 positions=None, fused=False, same_positions=False):
  """Every head's attention with the role's variant (an `AttentionRole`).

  params: attn.init_multihead's parameters (only "score" and "scope" are read here).
  q: [B, H, Tq, dh]; kp: [B, H, Tk, dk'] keys already through `prepare_heads`; v: [B, H, Tk, dh].
  key_lengths: [B] valid keys; mask: bool broadcastable to [B, Tq, Tk] (shared by the heads);
  causal: query i sees keys j <= i; bias: [B or 1, H, Tq, Tk] added to the scores;
  positions: [B, Tq] the queries' positions (where windows are centred).
  fused: all heads in one kernel call (needs softmax, the global scope, no mask and no bias).
  same_positions: queries and keys are the same positions 0..T-1 (self-attention in teacher
  forcing and encoding); a window scope then runs banded, when given no mask and no bias.
  Returns (context [B, H, Tq, dh], weights [B, H, Tq, Tk] float32, raw scores [B, H, Tq, Tk]
  float32 (before the temperature and the normalizer, bias included, -inf where not attendable);
  weights and scores are None when never formed: fused, banded window, linear attention). A query
  with no valid key gets zero weights and context. Under jit, unused weights and scores cost nothing.
  """
  score_params, scope_params = params.get("score"), params.get("scope")
  if fused:
    return core.fused_heads(role.score, score_params, q, kp, v, temperature=role.temperature,
                            causal=causal, key_lengths=key_lengths), None, None
  if (role.scope == banded.SCOPE and same_positions and mask is None and bias is None
      and banded.banded_unsupported(role.score, role.normalizer) is None):
    # The masked window forms all [T, T] scores to keep 2 * half_width + 1 per query; the band
    # holds O(T * half_width) per head, the same context. Its weights are never formed: the
    # self-attention callers discard them (only the cross-attention's are read).
    one_band = functools.partial(banded.banded_attend, score=role.score,
                                 normalizer=role.normalizer, temperature=role.temperature,
                                 half_width=role.half_width, causal=causal,
                                 key_lengths=key_lengths)
    return jax.vmap(one_band, in_axes=(_head_axis(score_params), -3, -3, -3),
                    out_axes=-3)(score_params, q, kp, v), None, None

  def one_head(sp, cp, q, k, v, b):
    return core.attend(sp, q, k, v, score=role.score, normalizer=role.normalizer, mask=mask,
                       temperature=role.temperature, causal=causal,
                       scope=_AT_POSITIONS.get(role.scope, role.scope), scope_params=cp,
                       half_width=role.half_width, top_k=role.top_k, positions=positions,
                       keys_prepared=True, key_lengths=key_lengths, bias=b, return_scores=True)

  return jax.vmap(one_head, in_axes=(_head_axis(score_params), _head_axis(scope_params), -3, -3,
                                     -3, None if bias is None else -3),
                  out_axes=-3)(score_params, scope_params, q, kp, v, bias)


def _pos_encoding(cfg):
  return registries.POS_ENCODINGS.get(cfg.pos_encoding)


def fused_unsupported(cfg: ModelConfig, field: str) -> str | None:
  """Why role `field` (enc_self, dec_self, cross) runs unfused under model.fused=True; None when
  the kernels run it (padding is always given to them as lengths, never as a mask)."""
  role = getattr(cfg, field)
  why = core.fused_unsupported(role.score, role.normalizer, role.scope)
  if why is None and ROLES[field].self_attention and _pos_encoding(cfg).forms_bias:
    why = f"pos_encoding={cfg.pos_encoding!r} adds a bias to the scores, which no kernel takes"
  return why


class Attention(nnx.Module):
  """One multi-head attention of role `field`: projections, positions, heads, output projection.

  The queries' and keys' positions enter through the model's positional encoding (rotation,
  bias) in self-attention roles only; cross-attention gets `PositionalEncoding` (none)."""

  def __init__(self, cfg: ModelConfig, field: str, *, rngs: nnx.Rngs, compute_dtype: str):
    spec = ROLES[field]
    self.role_field = field
    self.role = getattr(cfg, field)
    self.num_heads = cfg.num_heads
    self.causal = spec.causal
    self.self_attention = spec.self_attention
    self.compute_dtype = compute_dtype
    self.pos = _pos_encoding(cfg) if spec.self_attention else PositionalEncoding
    self.fused = cfg.fused and fused_unsupported(cfg, field) is None
    d_head = cfg.d_model // cfg.num_heads
    # Additive scores get d_attn = dh: a [.., Tq, Tk, d_attn] tensor per head is formed unfused.
    self.params = as_params(attn.init_multihead(
        rngs.params(), cfg.d_model, cfg.num_heads, score=self.role.score, d_attn=d_head,
        max_len=getattr(cfg, spec.key_len),
        scope=self.role.scope))

  def _heads(self, x, name):
    """x [B, T, d] through params[name] [d, H, dh] -> [B, H, T, dh]."""
    w = self.params[name][...]
    d, H, dh = w.shape
    y = _dense(x, w.reshape(d, H * dh), self.compute_dtype)  # [B, T, H*dh]
    return jnp.swapaxes(y.reshape(y.shape[:-1] + (H, dh)), -2, -3)

  def queries(self, x, positions):
    """x: [B, Tq, d]; positions: [B or 1, Tq]. Returns [B, H, Tq, dh]."""
    return self.pos.rotate(self._heads(x, "wq"), positions)

  def keys_values(self, x, positions):
    """x: [B, Tk, d]; positions: [B or 1, Tk]. Returns prepared keys [B, H, Tk, dk'] and values
    [B, H, Tk, dh] (what the decoding cache holds: nothing about a key is recomputed)."""
    k = self.pos.rotate(self._heads(x, "wk"), positions)
    return prepare_heads(self.role.score, values(self.params.get("score")), k), self._heads(x, "wv")

  def __call__(self, q, kp, v, *, q_pos, k_pos, key_lengths=None, mask=None, causal=False,
               fused=False, reweigh=None):
    """Attends with the role's variant and projects back: (out [B, Tq, d] float32,
    HeadAttention of [B, H, Tq, Tk] arrays, or None when the weights are never formed).
    q_pos [B or 1, Tq], k_pos [B or 1, Tk]: positions (bias, windows).
    reweigh: weights [B, H, Tq, Tk] -> weights' of the same shape; the context is then
    weights' @ v (an intervention on what the layer reads; `Transformer.counterfactual`)."""
    p = values(self.params)
    bias = self.pos.bias(self.num_heads, q_pos, k_pos)
    # Self-attention without a mask is encoding or teacher forcing (a decoding step masks its
    # cache): the keys sit at the queries' positions 0..T-1.
    same_positions = self.self_attention and mask is None
    ctx, w, s = attend_heads(p, q, kp, v, self.role, key_lengths=key_lengths, mask=mask,
                             causal=causal, bias=bias,
                             positions=jnp.broadcast_to(q_pos, (q.shape[0], q.shape[-2])),
                             fused=fused, same_positions=same_positions)  # ctx [B, H, Tq, dh]
    if reweigh is not None:
      if w is None:
        raise ValueError(f"model.{self.role_field}: an intervention on the attention weights "
                         "needs them formed (not fused, banded or linear)")
      ctx = jnp.einsum("bhqk,bhkd->bhqd", reweigh(w), v.astype(w.dtype)).astype(ctx.dtype)
    H, dh, d = p["wo"].shape
    ctx = jnp.swapaxes(ctx, -2, -3).reshape(ctx.shape[:-3] + (ctx.shape[-2], H * dh))
    att = None if w is None else HeadAttention(w, s)
    return _dense(ctx, p["wo"].reshape(H * dh, d), self.compute_dtype), att  # [B, Tq, d]


class FeedForward(nnx.Module):
  """W_2 act(W_1 x + b_1) + b_2 (Vaswani et al. eq. 2), act = ReLU or GELU."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, compute_dtype: str):
    self.activation = cfg.ff_activation
    self.up = linear(cfg.d_model, cfg.d_ff, compute_dtype=compute_dtype, rngs=rngs)
    self.down = linear(cfg.d_ff, cfg.d_model, compute_dtype=compute_dtype, rngs=rngs)

  def __call__(self, x):
    return self.down(ACTIVATIONS[self.activation](self.up(x)))


def _keys(key, n):
  return [None] * n if key is None else list(jax.random.split(key, n))


class EncoderLayer(nnx.Module):
  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, compute_dtype: str):
    self.rate = cfg.dropout
    self.norm_attn = nnx.LayerNorm(cfg.d_model, rngs=rngs)
    self.attn = Attention(cfg, "enc_self", rngs=rngs, compute_dtype=compute_dtype)
    self.norm_ff = nnx.LayerNorm(cfg.d_model, rngs=rngs)
    self.ff = FeedForward(cfg, rngs=rngs, compute_dtype=compute_dtype)

  def __call__(self, x, src_lengths, positions, key=None):
    """x: [B, Ts, d]; positions: [1, Ts]. Padded keys are masked; padded rows computed and
    never read (cross-attention masks them too)."""
    k1, k2 = _keys(key, 2)
    h = self.norm_attn(x)
    kp, v = self.attn.keys_values(h, positions)
    out, _ = self.attn(self.attn.queries(h, positions), kp, v, q_pos=positions, k_pos=positions,
                       key_lengths=src_lengths, fused=self.attn.fused)
    x = x + dropout(out, self.rate, k1)
    return x + dropout(self.ff(self.norm_ff(x)), self.rate, k2)


class DecoderLayer(nnx.Module):
  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, compute_dtype: str):
    self.rate = cfg.dropout
    self.norm_self = nnx.LayerNorm(cfg.d_model, rngs=rngs)
    self.self_attn = Attention(cfg, "dec_self", rngs=rngs, compute_dtype=compute_dtype)
    self.norm_cross = nnx.LayerNorm(cfg.d_model, rngs=rngs)
    self.cross = Attention(cfg, "cross", rngs=rngs, compute_dtype=compute_dtype)
    self.norm_ff = nnx.LayerNorm(cfg.d_model, rngs=rngs)
    self.ff = FeedForward(cfg, rngs=rngs, compute_dtype=compute_dtype)

  def cross_keys_values(self, memory):
    """Cross-attention keys and values of the encoder output [B, Ts, d] (no positions)."""
    return self.cross.keys_values(memory, None)

  def _rest(self, y, q_pos, cross_kv, src_lengths, keys, fused, reweigh=None):
    """Cross-attention and feed-forward after the self-attention block: (y, HeadAttention
    or None)."""
    h = self.norm_cross(y)
    out, att = self.cross(self.cross.queries(h, q_pos), *cross_kv, q_pos=q_pos, k_pos=None,
                          key_lengths=src_lengths, fused=fused, reweigh=reweigh)
    y = y + dropout(out, self.rate, keys[0])
    return y + dropout(self.ff(self.norm_ff(y)), self.rate, keys[1]), att

  def __call__(self, y, cross_kv, src_lengths, positions, key=None, reweigh=None):
    """Teacher forcing. y: [B, Tt, d]; positions: [1, Tt]; reweigh: see Attention.__call__
    (cross-attention). Returns (y, the cross-attention's HeadAttention of [B, H, Tt, Ts] arrays,
    or None)."""
    keys = _keys(key, 3)
    h = self.norm_self(y)
    kp, v = self.self_attn.keys_values(h, positions)
    # Causality alone keeps every valid query off target padding, which sits after it.
    out, _ = self.self_attn(self.self_attn.queries(h, positions), kp, v, q_pos=positions,
                            k_pos=positions, causal=True, fused=self.self_attn.fused)
    y = y + dropout(out, self.rate, keys[0])
    return self._rest(y, positions, cross_kv, src_lengths, keys[1:], self.cross.fused, reweigh)

  def step(self, y, cache, t, src_lengths):
    """One decoding step. y: [B, 1, d]; cache: {"k", "v": [B, H, C, dh'], "cross_k",
    "cross_v": [B, H, Ts, dh']}; t: [B] this step's position. Returns (y, cache with the step's
    key and value written at t, the cross-attention's HeadAttention [B, H, 1, Ts] or None)."""
    q_pos = t[:, None]  # [B, 1]
    h = self.norm_self(y)
    k_new, v_new = self.self_attn.keys_values(h, q_pos)  # [B, H, 1, dh']
    C = cache["k"].shape[-2]
    slots = jnp.arange(C)
    write = (slots == q_pos)[:, None, :, None]  # [B, 1, C, 1]
    k = jnp.where(write, k_new, cache["k"])
    v = jnp.where(write, v_new, cache["v"])
    mask = (slots <= q_pos)[:, None, :]  # [B, 1, C]: the keys written so far, causally
    out, _ = self.self_attn(self.self_attn.queries(h, q_pos), k, v, q_pos=q_pos,
                            k_pos=slots[None], mask=mask)
    y = y + out
    y, w = self._rest(y, q_pos, (cache["cross_k"], cache["cross_v"]), src_lengths, (None, None),
                      fused=False)
    return y, {**cache, "k": k, "v": v}, w


class _Embedding(nnx.Module):
  """Token embeddings times sqrt(d) (Vaswani et al. sec. 3.4) plus the positional encoding."""

  def __init__(self, cfg: ModelConfig, vocab: int, max_len: int, *, rngs: nnx.Rngs):
    self.embed = nnx.Embed(vocab, cfg.d_model, rngs=rngs)  # std d^-1/2: unit scale times sqrt(d)
    self.pos = _pos_encoding(cfg)
    self.pos_params = as_params(self.pos.init(rngs.params(), max_len, cfg.d_model))
    self.scale = math.sqrt(cfg.d_model)
    self.rate = cfg.dropout

  def __call__(self, ids, positions, key=None, offset=None):
    """ids: [B, T]; positions: [B or 1, T]; offset: [B, T, d] added to the looked-up
    embeddings (attribution). Returns [B, T, d] float32."""
    x = self.embed(ids)
    if offset is not None:
      x = x + offset
    x = self.pos.embed(values(self.pos_params), x * self.scale, positions)
    return dropout(x, self.rate, key)


class TransformerEncoder(nnx.Module):
  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, compute_dtype: str):
    self.embedding = _Embedding(cfg, cfg.src_vocab, cfg.max_src_len, rngs=rngs)
    self.layers = nnx.List([EncoderLayer(cfg, rngs=rngs, compute_dtype=compute_dtype)
                            for _ in range(cfg.enc_layers)])
    self.norm = nnx.LayerNorm(cfg.d_model, rngs=rngs)

  @property
  def embed(self) -> nnx.Embed:
    """The token lookup, under the RNN encoder's name (attribution reads it)."""
    return self.embedding.embed

  def __call__(self, src, src_lengths, *, dropout_key=None, embed_offset=None):
    """src: [B, Ts]; src_lengths: [B]. Returns [B, Ts, d] (rows past a length are never read)."""
    keys = _keys(dropout_key, len(self.layers) + 1)
    positions = jnp.arange(src.shape[1])[None]  # [1, Ts]
    x = self.embedding(src, positions, keys[0], embed_offset)
    for layer, key in zip(self.layers, keys[1:]):
      x = layer(x, src_lengths, positions, key)
    return self.norm(x)


class TransformerDecoder(nnx.Module):
  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, compute_dtype: str):
    self.compute_dtype = compute_dtype
    self.embedding = _Embedding(cfg, cfg.tgt_vocab, cfg.max_tgt_len, rngs=rngs)
    self.layers = nnx.List([DecoderLayer(cfg, rngs=rngs, compute_dtype=compute_dtype)
                            for _ in range(cfg.dec_layers)])
    self.norm = nnx.LayerNorm(cfg.d_model, rngs=rngs)
    self.out = None if cfg.tie_embeddings else linear(cfg.d_model, cfg.tgt_vocab,
                                                      compute_dtype=compute_dtype, rngs=rngs)

  def logits(self, y):
    """y: [..., d] -> [..., V] float32; tied: y E^T with the target embedding E (Press & Wolf
    2017), whose d^-1/2 scale keeps the logits O(1) for a layer-normalized y."""
    y = self.norm(y)
    if self.out is None:
      return _dense(y, self.embedding.embed.embedding[...].T, self.compute_dtype)
    return self.out(y)

  def __call__(self, memory, src_lengths, tgt_in, dropout_key=None, reweigh=None):
    """Teacher forcing on tgt_in [B, Tt] (BOS-shifted). reweigh: (weights [B, H, Tt, Ts],
    layer index) -> weights', applied to every layer's cross-attention. Returns (logits
    [B, Tt, V], the cross-attention of every layer, HeadAttention of [B, L, H, Tt, Ts] arrays,
    or None when it forms no weights)."""
    keys = _keys(dropout_key, len(self.layers) + 1)
    positions = jnp.arange(tgt_in.shape[1])[None]  # [1, Tt]
    y = self.embedding(tgt_in, positions, keys[0])
    atts = []
    for i, (layer, key) in enumerate(zip(self.layers, keys[1:])):
      layer_reweigh = None if reweigh is None else functools.partial(reweigh, layer=i)
      y, att = layer(y, layer.cross_keys_values(memory), src_lengths, positions, key,
                     reweigh=layer_reweigh)
      atts.append(att)
    stacked = None if atts[0] is None else jax.tree.map(lambda *x: jnp.stack(x, axis=1), *atts)
    return self.logits(y), stacked


def alignment(heads):
  """StepAttention.weights from every layer's cross-attention: layer ALIGNMENT_LAYER's head
  average. heads: [B, L, H, ..., Ts] -> [B, ..., Ts]."""
  return jnp.mean(heads[:, ALIGNMENT_LAYER], axis=1)


def _step_attention(att: HeadAttention) -> StepAttention:
  """Every layer's teacher-forced cross-attention [B, L, H, Tt, Ts] as the StepAttention the
  tasks read: weights = `alignment`, heads and the scores behind them kept whole."""
  return StepAttention(alignment(att.weights), scores=att.scores, heads=att.weights)


def _cache_overrun(cache_len):
  raise ValueError(
      f"Transformer decoding ran past its key/value cache of {cache_len} positions: pass "
      f"initial_decode_state(..., max_len=) the search's max_len, or raise model.max_tgt_len")


@registries.ARCHS.register("transformer")
class Transformer(nnx.Module):
  """Encoder-decoder Transformer; compute_dtype as for Seq2Seq (matmul operands only)."""

  @staticmethod
  def check_config(cfg: ModelConfig) -> None:
    """ConfigError, naming the field, for settings this model cannot run."""
    pos = registries.POS_ENCODINGS.get(cfg.pos_encoding)  # ConfigError naming the known ones
    if cfg.ff_activation not in ACTIVATIONS:
      raise ConfigError(f"model.ff_activation={cfg.ff_activation!r} unknown; known: "
                        f"{', '.join(ACTIVATIONS)}")
    for field in ("d_model", "num_heads", "d_ff", "max_tgt_len", "max_src_len"):
      if getattr(cfg, field) < 1:
        raise ConfigError(f"model.{field} must be positive, got {getattr(cfg, field)}")
    if cfg.d_model % cfg.num_heads:
      raise ConfigError(f"model.d_model={cfg.d_model} is not divisible by "
                        f"model.num_heads={cfg.num_heads}")
    for field in ("pointer", "coverage"):
      if getattr(cfg, field):
        raise ConfigError(f"model.{field}=True belongs to the recurrent decoders; "
                          "arch='transformer' has no such mechanism")
    if cfg.match_params_of:
      raise ConfigError("model.match_params_of sizes a recurrent decoder (dec_hidden); "
                        "arch='transformer' does not use it")
    # The recurrent decoder's attention settings would be silently ignored here: a sweep over
    # model.normalizer must not train the same Transformer N times.
    defaults = ModelConfig.__dataclass_fields__
    if cfg.decoder != defaults["decoder"].default:
      raise ConfigError(f"model.decoder={cfg.decoder!r} picks a recurrent decoder; "
                        "arch='transformer' has its own")
    for field in ("score", "normalizer", "temperature", "scope", "half_width"):
      if getattr(cfg, field) != defaults[field].default:
        raise ConfigError(
            f"model.{field}={getattr(cfg, field)!r} configures the recurrent decoder; "
            f"arch='transformer' takes it per attention: model.enc_self.{field}, "
            f"model.dec_self.{field}, model.cross.{field}")
    for field, spec in ROLES.items():
      _check_role(cfg, field, spec, pos)

  @staticmethod
  def forward_flops(cfg: ModelConfig, B: int, Ts: int, Tt: int) -> int:
    from attn.models import cost  # pylint: disable=import-outside-toplevel
    return cost.transformer_forward_flops(cfg, B, Ts, Tt)

  @staticmethod
  def output_width(cfg: ModelConfig) -> int:
    return cfg.d_model

  @staticmethod
  def attends(cfg: ModelConfig) -> bool:
    del cfg
    return True

  @staticmethod
  def describe(cfg: ModelConfig) -> dict:
    """The variant a run reports: the cross-attention's (what the heatmaps and AER read)."""
    c = cfg.cross
    return {"decoder": "transformer", "score": c.score, "normalizer": c.normalizer,
            "scope": c.scope, "temperature": c.temperature}

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, compute_dtype: str = "float32"):
    self.cfg = cfg
    self.encoder = TransformerEncoder(cfg, rngs=rngs, compute_dtype=compute_dtype)
    self.decoder = TransformerDecoder(cfg, rngs=rngs, compute_dtype=compute_dtype)

  @property
  def longest_output(self) -> int | None:
    """The most tokens a search can emit: a learned target-position table ends at its length
    (model.max_tgt_len; the model has seen no position past the training targets' anyway);
    None for the unbounded encodings."""
    table = self.decoder.embedding.pos_params
    return None if table is None else int(table["table"].shape[0])

  def __call__(self, batch, dropout_key=None):
    """Teacher-forced logits [B, Tt, V] and attention weights [B, Tt, Ts] (None when fused)."""
    logits, att = self.attention(batch, dropout_key)
    return logits, None if att is None else att.weights

  def attention(self, batch, dropout_key=None, embed_offset=None):
    """Teacher-forced logits [B, Tt, V] float32 along batch["tgt"] and the StepAttention:
    weights [B, Tt, Ts] (`alignment`), heads [B, L, H, Tt, Ts] and the raw scores behind the
    heads, scores [B, L, H, Tt, Ts] (a head average has no one score); None when the
    cross-attention forms no weights (fused, linear).
    embed_offset: [B, Ts, d] added to the source embeddings (before the sqrt(d) scale)."""
    k_enc, k_dec = (None, None) if dropout_key is None else jax.random.split(dropout_key)
    memory = self.encoder(batch["src"], batch["src_lengths"], dropout_key=k_enc,
                          embed_offset=embed_offset)
    logits, att = self.decoder(memory, batch["src_lengths"], shift_right(batch["tgt"]), k_dec)
    return logits, None if att is None else _step_attention(att)

  def counterfactual(self, batch, intervene, layers=None):
    """Teacher-forced logits along batch["tgt"], and the logits each step t would have had
    with its cross-attention, in every head of the decoder layers `layers` (indices; None =
    all), replaced by `intervene(weights [B, H, 1, Ts], mask [B, H, 1, Ts] bool, draw)` while
    every other step and layer keeps its real attention. Causal self-attention keeps the steps
    before t blind to the change, so, as for the recurrent decoders (Jain & Wallace 2019), each
    step's effect is measured alone with the prefix attending as it did. One decoder pass per step (lax.map),
    the encoder once; draw = t * L + layer, a distinct random draw per step and layer.
    Returns (logits, logits_cf [B, Tt, V] float32, StepAttention as `attention`)."""
    memory = self.encoder(batch["src"], batch["src_lengths"])
    tgt_in = shift_right(batch["tgt"])
    logits, att = self.decoder(memory, batch["src_lengths"], tgt_in)
    if att is None:
      raise ValueError("model.cross forms no attention weights (fused or linear): there is "
                       "nothing to intervene on; rebuild the model with model.fused=False")
    L, Ts = len(self.decoder.layers), memory.shape[1]
    chosen = range(L) if layers is None else [range(L)[i] for i in layers]  # IndexError if bad
    valid = (jnp.arange(Ts)[None, :] < batch["src_lengths"][:, None])[:, None, None, :]

    def at_step(t):
      def reweigh(w, layer):  # w: [B, H, Tt, Ts]; only row t changes
        if layer not in chosen:
          return w
        row = jax.lax.dynamic_slice_in_dim(w, t, 1, axis=2)
        new = intervene(row, jnp.broadcast_to(valid, row.shape), t * L + layer)
        return jax.lax.dynamic_update_slice_in_dim(w, new.astype(w.dtype), t, axis=2)

      cf, _ = self.decoder(memory, batch["src_lengths"], tgt_in, reweigh=reweigh)
      return jax.lax.dynamic_index_in_dim(cf, t, axis=1, keepdims=False)  # [B, V]

    cf = jax.lax.map(at_step, jnp.arange(tgt_in.shape[1]))  # [Tt, B, V]
    return logits, jnp.swapaxes(cf, 0, 1), _step_attention(att)

  def initial_decode_state(self, src, src_lengths, src_ext=None, *, max_len=None):
    """The decoding state (every leaf [B, ...]): the step count t, the source lengths and per
    decoder layer the cross-attention keys/values and an empty self-attention cache of C =
    max_len (the search's, when the caller passes it) or model.max_tgt_len positions.
    src_ext: unused (no pointer-generator)."""
    del src_ext
    C = self.cfg.max_tgt_len if max_len is None else int(max_len)
    table = self.decoder.embedding.pos_params
    if table is not None and C > table["table"].shape[0]:
      raise ValueError(f"learned target positions cover model.max_tgt_len="
                       f"{table['table'].shape[0]} steps; cannot decode max_len={C}")
    B = src.shape[0]
    memory = self.encoder(src, src_lengths)
    layers = []
    for layer in self.decoder.layers:
      ck, cv = layer.cross_keys_values(memory)
      # One position's key and value give the cache's head and feature sizes (dk' may differ
      # from dh for a score with a key-side projection); XLA drops the computation itself.
      k1, v1 = layer.self_attn.keys_values(memory[:, :1], jnp.zeros((1, 1), jnp.int32))
      layers.append({"k": jnp.zeros(k1.shape[:2] + (C,) + k1.shape[3:], k1.dtype),
                     "v": jnp.zeros(v1.shape[:2] + (C,) + v1.shape[3:], v1.dtype),
                     "cross_k": ck, "cross_v": cv})
    return {"t": jnp.zeros((B,), jnp.int32), "src_lengths": jnp.asarray(src_lengths),
            "layers": tuple(layers)}

  def step(self, state, y_prev):
    """One decoding step: (state, logits [B, V] float32, StepAttention with weights [B, Ts] and
    heads [B, L, H, Ts]; zero weights when the cross-attention forms none)."""
    t = state["t"]
    C = state["layers"][0]["k"].shape[-2]
    # The cache is a static size: a step past it would write nowhere and attend a wrong prefix.
    jax.lax.cond(jnp.any(t >= C), lambda: jax.debug.callback(_cache_overrun, C), lambda: None)
    y = self.decoder.embedding(y_prev[:, None], t[:, None])  # [B, 1, d]
    caches, ws = [], []
    for layer, cache in zip(self.decoder.layers, state["layers"]):
      y, cache, att = layer.step(y, cache, t, state["src_lengths"])
      caches.append(cache)
      ws.append(None if att is None else att.weights)
    logits = self.decoder.logits(y[:, 0])  # [B, V]
    if ws[0] is None:
      Ts = state["layers"][0]["cross_k"].shape[-2]
      att = StepAttention(jnp.zeros((y.shape[0], Ts), jnp.float32))
    else:
      heads = jnp.stack([w[:, :, 0] for w in ws], axis=1)  # [B, L, H, Ts]
      att = StepAttention(alignment(heads), heads=heads)
    return {**state, "t": t + 1, "layers": tuple(caches)}, logits, att

  def step_fn(self):
    """`step(state, y_prev [B]) -> (state, log_probs [B, V] float32, weights [B, Ts])` for
    attn.decoding (greedy and beam search)."""

    def step(state, y_prev):
      state, logits, att = self.step(state, y_prev)
      return state, jax.nn.log_softmax(logits.astype(jnp.float32)), att.weights

    return step


def _check_role(cfg: ModelConfig, field: str, spec: Role, pos) -> None:
  """The role's names, numbers and positional encoding, then one abstract evaluation of its
  attention (so a pairing attend refuses fails here, not mid-training)."""
  role = getattr(cfg, field)
  for name, kind in (("score", "score"), ("normalizer", "normalizer"), ("scope", "scope")):
    try:
      registry.get(getattr(role, name), kind)
    except KeyError as e:
      raise ConfigError(f"model.{field}.{name}: {e.args[0]}") from None
  if not role.temperature > 0:
    raise ConfigError(f"model.{field}.temperature must be > 0, got {role.temperature}")
  for name in ("half_width", "top_k"):
    if getattr(role, name) < 1:
      raise ConfigError(f"model.{field}.{name} must be positive, got {getattr(role, name)}")
  why = pos.unsupported(cfg, role) if spec.self_attention else None
  if why:
    raise ConfigError(f"model.{field} with model.pos_encoding={cfg.pos_encoding!r}: {why}")
  why = _attend_once(role, spec, pos if spec.self_attention else PositionalEncoding,
                     cfg.num_heads, cfg.d_model // cfg.num_heads)
  if why:
    raise ConfigError(f"model.{field}: {why}")


@functools.lru_cache(maxsize=None)
def _attend_once(role, spec: Role, pos, H: int, dh: int) -> str | None:
  """What attend_heads refuses about this role's variant (None if nothing), from an abstract
  evaluation on three positions; cached, as configs are rebuilt often (`replace`)."""
  T = 3

  def once():
    params = attn.init_multihead(jax.random.PRNGKey(0), H * dh, H, score=role.score, d_attn=dh,
                                 max_len=T, scope=role.scope)
    x = jnp.zeros((1, H, T, dh), jnp.float32)
    positions = jnp.arange(T)[None]
    return attend_heads(params, x, prepare_heads(role.score, params.get("score"), x), x, role,
                        causal=spec.causal, bias=pos.bias(H, positions, positions),
                        key_lengths=None if spec.causal else jnp.full((1,), T),
                        positions=positions)

  try:
    jax.eval_shape(once)
  except (ValueError, TypeError) as e:
    return str(e)
  return None
