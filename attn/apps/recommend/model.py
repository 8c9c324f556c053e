"""Next-item recommenders over a user's history (Flax NNX), registered by name in RECOMMENDERS:

- `sasrec`: causal self-attention over the history (Kang & McAuley 2018, SASRec): item
  embeddings plus learned positions (counted back from the history's end, as SASRec's
  left-padding does), L pre-LayerNorm blocks of `attn.multihead` (any registered
  score and normalizer) and a feed-forward layer, the item embedding shared as the output layer;
- `meanpool`: the mean of the embeddings of the items so far, through a feed-forward layer;
- `gru`: a GRU over the history (GRU4Rec, Hidasi et al. 2016), through a feed-forward layer.

Every model maps inputs [B, T] (right-padded item ids, PAD = 0) and lengths [B] (and a dropout
key while training) to one hidden
state per position, h [B, T, d], where position i has seen items 0..i only; the scores of all
items at i are h_i . E^T (E: the shared item embedding), PAD's scored -inf. The attention model
also returns its weights [B, L, H, T, T] (zero on padding keys and for padded queries).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import attn
from attn.config import configurable
from attn.config.configurable import option
from attn.errors import ConfigError
from attn.models.dropout import dropout
from attn.models.params import as_params, values
from attn.registry import Registry

RECOMMENDERS = Registry("model.kind", error=ConfigError)


@dataclasses.dataclass(frozen=True)
class RecommenderConfig:
  """The `model` section of experiments/configs/recommend.py."""
  kind: str = option("sasrec", "sasrec | meanpool | gru", names=RECOMMENDERS)
  dim: int = option(64, "item embedding and hidden size d")
  num_blocks: int = option(2, "sasrec: self-attention blocks L")
  num_heads: int = option(2, "sasrec: heads H per block")
  ffn_dim: int = option(128, "feed-forward width (every model's)")
  dropout: float = option(0.2, "dropout rate on the item embeddings and every residual branch "
                          "while training (SASRec's 0.2)")
  score: str = option("scaled_dot", "sasrec: attention score (attn.VARIANTS)",
                      names=attn.VARIANTS["score"])
  normalizer: str = option("softmax", "sasrec: attention normalizer (attn.VARIANTS)",
                           names=attn.VARIANTS["normalizer"])
  match_params: bool = option(True, "meanpool, gru: ffn_dim chosen so the parameter count is "
                              "closest to sasrec's at the same dim, num_blocks, num_heads")
  num_items: int = option(0, "items (from the data)", derived=True)
  max_len: int = option(0, "longest input (from the data)", derived=True)

  def __post_init__(self):
    # kind, score, normalizer: each fails with the list of known names (option(names=...)),
    # also when built here rather than from the config (configurable.from_config)
    configurable.check_names(RecommenderConfig, self, section="model")
    if not 0 <= self.dropout < 1:
      raise ConfigError(f"model.dropout={self.dropout} must be in [0, 1)")
    for name in ("dim", "num_blocks", "num_heads", "ffn_dim"):
      if getattr(self, name) < 1:
        raise ConfigError(f"model.{name}={getattr(self, name)} must be at least 1")
    if self.dim % self.num_heads:
      raise ConfigError(f"model.dim={self.dim} is not divisible by model.num_heads="
                        f"{self.num_heads}")

  @property
  def has_attention(self) -> bool:
    return RECOMMENDERS.get(self.kind).has_attention

  def record(self) -> dict:
    """model.json: the settings the checkpoints were trained with (attn.training.workdir), under
    one key, so the seq2seq records' migration (rnn/transformer sections) leaves them alone."""
    return {"recommender": dataclasses.asdict(self)}


