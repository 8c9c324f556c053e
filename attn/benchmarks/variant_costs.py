r"""What each encoder self-attention variant solves and what it costs, against the length T.

    python -m experiments.variant_costs                 # the figure run (~15 min on 2 idle cores)
    python -m experiments.variant_costs --lengths=256,512 --quality_lengths=64 --train_steps=20

(experiments/variant_costs.py is the entry point: its flags are the fields of `Settings` here.)

Variants (the Transformer encoder's `model.transformer.enc_self` role, built through ModelConfig;
the model runs whatever path attn.models.transformer gives the role): global (softmax over every key),
window (keys |j - i| <= --half_width), topk (each query keeps its --top_k highest-scoring keys),
linear (Katharopoulos et al. 2020, elu+1 feature map) and fused (global softmax through
kernels.attention; on CPU its exact blocked path, whose 512-key blocks make it the dense
computation up to T=512 and O(T * 512) memory beyond).

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

Quality: associative recall (attn/benchmarks/recall.py). Every position but the last holds one (key, value)
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
the entry point turns it off, so the times are those of XLA's own CPU fusion. Timing and memory
come from attn.benchmarks.harness.

Writes --out/variant_costs.md (command, machine, jax version, date, table), variant_costs.json
(every number) and variant_costs.png (step time, peak memory and accuracy against T).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import time

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from attn.benchmarks import harness, recall
from attn.common.files import atomic_path, write_json, write_text
from attn.common.tables import markdown_table as _markdown_table
from attn.config.configurable import option
from attn.errors import ConfigError
from attn.common import plots
from attn.models.config import AttentionRole, ModelConfig, TransformerConfig
from attn.models.transformer_attention import Attention, fused_unsupported
from attn.models.transformer_layers import TransformerEncoder
from attn.registry import Registry


@dataclasses.dataclass(frozen=True)
class StudyVariant:
  """An encoder self-attention variant this study measures: the role's scope, and whether it
  runs through the fused kernels (model.fused)."""
  scope: str
  fused: bool = False


VARIANTS: Registry[StudyVariant] = Registry("variant", error=ConfigError)
VARIANTS.add("global", StudyVariant("global"))
VARIANTS.add("window", StudyVariant("window"))
VARIANTS.add("topk", StudyVariant("topk"))
VARIANTS.add("linear", StudyVariant("linear"))
VARIANTS.add("fused", StudyVariant("global", fused=True))
FIGURE_VARIANTS = ("global", "window", "topk", "linear", "fused")  # the figure's rows and colours


@dataclasses.dataclass(frozen=True)
class Settings:
  """Everything a run measures (the entry point's flags, one for one)."""
  variants: tuple[str, ...] = option(FIGURE_VARIANTS, "Variants: "
                                     f"{', '.join(FIGURE_VARIANTS)}.")
  lengths: tuple[int, ...] = option((256, 512, 1024, 2048, 4096, 8192), "T of the cost sweep.")
  quality_lengths: tuple[int, ...] = option((64, 256, 1024), "T of the associative-recall sweep.")
  d_model: int = option(64, "Encoder width.")
  heads: int = option(4, "Attention heads.")
  layers: int = option(2, "Encoder layers.")
  d_ff: int = option(256, "Feed-forward inner size.")
  batch: int = option(1, "Batch of the cost sweep.")
  half_width: int = option(64, "window: query i sees keys |j - i| <= this.")
  top_k: int = option(32, "topk: keys each query keeps.")
  warmup: int = option(1, "Untimed calls before timing a cell.")
  repeats: int = option(3, "Timed calls per cell (median reported).")
  max_memory_gib: float = option(8.0, "Cells whose compiled peak memory exceeds this are not "
                                 "run.")
  max_step_seconds: float = option(60.0, "Cells whose step (predicted from the previous T, or the "
                                   "first call) exceeds this are not timed.")
  train_steps: int = option(600, "Recall Adam steps per trained model (one per variant, or per "
                            "cell with --train_length=0).")
  # A train step at T=1024 takes seconds on 2 cores: training at every length does not fit a
  # short run (see the module docstring).
  train_length: int = option(64, "Train once per variant at this T and test at every "
                             "--quality_lengths (length transfer); 0: train at each quality "
                             "length.")
  train_batch: int = option(32, "Recall training batch.")
  learning_rate: float = option(1e-3, "Recall Adam learning rate.")
  num_keys: int = option(8, "Recall keys.")
  num_values: int = option(8, "Recall values (chance = 1 / this).")
  eval_examples: int = option(256, "Recall test examples per cell.")
  seed: int = option(0, "Random seed.")
  # Recall is content-only: positions would only add noise to the key match (the window and
  # top-k restrictions act on indices whatever the encoding).
  pos_encoding: str = option("none", "model.pos_encoding (none: recall is content-only).")

  def __post_init__(self):
    unknown = [v for v in self.variants if v not in VARIANTS]
    if unknown or not self.variants:
      raise ConfigError(f"--variants: unknown variant(s) {', '.join(unknown) or '(none given)'}; "
                        f"known: {', '.join(VARIANTS.names())}")
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
      cfg = model_config(self, v, 2)
      why = VARIANTS.get(v).fused and fused_unsupported(cfg, "enc_self")
      if why:  # the model would run it unfused: the row would not be what it says
        raise ConfigError(f"--variants={v}: {why}")

  @property
  def vocab(self) -> int:
    """num_keys * num_values pair tokens, then num_keys query tokens."""
    return self.num_keys * (self.num_values + 1)


def model_config(s: Settings, variant: str, max_len: int):
  """The Transformer ModelConfig whose encoder self-attention is `variant` (dropout off)."""
  v = VARIANTS.get(variant)
  return ModelConfig(
      arch="transformer", src_vocab=s.vocab, tgt_vocab=s.vocab, enc_layers=s.layers, dropout=0.0,
      fused=v.fused, max_src_len=max_len, transformer=TransformerConfig(
          d_model=s.d_model, num_heads=s.heads, d_ff=s.d_ff, pos_encoding=s.pos_encoding,
          enc_self=AttentionRole(scope=v.scope, half_width=s.half_width, top_k=s.top_k)))



# ----------------------------------------------------------------------------------------------
# The cost sweep.


def encoder_step(s: Settings, variant: str, T: int):
  """The encoder's jitted train step and its arguments (state, tokens [batch, T])."""
  cfg = model_config(s, variant, T)
  enc = TransformerEncoder(cfg, rngs=nnx.Rngs(s.seed), compute_dtype="float32")
  graphdef, state = nnx.split((enc, nnx.Optimizer(enc, optax.adam(1e-3), wrt=nnx.Param)))

  def loss_fn(model, tokens):
    # Every position's output enters the loss: no part of the step is dead code.
    return jnp.mean(model(tokens, recall.full_lengths(tokens)) ** 2)

  tokens = jax.random.randint(jax.random.PRNGKey(s.seed), (s.batch, T), 0, s.vocab, jnp.int32)
  return recall.jit_step(graphdef, loss_fn, update=True), (state, tokens)


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
               key_lengths=recall.full_lengths(x[..., 0]), fused=a.fused)  # [B, T, d], as EncoderLayer
    return jnp.mean(out ** 2)

  x = jax.random.normal(jax.random.PRNGKey(s.seed), (s.batch, T, s.d_model), jnp.float32)
  return recall.jit_step(graphdef, loss_fn, update=False), (state, x)


