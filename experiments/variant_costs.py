r"""What each encoder self-attention variant solves and what it costs, against the length T.

    python -m experiments.variant_costs                 # the figure run (~15 min on 2 idle cores)
    python -m experiments.variant_costs --lengths=256,512 --quality_lengths=64 --train_steps=20

Variants (the Transformer encoder's `model.transformer.enc_self` role, built through
ModelConfig; the model runs whatever path attn.models.transformer gives the role): global
(softmax over every key), window (keys |j - i| <= --half_width), topk (each query keeps its
--top_k highest-scoring keys), linear (Katharopoulos et al. 2020, elu+1 feature map) and fused
(global softmax through kernels.attention; on CPU its exact blocked path, whose 512-key blocks
make it the dense computation up to T=512 and O(T * 512) memory beyond).

Cost, per variant and T in --lengths:
- encoder: one jitted training step of the TransformerEncoder (forward, backward of the mean
  squared encoder output, an optax Adam update) on a [--batch, T] token batch;
- attention: one multi-head `Attention` module (the encoder's enc_self role) forward and
  backward (gradients of its parameters and its input) on a [--batch, T, d_model] input.
Each is compiled first; its peak memory is XLA's compiled memory analysis (temporaries +
arguments + outputs). A cell whose memory exceeds --max_memory_gib, or whose step time
predicted from the variant's previous T (quadratic growth, the worst any variant has) or
measured on the first call exceeds --max_step_seconds, is not timed: "—" and the reason.
Otherwise: --warmup untimed calls, then the median of --repeats timed calls.

Quality: associative recall (`recall_batch`). Every position but the last holds one (key, value)
pair token; the last holds a query key that occurs in exactly one pair; the label is that pair's
value. The gold alignment is that pair's position (uniform over the sequence): the only position
whose token says what the answer is, so one attention hop from the query to it answers the task,
and a variant that cannot see or keep that position at the query cannot answer.

The encoder plus a linear readout at the query position trains --train_steps Adam steps on fresh
batches and is tested at each T in --quality_lengths: test accuracy (chance 1 / --num_values)
and the mean attention weight the query puts on the gold position, in the (layer, head) that
puts the most there (uniform attention puts 1/T). By default each variant trains once, at
--train_length=64, and is tested at every length: content matching learned at T=64 carries to
longer T (no positional encoding by default: the task is content-only), and a train step at
T=1024 takes seconds on 2 cores, so training at every length (--train_length=0) does not fit a
short run. Window attention with --half_width >= 63 trains as global attention and at longer T
sees the gold pair only when it lies within --half_width of the query (its second layer could
reach 2 * --half_width, a path training at T=64 never needed).

The gold weight is read the same way for every variant: each layer's attention is run again
through `attend_heads` on that layer's queries and keys with the values replaced by the one-hot
of the gold position, so the context is exactly the weight on it, also where the weights are
never formed (linear attention, the fused kernel). For window the rerun takes the masked form
of the window, the same restriction as the banded form the model may take.

Memory figures need XLA CPU's YNNPACK fusion off (it hides attention temporaries above T~2.9k);
`main` turns it off, so the times are those of XLA's own CPU fusion.

Writes --out/variant_costs.md (command, machine, jax version, date, table), variant_costs.json
(every number) and variant_costs.png (step time, peak memory and accuracy against T).
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import math
import os
import platform
import shlex
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import flags
from flax import nnx

from attn.inspection import plots
from attn.errors import ConfigError
from attn.models.config import AttentionRole, ModelConfig, TransformerConfig
from attn.models.params import values
from attn.models.transformer_attention import Attention, attend_heads, fused_unsupported
from attn.models.transformer_layers import TransformerEncoder
from attn.training.results import write_json, write_text
from attn.launching import cli

FLAGS = flags.FLAGS
MIB = 2.0 ** 20
GIB = 2.0 ** 30
# Without it XLA CPU's YNNPACK fusion reports 0 temporaries for attention above T~2.9k.
NO_YNN_FUSION = "--xla_cpu_experimental_ynn_fusion_type="


@dataclasses.dataclass(frozen=True)
class Variant:
  """An encoder self-attention variant: the role's scope, and whether it runs through the
  fused kernels (model.fused)."""
  scope: str
  fused: bool = False


VARIANTS = {
    "global": Variant("global"),
    "window": Variant("window"),
    "topk": Variant("topk"),
    "linear": Variant("linear"),
    "fused": Variant("global", fused=True),
}


@dataclasses.dataclass(frozen=True)
class Settings:
  """Everything a run measures (the flags of the entry point, one for one)."""
  variants: tuple[str, ...] = tuple(VARIANTS)
  lengths: tuple[int, ...] = (256, 512, 1024, 2048, 4096, 8192)  # cost sweep
  quality_lengths: tuple[int, ...] = (64, 256, 1024)  # associative-recall sweep
  d_model: int = 64
  heads: int = 4
  layers: int = 2
  d_ff: int = 256
  batch: int = 1  # cost batch
  half_width: int = 64  # window
  top_k: int = 32  # topk
  warmup: int = 1
  repeats: int = 3
  max_memory_gib: float = 8.0
  max_step_seconds: float = 60.0
  train_steps: int = 600
  # Train once per variant at this length and test at every quality length; 0: train at each
  # quality length (a train step at T=1024 takes seconds on 2 cores: see the module docstring).
  train_length: int = 64
  train_batch: int = 32
  learning_rate: float = 1e-3
  num_keys: int = 8
  num_values: int = 8
  eval_examples: int = 256
  seed: int = 0
  # Recall is content-only: positions would only add noise to the key match (the window and
  # top-k restrictions act on indices whatever the encoding).
  pos_encoding: str = "none"

  def __post_init__(self):
    unknown = [v for v in self.variants if v not in VARIANTS]
    if unknown or not self.variants:
      raise ConfigError(f"--variants: unknown variant(s) {', '.join(unknown) or '(none given)'}; "
                        f"known: {', '.join(VARIANTS)}")
    for name in ("lengths", "quality_lengths"):
      bad = [t for t in getattr(self, name) if t < 1]
      if bad:
        raise ConfigError(f"--{name}: lengths must be positive, got {bad}")
    if any(t < 2 for t in self.quality_lengths):
      raise ConfigError("--quality_lengths: a recall sequence needs at least one pair and the "
                        f"query (T >= 2), got {list(self.quality_lengths)}")
    for name in ("d_model", "heads", "layers", "d_ff", "batch", "half_width", "top_k",
                 "repeats", "train_batch", "num_values", "eval_examples"):
      if getattr(self, name) < 1:
        raise ConfigError(f"--{name} must be positive, got {getattr(self, name)}")
    if self.d_model % self.heads:
      raise ConfigError(f"--d_model={self.d_model} is not divisible by --heads={self.heads}")
    if self.num_keys < 2:
      raise ConfigError(f"--num_keys must be >= 2 (the query key and a distractor), got "
                        f"{self.num_keys}")
    if min(self.warmup, self.train_steps, self.train_length) < 0 or not (
        self.max_memory_gib > 0 and self.max_step_seconds > 0):
      raise ConfigError("--warmup, --train_steps and --train_length must be >= 0, "
                        "--max_memory_gib and --max_step_seconds > 0")
    if self.train_length == 1:
      raise ConfigError("--train_length: a recall sequence needs T >= 2 (or 0: every length)")
    for v in self.variants:  # the model's own checks (pos_encoding, sizes), before any sweep
      cfg = model_config(self, v, 2).validate()
      why = VARIANTS[v].fused and fused_unsupported(cfg, "enc_self")
      if why:  # the model would run it unfused: the row would not be what it says
        raise ConfigError(f"--variants={v}: {why}")

  @property
  def vocab(self) -> int:
    """num_keys * num_values pair tokens, then num_keys query tokens."""
    return self.num_keys * (self.num_values + 1)


def model_config(s: Settings, variant: str, max_len: int):
  """The Transformer ModelConfig whose encoder self-attention is `variant` (dropout off)."""
  v = VARIANTS[variant]
  return ModelConfig(
      arch="transformer", src_vocab=s.vocab, tgt_vocab=s.vocab, enc_layers=s.layers, dropout=0.0,
      fused=v.fused, max_src_len=max_len, transformer=TransformerConfig(
          d_model=s.d_model, num_heads=s.heads, d_ff=s.d_ff, pos_encoding=s.pos_encoding,
          enc_self=AttentionRole(scope=v.scope, half_width=s.half_width, top_k=s.top_k)))


# ----------------------------------------------------------------------------------------------
# The task.


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


# ----------------------------------------------------------------------------------------------
# Measurements.


def _jit_step(graphdef, loss_fn, *, update: bool):
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


def encoder_step(s: Settings, variant: str, T: int):
  """The encoder's jitted train step and its arguments (state, tokens [batch, T])."""
  cfg = model_config(s, variant, T)
  enc = TransformerEncoder(cfg, rngs=nnx.Rngs(s.seed), compute_dtype="float32")
  graphdef, state = nnx.split((enc, nnx.Optimizer(enc, optax.adam(1e-3), wrt=nnx.Param)))

  def loss_fn(model, tokens):
    # Every position's output enters the loss: no part of the step is dead code.
    return jnp.mean(model(tokens, full_lengths(tokens)) ** 2)

  tokens = jax.random.randint(jax.random.PRNGKey(s.seed), (s.batch, T), 0, s.vocab, jnp.int32)
  return _jit_step(graphdef, loss_fn, update=True), (state, tokens)