class _Base(nnx.Module):
  """The shared item embedding and output head."""
  has_attention = False

  def __init__(self, cfg: RecommenderConfig, rngs: nnx.Rngs):
    self.cfg = cfg
    self.items = nnx.Embed(cfg.num_items + 1, cfg.dim, rngs=rngs,
                           embedding_init=nnx.initializers.normal(cfg.dim ** -0.5))
    self.ffn_in = nnx.Linear(cfg.dim, cfg.ffn_dim, rngs=rngs)
    self.ffn_out = nnx.Linear(cfg.ffn_dim, cfg.dim, rngs=rngs)

  def mlp(self, x):
    """The feed-forward layer, [..., d] -> [..., d] (the residual is the caller's)."""
    return self.ffn_out(jax.nn.gelu(self.ffn_in(x)))

  def drop(self, x, key, i: int):
    """Inverted dropout of `x` at model.dropout with the `i`th key folded from `key`; the
    identity when `key` is None (evaluation)."""
    return dropout(x, self.cfg.dropout, None if key is None else jax.random.fold_in(key, i))

  def logits(self, h):
    """h [..., d] -> scores of every item [..., num_items + 1], PAD at -inf."""
    s = jnp.einsum("...d,vd->...v", h, self.items.embedding[...])
    return s.at[..., 0].set(-jnp.inf)


@RECOMMENDERS.register("meanpool")
class MeanPool(_Base):
  """h_i = m_i + FFN(m_i), m_i the mean of E[x_0..x_i]: the history as an unordered bag, each
  item weighted 1/(i+1)."""

  def __call__(self, inputs, lengths, dropout_key=None):
    valid = (inputs != 0)[..., None].astype(jnp.float32)  # [B, T, 1]
    e = self.drop(self.items(inputs), dropout_key, 0)
    csum = jnp.cumsum(e * valid, axis=1)  # [B, T, d]
    count = jnp.maximum(jnp.cumsum(valid, axis=1), 1.0)
    m = csum / count
    return m + self.drop(self.mlp(m), dropout_key, 1), None


@RECOMMENDERS.register("gru")
class GRU(_Base):
  """h_i = s_i + FFN(s_i), s_i the GRU state after x_0..x_i (GRU4Rec)."""

  def __init__(self, cfg: RecommenderConfig, rngs: nnx.Rngs):
    super().__init__(cfg, rngs)
    self.rnn = nnx.RNN(nnx.GRUCell(cfg.dim, cfg.dim, rngs=rngs))

  def __call__(self, inputs, lengths, dropout_key=None):
    # Positions past a history's end get states too; the loss and the ranking never read them.
    s = self.rnn(self.drop(self.items(inputs), dropout_key, 0))  # [B, T, d]
    return s + self.drop(self.mlp(s), dropout_key, 1), None