def measure_cell(s: Settings, build, variant: str, T: int, previous) -> dict:
  """Compiles `build(s, variant, T)`, reads its memory and times it unless a limit says not to.
  previous: (T, seconds) of this variant's last timed cell, or None. Returns {ms, mib, note}."""
  fn, args = build(s, variant, T)
  compiled = harness.compile(fn, *args)
  mem = harness.memory(compiled)
  peak = None if mem is None else mem.peak
  cell = {"ms": None, "mib": None if peak is None else peak / harness.MIB, "note": ""}
  if peak is not None and peak > s.max_memory_gib * harness.GIB:
    cell["note"] = f"needs {peak / harness.GIB:.1f} GiB > --max_memory_gib={s.max_memory_gib:g}"
    return cell
  if previous is not None:
    predicted = previous[1] * (T / previous[0]) ** 2  # no variant grows faster than T^2
    if predicted > s.max_step_seconds:
      cell["note"] = (f"predicted {predicted:.0f} s/step > --max_step_seconds="
                      f"{s.max_step_seconds:g}")
      return cell
  try:
    seconds = harness.median_seconds(compiled, [args], warmup=s.warmup, repeats=s.repeats,
                                     first_limit=s.max_step_seconds)
  except harness.TooSlow as e:
    cell["note"] = f"first call took {e.seconds:.0f} s > --max_step_seconds={e.limit:g}"
    return cell
  cell["ms"] = seconds * 1e3
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


# ----------------------------------------------------------------------------------------------
# The report.

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
  table = []
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
    table.append(cells)
  return _markdown_table(COLUMNS, table)


def plot(s: Settings, cost, quality, path: str):
  """Three panels against T (log x): step time, peak memory (encoder solid, attention layer
  dashed) and recall accuracy, one colour per variant."""
  plt = plots.pyplot()
  fig, axes = plt.subplots(1, 3, figsize=(15, 4.3))
  order = list(FIGURE_VARIANTS) + [v for v in VARIANTS.names() if v not in FIGURE_VARIANTS]
  colours = {v: plt.cm.tab10(i % 10) for i, v in enumerate(order)}
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
  with atomic_path(path, suffix=".png") as tmp:
    fig.savefig(tmp, dpi=110, format="png")
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
  for v in s.variants:  # the model's abstract checks (JAX), once, before any sweep
    model_config(s, v, 2).validate()
  meta = harness.machine()
  stamp(f"{meta['device']} ({meta['backend']}), {meta['cpu_count']} CPUs, jax {meta['jax']}; "
        f"{harness.cpu_line(meta['cpu'])}")
  cost = cost_sweep(s, stamp) if s.lengths else []
  quality = recall.quality_sweep(
      s, functools.partial(model_config, s), stamp) if s.quality_lengths else []
  rows = merged_rows(s, cost, quality)
  result = {"meta": {**meta, "command": command, "seconds": time.perf_counter() - t0},
            "settings": dataclasses.asdict(s), "cost": cost, "quality": quality, "rows": rows,
            "table": markdown_table(rows)}
  for path in write_outputs(s, out, result, command):
    stamp(f"wrote {path}")
  return result