def attention_step(s: Settings, variant: str, T: int):
  """One enc_self `Attention` module's jitted forward and backward (gradients of its parameters
  and of the input x [batch, T, d_model]) and its arguments."""
  cfg = model_config(s, variant, T)
  module = Attention(cfg, "enc_self", rngs=nnx.Rngs(s.seed), compute_dtype="float32")
  graphdef, state = nnx.split(module)

  def loss_fn(a, x):
    positions = jnp.arange(x.shape[1])[None]  # [1, T]
    kp, v = a.keys_values(x, positions)
    out, _ = a(a.queries(x, positions), kp, v, q_pos=positions, k_pos=positions,
               key_lengths=full_lengths(x[..., 0]), fused=a.fused)  # [B, T, d], as EncoderLayer
    return jnp.mean(out ** 2)

  x = jax.random.normal(jax.random.PRNGKey(s.seed), (s.batch, T, s.d_model), jnp.float32)
  return _jit_step(graphdef, loss_fn, update=False), (state, x)


def peak_bytes(compiled) -> int | None:
  """Temporaries + arguments + outputs of a compiled executable (None without an analysis)."""
  m = compiled.memory_analysis()
  if m is None:
    return None
  return int(m.temp_size_in_bytes + m.argument_size_in_bytes + m.output_size_in_bytes)