@RECOMMENDERS.register("sasrec")
class SASRec(_Base):
  """Causal self-attention blocks over item + learned position embeddings (SASRec)."""
  has_attention = True

  def __init__(self, cfg: RecommenderConfig, rngs: nnx.Rngs):
    super().__init__(cfg, rngs)
    self.positions = nnx.Param(nnx.initializers.normal(cfg.dim ** -0.5)(
        rngs.params(), (cfg.max_len, cfg.dim)))
    self.attn_params = nnx.List([as_params(attn.init_multihead(
        rngs.params(), cfg.dim, cfg.num_heads, score=cfg.score, max_len=cfg.max_len))
                                 for _ in range(cfg.num_blocks)])
    self.norms = nnx.List([nnx.LayerNorm(cfg.dim, rngs=rngs) for _ in range(2 * cfg.num_blocks)])
    self.ffns_in = nnx.List([nnx.Linear(cfg.dim, cfg.ffn_dim, rngs=rngs)
                             for _ in range(cfg.num_blocks - 1)])
    self.ffns_out = nnx.List([nnx.Linear(cfg.ffn_dim, cfg.dim, rngs=rngs)
                              for _ in range(cfg.num_blocks - 1)])
    self.final_norm = nnx.LayerNorm(cfg.dim, rngs=rngs)

  def _block_mlp(self, l, x):
    # The last block's feed-forward layer is the one of _Base (same width as the others).
    if l == self.cfg.num_blocks - 1:
      return self.mlp(x)
    return self.ffns_out[l](jax.nn.gelu(self.ffns_in[l](x)))

  def __call__(self, inputs, lengths, dropout_key=None, *, embed_offset=None, reweigh=None):
    """embed_offset: [B, T, d] added to the item embeddings (the point where the diagnosis
    takes gradients). reweigh: (weights [B, H, T, T], mask [B, 1, T, T], layer) -> weights'
    (both in the left-padded frame, where every history ends at position T - 1): each block's
    output is recomputed with the weights it returns (the returned `w` stays the real one)."""
    cfg = self.cfg
    T = inputs.shape[-1]
    # SASRec left-pads: inside the blocks each history ends at position T - 1, so a learned
    # position says how recent an item is, and the final prediction always sits at the same
    # position whatever the history's length. Rows are rotated into that frame and back.
    shift = (T - lengths)[:, None]  # [B, 1]
    to_left = (jnp.arange(T)[None] - shift) % T  # [B, T]: left-frame i holds item i - shift
    to_right = (jnp.arange(T)[None] + shift) % T  # [B, T]: item j sits at left-frame j + shift
    valid = jnp.arange(T)[None] >= shift  # [B, T] in the left frame
    # query i sees keys j <= i of its own history; padded queries see nothing (zero weights).
    mask = attn.masks.causal_mask(T, T)[None] & valid[:, None, :] & valid[:, :, None]  # [B, T, T]
    items = jnp.take_along_axis(inputs, to_left, axis=1)
    e = self.items(items)
    if embed_offset is not None:
      e = e + jnp.take_along_axis(embed_offset, to_left[..., None], axis=1)
    x = self.drop(e + self.positions[...][cfg.max_len - T:], dropout_key, 0)
    weights = []
    for l in range(cfg.num_blocks):
      p, xn = values(self.attn_params[l]), self.norms[2 * l](x)
      y, w = attn.multihead(p, xn, num_heads=cfg.num_heads, score=cfg.score,
                            normalizer=cfg.normalizer, mask=mask)  # [B, T, d], [B, H, T, T]
      if reweigh is not None:
        y = y + _reweighed_change(p, xn, reweigh(w, mask[:, None], l) - w)
      x = x + self.drop(y, dropout_key, 2 * l + 1)
      x = x + self.drop(self._block_mlp(l, self.norms[2 * l + 1](x)), dropout_key, 2 * l + 2)
      weights.append(w)
    h = jnp.take_along_axis(self.final_norm(x), to_right[..., None], axis=1)  # [B, T, d]
    w = jnp.stack(weights, axis=1)  # [B, L, H, T, T], left frame
    w = jnp.take_along_axis(w, to_right[:, None, None, :, None], axis=3)
    w = jnp.take_along_axis(w, to_right[:, None, None, None, :], axis=4)
    return h, w  # both in the inputs' (right-padded) frame


def _reweighed_change(params, x, dw):
  """How attn.multihead's output moves when its weights change by dw [B, H, T, T]: the output
  is linear in the weights (sum_h (w_h V_h) W_o,h), so the change is (dw V) W_o, exactly 0 for
  dw = 0. x: [B, T, d] (the block's normalized input: keys and values)."""
  v = jnp.einsum("btd,dhe->bhte", x, params["wv"].astype(x.dtype))
  ctx = jnp.einsum("bhqk,bhke->bhqe", dw.astype(v.dtype), v)
  return jnp.einsum("bhte,hed->btd", ctx, params["wo"].astype(ctx.dtype)).astype(x.dtype)


def build(cfg: RecommenderConfig, seed: int = 0):
  """A freshly initialized model of `cfg.kind`."""
  return RECOMMENDERS.get(cfg.kind)(cfg, rngs=nnx.Rngs(seed))


def count_params(model) -> int:
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(nnx.state(model, nnx.Param))))
