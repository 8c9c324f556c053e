"""The Transformer encoder-decoder (Vaswani et al. 2017) on this repo's attention primitives.

`model.arch=transformer`, settings in `model.transformer` (TransformerConfig): an
`attn.models.architecture.Architecture` as `Seq2Seq` is, so the training loop, evaluation,
`attn.decoding` and the look-inside tools run it as they run the RNNs. Its parts:
attn.models.transformer_attention (the multi-head attention of each role) and
attn.models.transformer_layers (layers, embeddings, the encoder and decoder stacks).

Axis names: B batch, Ts source length, Tt target length, d = d_model, H heads, dh = d / H head
size, L decoder layers, V target vocabulary, C the decoding cache length.

- Three attention roles, each with its own variant (`model.transformer.enc_self`, `.dec_self`,
  `.cross`: score, normalizer, temperature, scope). `model.fused=True` sends a role through
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

import jax
import jax.numpy as jnp
from flax import nnx

from attn import registry
from attn.data.tokens import BOS
from attn.errors import ConfigError
from attn.models import registries
from attn.models.config import ModelConfig, TransformerConfig, check_attention_numbers
from attn.models.decoders import StepAttention
from attn.models.positions import PositionalEncoding
from attn.models.seq2seq import shift_right
from attn.models.transformer_attention import ROLES, Role, attend_once
from attn.models.transformer_layers import (ACTIVATIONS, ALIGNMENT_LAYER, PackedMasks,
                                            TransformerDecoder, TransformerEncoder, alignment,
                                            step_attention)

__all__ = ["ALIGNMENT_LAYER", "Transformer", "alignment"]


def _cache_len(state) -> int:
  """Positions the decoding state's key/value cache holds (static)."""
  return state["layers"][0]["k"].shape[-2]


def _cache_overrun(cache_len, max_len=None):
  raise ValueError(
      f"Transformer decoding ran past its key/value cache of {cache_len} positions"
      + (f" (the search's max_len is {max_len})" if max_len is not None else "")
      + ": pass initial_decode_state(..., max_len=) the search's max_len, or raise "
      "model.transformer.max_tgt_len")