def median_seconds(compiled, args, *, warmup: int, repeats: int, first_limit: float):
  """(median seconds of `repeats` calls after `warmup` untimed ones, None) or (None, why) when
  the first call alone took more than `first_limit` seconds."""
  for n in range(warmup):
    t0 = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    first = time.perf_counter() - t0
    if n == 0 and first > first_limit:
      return None, f"first call took {first:.0f} s > --max_step_seconds={first_limit:g}"
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    times.append(time.perf_counter() - t0)
  return float(np.median(times)), None


def measure_cell(s: Settings, build, variant: str, T: int, previous) -> dict:
  """Compiles `build(s, variant, T)`, reads its memory and times it unless a limit says not to.
  previous: (T, seconds) of this variant's last timed cell, or None. Returns {ms, mib, note}."""
  fn, args = build(s, variant, T)
  compiled = fn.lower(*args).compile()
  peak = peak_bytes(compiled)
  cell = {"ms": None, "mib": None if peak is None else peak / MIB, "note": ""}
  if peak is not None and peak > s.max_memory_gib * GIB:
    cell["note"] = f"needs {peak / GIB:.1f} GiB > --max_memory_gib={s.max_memory_gib:g}"
    return cell
  if previous is not None:
    predicted = previous[1] * (T / previous[0]) ** 2  # no variant grows faster than T^2
    if predicted > s.max_step_seconds:
      cell["note"] = (f"predicted {predicted:.0f} s/step > --max_step_seconds="
                      f"{s.max_step_seconds:g}")
      return cell
  seconds, why = median_seconds(compiled, args, warmup=s.warmup, repeats=s.repeats,
                                first_limit=s.max_step_seconds)
  cell["ms"], cell["note"] = (None if seconds is None else seconds * 1e3), why or ""
  return cell


def cost_sweep(s: Settings, log) -> list[dict]:
  """One row per (variant, T in s.lengths): encoder and attention-layer time and memory."""
  rows = []
  for variant in s.variants:
    previous = {"encoder": None, "attention": None}
    for T in sorted(s.lengths):
      row = {"variant": variant, "T": T}
      for part, build in (("encoder", encoder_step), ("attention", attention_step)):
        cell = measure_cell(s, build, variant, T, previous[part])
        row.update({f"{part}_ms": cell["ms"], f"{part}_mib": cell["mib"],
                    f"{part}_note": cell["note"]})
        if cell["ms"] is not None:
          previous[part] = (T, cell["ms"] / 1e3)
        elif not cell["note"].startswith("needs"):
          previous[part] = (T, math.inf)  # too slow here: longer T is too slow too
      rows.append(row)
      log(f"cost    {variant:<7} T={T:<6} encoder {_fmt(row['encoder_ms'])} ms "
          f"{_fmt(row['encoder_mib'])} MiB | attention {_fmt(row['attention_ms'])} ms "
          f"{_fmt(row['attention_mib'])} MiB"
          + "".join(f" [{p}: {row[p + '_note']}]" for p in ("encoder", "attention")
                    if row[p + "_note"]))
  return rows


def train_recall(s: Settings, variant: str, T: int, max_len: int):
  """Trains the encoder + readout on associative recall at length T for s.train_steps Adam
  steps on fresh batches. max_len: the longest T the model will be tested at (a learned
  position table's size). Returns (model, {final_train_loss, train_seconds})."""
  cfg = model_config(s, variant, max_len)
  model = RecallModel(cfg, s.num_values, rngs=nnx.Rngs(s.seed))
  graphdef, state = nnx.split((model, nnx.Optimizer(model, optax.adam(s.learning_rate),
                                                    wrt=nnx.Param)))

  def loss_fn(m, tokens, labels):
    return optax.softmax_cross_entropy_with_integer_labels(m(tokens), labels).mean()

  step = _jit_step(graphdef, loss_fn, update=True)
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


def evaluate_recall(s: Settings, model, T: int) -> dict:
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


def quality_sweep(s: Settings, log) -> list[dict]:
  """One row per (variant, T in s.quality_lengths): trained at T, or once per variant at
  s.train_length and tested at every T."""
  rows = []
  lengths = sorted(s.quality_lengths)
  max_len = max(lengths + [s.train_length])
  for variant in s.variants:
    model = None
    for T in lengths:
      if model is None or not s.train_length:
        model, info = train_recall(s, variant, s.train_length or T, max_len)
        log(f"quality {variant:<7} trained at T={info['train_T']}: {s.train_steps} steps, "
            f"final loss {info['final_train_loss']} ({info['train_seconds']:.0f} s)")
      rows.append({"variant": variant, "T": T, **info, **evaluate_recall(s, model, T)})
      r = rows[-1]
      log(f"quality {variant:<7} T={T:<6} accuracy {r['accuracy']:.3f}  gold weight "
          f"{r['gold_weight']:.3f} (L{r['gold_layer']}H{r['gold_head']})")
  return rows