@registries.ARCHS.register("transformer")
class Transformer(nnx.Module):
  """Encoder-decoder Transformer; compute_dtype as for Seq2Seq (matmul operands only)."""

  settings = TransformerConfig  # its section, model.transformer

  @staticmethod
  def check_config(cfg: ModelConfig) -> None:
    """ConfigError, naming the field, for settings this model cannot run (no JAX)."""
    tc = cfg.transformer
    pos = registries.POS_ENCODINGS.get(tc.pos_encoding)  # ConfigError naming the known ones
    if tc.ff_activation not in ACTIVATIONS:
      raise ConfigError(f"model.transformer.ff_activation={tc.ff_activation!r} unknown; known: "
                        f"{', '.join(ACTIVATIONS)}")
    for field in ("d_model", "num_heads", "d_ff", "max_tgt_len"):
      if getattr(tc, field) < 1:
        raise ConfigError(f"model.transformer.{field} must be positive, got "
                          f"{getattr(tc, field)}")
    if tc.share_embeddings and cfg.src_vocab != cfg.tgt_vocab:
      raise ConfigError(f"model.transformer.share_embeddings=True needs one vocabulary for both "
                        f"sides (data.shared_vocab=True); got src_vocab={cfg.src_vocab}, "
                        f"tgt_vocab={cfg.tgt_vocab}")
    if tc.d_model % tc.num_heads:
      raise ConfigError(f"model.transformer.d_model={tc.d_model} is not divisible by "
                        f"model.transformer.num_heads={tc.num_heads}")
    for field, spec in ROLES.items():
      _check_role(cfg, field, spec, pos)

  @staticmethod
  def check_shapes(cfg: ModelConfig) -> None:
    """One abstract evaluation of each role's attention (so a pairing attend refuses fails in
    validation, not mid-training): ConfigError naming the role."""
    tc = cfg.transformer
    pos = registries.POS_ENCODINGS.get(tc.pos_encoding)
    for field, spec in ROLES.items():
      why = attend_once(getattr(tc, field), spec, pos if spec.self_attention else
                        PositionalEncoding, tc.num_heads, tc.d_head)
      if why:
        raise ConfigError(f"model.transformer.{field}: {why}")

  @staticmethod
  def forward_flops(cfg: ModelConfig, B: int, Ts: int, Tt: int) -> int:
    from attn.models import cost  # pylint: disable=import-outside-toplevel
    return cost.transformer_forward_flops(cfg, B, Ts, Tt)

  @staticmethod
  def output_width(cfg: ModelConfig) -> int:
    return cfg.transformer.d_model

  @staticmethod
  def attends(cfg: ModelConfig) -> bool:
    del cfg
    return True

  @staticmethod
  def length_limits(cfg: ModelConfig) -> dict[str, tuple[str, int, str]]:
    """A learned position table bounds both sides (model.max_src_len, .transformer.max_tgt_len),
    as does a positional score (location) on the roles whose keys lie on that side."""
    tc = cfg.transformer
    bounds = {"source": ("model.max_src_len", cfg.max_src_len),
              "target": ("model.transformer.max_tgt_len", tc.max_tgt_len)}
    out = {}
    if registries.POS_ENCODINGS.get(tc.pos_encoding).bounded:
      why = f"model.transformer.pos_encoding={tc.pos_encoding!r}"
      return {side: (*bound, why) for side, bound in bounds.items()}
    for field, spec in ROLES.items():
      score = getattr(tc, field).score
      side = "target" if spec.keys_on_target else "source"
      if registry.get(score, "score").positional and side not in out:
        out[side] = (*bounds[side], f"model.transformer.{field}.score={score!r}")
    return out

  @staticmethod
  def describe(cfg: ModelConfig) -> dict:
    """The variant a run reports: the cross-attention's (what the heatmaps and AER read)."""
    c = cfg.transformer.cross
    return {"decoder": "transformer", "score": c.score, "normalizer": c.normalizer,
            "scope": c.scope, "temperature": c.temperature}

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, compute_dtype: str = "float32"):
    self.cfg = cfg
    self.encoder = TransformerEncoder(cfg, rngs=rngs, compute_dtype=compute_dtype)
    self.decoder = TransformerDecoder(cfg, rngs=rngs, compute_dtype=compute_dtype)
    if cfg.transformer.share_embeddings:  # one nnx.Embed in both places: one trained matrix
      self.encoder.embedding.embed = self.decoder.embedding.embed

  @property
  def longest_output(self) -> int | None:
    """The most tokens a search can emit: a learned target-position table ends at its length
    (model.transformer.max_tgt_len; the model has seen no position past the training targets'
    anyway); None for the unbounded encodings."""
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
    packed = PackedMasks.of(batch)
    memory = self.encoder(batch["src"], batch["src_lengths"], dropout_key=k_enc,
                          embed_offset=embed_offset, packed=packed)
    tgt_in = shift_right(batch["tgt"])
    if packed is not None:  # every example of a row starts from BOS
      tgt_in = jnp.where(packed.tgt_positions == 0, BOS, tgt_in)
    logits, att = self.decoder(memory, batch["src_lengths"], tgt_in, k_dec, packed=packed)
    return logits, None if att is None else step_attention(att)

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
      raise ValueError("model.transformer.cross forms no attention weights (fused or linear): there is "
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
    return logits, jnp.swapaxes(cf, 0, 1), step_attention(att)

  def initial_decode_state(self, src, src_lengths, src_ext=None, *, max_len=None):
    """The decoding state (every leaf [B, ...]): the step count t, the source lengths and per
    decoder layer the cross-attention keys/values and an empty self-attention cache of C =
    max_len (the search's, when the caller passes it) or model.transformer.max_tgt_len positions.
    src_ext: unused (no pointer-generator)."""
    del src_ext
    C = self.cfg.transformer.max_tgt_len if max_len is None else int(max_len)
    table = self.decoder.embedding.pos_params
    if table is not None and C > table["table"].shape[0]:
      raise ValueError(f"learned target positions cover model.transformer.max_tgt_len="
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

  def step(self, state, y_prev, *, check_cache: bool = True):
    """One decoding step: (state, logits [B, V] float32, StepAttention with weights [B, Ts] and
    heads [B, L, H, Ts]; zero weights when the cross-attention forms none).

    check_cache: raise when a row's step t is past the key/value cache (a run-time check, through
    a host callback); `step_fn` leaves it to the searches, which check the cache's size against
    their max_len before they start."""
    t = state["t"]
    C = _cache_len(state)
    if check_cache:
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
      state, logits, att = self.step(state, y_prev, check_cache=False)
      return state, jax.nn.log_softmax(logits.astype(jnp.float32)), att.weights

    def check_room(state, max_len):  # attn.decoding.step.check_room, before the search starts
      if max_len > _cache_len(state):
        _cache_overrun(_cache_len(state), max_len)

    step.check_room = check_room
    return step


def _check_role(cfg: ModelConfig, field: str, spec: Role, pos) -> None:
  """The role's numbers and positional encoding (its names: ModelConfig's check_names; its
  abstract evaluation: check_shapes)."""
  role = getattr(cfg.transformer, field)
  where = f"model.transformer.{field}"
  check_attention_numbers(where, role)
  why = pos.unsupported(cfg, role) if spec.self_attention else None
  if why:
    raise ConfigError(f"{where} with model.transformer.pos_encoding="
                      f"{cfg.transformer.pos_encoding!r}: {why}")