# ----------------------------------------------------------------------------------------------
# Output.

COLUMNS = ("variant", "T", "encoder step ms", "encoder peak MiB", "attention step ms",
           "attention peak MiB", "recall accuracy", "query weight on gold", "notes")


def _fmt(v):
  """A time (ms) or memory (MiB) cell: three significant digits, thousands separated."""
  return "—" if v is None else (f"{v:.3g}" if v < 100 else f"{v:,.0f}")


def merged_rows(s: Settings, cost, quality) -> list[dict]:
  """One row per (variant, T) of either sweep, in variant then length order."""
  by_key = {}
  for r in cost + quality:
    by_key.setdefault((r["variant"], r["T"]), {}).update(r)
  order = {v: i for i, v in enumerate(s.variants)}
  return [by_key[k] for k in sorted(by_key, key=lambda k: (order[k[0]], k[1]))]


def markdown_table(rows) -> str:
  """Blank: that T is not in the cost (or quality) sweep; "—": measured not, see notes."""
  lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
  for r in rows:
    cells = [r["variant"], str(r["T"])]
    for part in ("encoder", "attention"):
      if f"{part}_mib" in r:
        cells += [_fmt(r[f"{part}_ms"]), _fmt(r[f"{part}_mib"])]
      else:
        cells += ["", ""]
    if "accuracy" in r:
      cells += [f"{r['accuracy']:.3f}",
                f"{r['gold_weight']:.3f} (L{r['gold_layer']}H{r['gold_head']})"]
    else:
      cells += ["", ""]
    notes = [f"{p}: {r[p + '_note']}" for p in ("encoder", "attention") if r.get(p + "_note")]
    cells.append("; ".join(notes))
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def _cpu_model() -> str:
  """The CPU's model name (Linux /proc/cpuinfo; platform.processor() is often empty there)."""
  try:
    with open("/proc/cpuinfo") as f:
      return next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
  except (OSError, StopIteration):
    return platform.processor() or platform.machine()


def machine() -> dict:
  return {"date": datetime.datetime.now().isoformat(timespec="seconds"),
          "platform": platform.platform(), "processor": _cpu_model(),
          "cpu_count": os.cpu_count(), "python": platform.python_version(),
          "jax": jax.__version__, "backend": jax.default_backend(),
          "device": str(jax.devices()[0].device_kind),
          "xla_flags": os.environ.get("XLA_FLAGS", "")}


def plot(s: Settings, cost, quality, path: str):
  """Three panels against T (log x): step time, peak memory (encoder solid, attention layer
  dashed) and recall accuracy, one colour per variant."""
  plt = plots.pyplot()
  fig, axes = plt.subplots(1, 3, figsize=(15, 4.3))
  colours = {v: plt.cm.tab10(i) for i, v in enumerate(VARIANTS)}
  for v in s.variants:
    rows = [r for r in cost if r["variant"] == v]
    for part, style in (("encoder", "-"), ("attention", "--")):
      for ax, field in ((axes[0], f"{part}_ms"), (axes[1], f"{part}_mib")):
        pts = [(r["T"], r[field]) for r in rows if r[field] is not None]
        if pts:
          ax.plot(*zip(*pts), style, marker="o", ms=3, color=colours[v],
                  label=f"{v} ({'encoder step' if part == 'encoder' else 'attention layer'})")
    pts = [(r["T"], r["accuracy"]) for r in quality if r["variant"] == v]
    if pts:
      axes[2].plot(*zip(*pts), "-", marker="o", color=colours[v], label=v)
  axes[0].set(xscale="log", yscale="log", xlabel="T", ylabel="ms per step (median)",
              title="time: train step (solid), attention fwd+bwd (dashed)")
  axes[1].set(xscale="log", yscale="log", xlabel="T", ylabel="peak MiB (XLA memory analysis)",
              title="memory: temporaries + arguments + outputs")
  trained = f"trained at T={s.train_length}" if s.train_length else "trained at each T"
  axes[2].set(xscale="log", ylim=(-0.02, 1.02), xlabel="T", ylabel="test accuracy",
              title=f"associative recall ({trained}; chance {1 / s.num_values:.2g})")
  axes[2].axhline(1 / s.num_values, color="grey", lw=0.8, ls=":")
  for ax, lengths in zip(axes, (s.lengths, s.lengths, s.quality_lengths)):
    if lengths:  # the swept lengths as plain numbers, not log-scale powers of ten
      ax.set_xticks(sorted(lengths), labels=[str(t) for t in sorted(lengths)])
      ax.set_xticks([], minor=True)
    ax.grid(True, which="both", alpha=0.3)
  for ax, size, ncol in ((axes[0], 6, 2), (axes[2], 7, 1)):
    if ax.get_legend_handles_labels()[0]:  # an empty sweep draws nothing to name
      ax.legend(fontsize=size, ncol=ncol)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def write_outputs(s: Settings, out: str, result: dict, command: str) -> list[str]:
  os.makedirs(out, exist_ok=True)
  meta = result["meta"]
  paths = [os.path.join(out, f"variant_costs.{ext}") for ext in ("md", "json", "png")]
  text = "\n".join([
      "# Attention variants: what each solves and what it costs", "",
      f"    {command}", "",
      f"Machine: {meta['platform']}, {meta['cpu_count']} CPUs ({meta['processor']}), "
      f"{meta['backend']} backend; jax {meta['jax']}, python {meta['python']}; "
      f"{meta['date']}; XLA_FLAGS={meta['xla_flags']!r}.", "",
      f"Encoder: {s.layers} layers, d_model {s.d_model}, {s.heads} heads, d_ff {s.d_ff}; window "
      f"half width {s.half_width}, top_k {s.top_k}. Cost: batch {s.batch}, median of "
      f"{s.repeats} calls after {s.warmup} warm-up; peak = XLA temporaries + arguments + "
      f"outputs. Recall: {s.num_keys} keys x {s.num_values} values, positional encoding "
      f"{s.pos_encoding}, {s.train_steps} Adam steps (lr {s.learning_rate:g}) of batch "
      f"{s.train_batch} at "
      + (f"T={s.train_length}, tested at each T" if s.train_length else "each T")
      + f", {s.eval_examples} test examples; "
      f"chance accuracy {1 / s.num_values:.3f}; the gold weight is the query's mean weight on "
      f"the gold pair in its best layer L / head H (uniform attention: 1/T).", "",
      markdown_table(result["rows"]), ""])
  write_text(paths[0], text)
  write_json(paths[1], result)
  plot(s, result["cost"], result["quality"], paths[2])
  return paths


def run(s: Settings, out: str, command: str = "", log=print) -> dict:
  """The cost sweep, then the quality sweep; writes the three files under `out` and returns
  {"meta", "settings", "cost", "quality", "rows", "table"}."""
  t0 = time.perf_counter()
  stamp = lambda msg: log(f"[{time.perf_counter() - t0:7.1f}s] {msg}")
  meta = machine()
  stamp(f"{meta['device']} ({meta['backend']}), {meta['cpu_count']} CPUs, jax {meta['jax']}")
  cost = cost_sweep(s, stamp) if s.lengths else []
  quality = quality_sweep(s, stamp) if s.quality_lengths else []
  rows = merged_rows(s, cost, quality)
  result = {"meta": {**meta, "command": command, "seconds": time.perf_counter() - t0},
            "settings": dataclasses.asdict(s), "cost": cost, "quality": quality, "rows": rows,
            "table": markdown_table(rows)}
  for path in write_outputs(s, out, result, command):
    stamp(f"wrote {path}")
  return result


# ----------------------------------------------------------------------------------------------
# Entry point.


def define_flags():
  """Defined on demand (as experiments/demo.py), so tests can import this module next to other
  flag-defining ones. Defaults are Settings' own."""
  d = Settings()
  flags.DEFINE_list("variants", list(d.variants), f"Variants: {', '.join(VARIANTS)}.")
  flags.DEFINE_list("lengths", [str(t) for t in d.lengths], "T of the cost sweep.")
  flags.DEFINE_list("quality_lengths", [str(t) for t in d.quality_lengths],
                    "T of the associative-recall sweep.")
  flags.DEFINE_integer("d_model", d.d_model, "Encoder width.")
  flags.DEFINE_integer("heads", d.heads, "Attention heads.")
  flags.DEFINE_integer("layers", d.layers, "Encoder layers.")
  flags.DEFINE_integer("d_ff", d.d_ff, "Feed-forward inner size.")
  flags.DEFINE_integer("batch", d.batch, "Batch of the cost sweep.")
  flags.DEFINE_integer("half_width", d.half_width, "window: query i sees keys |j - i| <= this.")
  flags.DEFINE_integer("top_k", d.top_k, "topk: keys each query keeps.")
  flags.DEFINE_integer("warmup", d.warmup, "Untimed calls before timing a cell.")
  flags.DEFINE_integer("repeats", d.repeats, "Timed calls per cell (median reported).")
  flags.DEFINE_float("max_memory_gib", d.max_memory_gib,
                     "Cells whose compiled peak memory exceeds this are not run.")
  flags.DEFINE_float("max_step_seconds", d.max_step_seconds,
                     "Cells whose step (predicted from the previous T, or the first call) "
                     "exceeds this are not timed.")
  flags.DEFINE_integer("train_steps", d.train_steps, "Recall Adam steps per trained model (one per "
                       "variant, or per cell with --train_length=0).")
  flags.DEFINE_integer("train_length", d.train_length,
                       "Train once per variant at this T and test at every --quality_lengths "
                       "(length transfer); 0: train at each quality length.")
  flags.DEFINE_integer("train_batch", d.train_batch, "Recall training batch.")
  flags.DEFINE_float("learning_rate", d.learning_rate, "Recall Adam learning rate.")
  flags.DEFINE_integer("num_keys", d.num_keys, "Recall keys.")
  flags.DEFINE_integer("num_values", d.num_values, "Recall values (chance = 1 / this).")
  flags.DEFINE_integer("eval_examples", d.eval_examples, "Recall test examples per cell.")
  flags.DEFINE_integer("seed", d.seed, "Random seed.")
  flags.DEFINE_string("pos_encoding", d.pos_encoding,
                      "model.transformer.pos_encoding (none: recall is content-only).")
  flags.DEFINE_string("out", "workdirs/variant_costs", "Output directory.")


def _ints(name: str, items) -> tuple[int, ...]:
  try:
    return tuple(int(v) for v in items)
  except ValueError:
    raise ConfigError(f"--{name} takes integers, got {','.join(items)}") from None


def settings_from_flags() -> Settings:
  names = {f.name for f in dataclasses.fields(Settings)}
  kw = {n: FLAGS[n].value for n in names}
  kw.update(variants=tuple(FLAGS.variants), lengths=_ints("lengths", FLAGS.lengths),
            quality_lengths=_ints("quality_lengths", FLAGS.quality_lengths))
  return Settings(**kw)


def main(argv):
  del argv
  # Read when the CPU backend starts (the first computation), which is after this line.
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + NO_YNN_FUSION).strip()
  s = settings_from_flags()  # a bad flag ends here, before any measurement
  command = "python -m experiments.variant_costs " + " ".join(shlex.quote(a) for a in sys.argv[1:])
  result = run(s, FLAGS.out, command)
  print()
  print(result["table"])


if __name__ == "__main__":
  define_flags()
  cli.run(main)
