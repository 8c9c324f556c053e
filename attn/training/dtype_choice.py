"""`train.compute_dtype=auto`: the compute dtype chosen by measuring this machine, resolved once,
in `attn.training.building.build_run`, before the model is built; everything after it (the model,
the step, config.json, results.json) sees the concrete dtype, float32 or bfloat16.

Whether bfloat16 matmuls beat float32 ones is a property of the machine and of the shapes, not
of a CPU flag: on a 2-core Xeon with AVX512_BF16 and no AMX, XLA's bfloat16 matmuls ran at
166-184 GFLOP/s against 249-336 in float32 (a bfloat16 step 0.79x float32's for the RNN, 0.85x
for the Transformer), while on an EPYC with AVX512_BF16 they ran at twice float32's rate. So
`auto` times a few matmuls of the model's own shapes (`matmul_shapes`: the output layer
[rows, D] x [D, V] and the architecture's layer matmuls, e.g. [rows, d] x [d, d_ff]) in both
dtypes, bfloat16 operands accumulating in float32 as the model's matmuls do
(attn.precision.matmul), after a warm-up, median of REPEATS, in about a second; bfloat16 runs
only where it is faster by MARGIN, else float32.

- Cached: the two rates are kept per CPU (model name and flags from /proc/cpuinfo, else
  platform.processor()), jaxlib version, backend and shapes, in `dtype_choice/` inside the
  compilation cache's directory (attn.common.compile_cache: ATTN_COMPILE_CACHE or its default),
  written atomically; a rerun reads them back instead of measuring. With the cache off or
  unwritable, every run measures.
- A resumed run keeps its dtype: a workdir with checkpoints has its dtype in config.json
  (which records the resolved dtype, never `auto`), and `auto` reads it back without measuring.
  An explicit dtype that differs from the recorded one is taken, as other `train` settings
  changed on resume are (the parameters and optimizer state are float32 in both), with one log
  line saying so.
- On a GPU or TPU backend `auto` is bfloat16 without measuring: both run bfloat16 matmuls on
  their matrix units at several times float32's rate (a TPU runs float32 matmuls as several
  bfloat16 passes; a GPU's tensor cores take bfloat16 at twice TF32's rate), and mixed
  precision with float32 accumulation is their standard way to train.
- With several processes, process 0's choice is every process's (one program for all).

The choice (`Choice`) is logged in one line and written to results.json under
`compute_dtype_choice`, and to the workdir's compute_dtype.json (the rates a resumed run reports).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import platform
import time

import numpy as np

from attn.common import compile_cache, files
from attn.common.cpu import cpuinfo_fields
from attn.precision import AUTO, COMPUTE_DTYPES

log = logging.getLogger(__name__)

# bfloat16 must beat float32 by this factor to be chosen. Below it the gain is within what
# other jobs' load moves a one-second measurement by on a shared machine, and bfloat16 rounds
# every matmul operand to 8 mantissa bits: a choice that might be noise is not worth that.
MARGIN = 1.10
REPEATS = 5  # timed calls per shape and dtype, after one warm-up; the median counts
# Rows of a measured matmul: the tokens of a batch (data.tokens_per_batch, else data.batch_size
# sentences of TOKENS_PER_ROW tokens, about a Multi30k sentence), at most MAX_ROWS, and fewer
# where a shape would pass MAX_FLOP a call: the rate hardly moves past a few hundred rows, and
# a 30k-word output layer at 1,024 rows would take the measurement past a second.
TOKENS_PER_ROW = 16
MAX_ROWS = 1024
MIN_ROWS = 64
MAX_FLOP = 5e8
RECORD = "compute_dtype.json"  # the workdir's record of the choice


@dataclasses.dataclass(frozen=True)
class Choice:
  """The compute dtype a run uses and why. asked: the config's value (auto, float32 or
  bfloat16); dtype: what runs; how: measured | cache | resumed | backend | asked; rates:
  {"float32": GFLOP/s, "bfloat16": GFLOP/s} of the model's matmul shapes that chose it (None
  when nothing was measured)."""
  asked: str
  dtype: str
  how: str
  rates: dict | None = None

  def line(self) -> str:
    """One log line, e.g. `compute dtype float32 (train.compute_dtype=auto: the model's matmuls
    at 312 GFLOP/s in float32, 250 in bfloat16, from the cache; bfloat16 needs 1.10x)`."""
    why = {"measured": "measured now", "cache": "from the cache", "resumed":
           "as the run so far (config.json)", "backend": "bfloat16 on a GPU/TPU",
           "asked": "as asked"}[self.how]
    text = f"compute dtype {self.dtype} (train.compute_dtype={self.asked}"
    if self.rates:
      text += (f": the model's matmuls at {self.rates['float32']:.0f} GFLOP/s in float32, "
               f"{self.rates['bfloat16']:.0f} in bfloat16, {why}; bfloat16 needs "
               f"{MARGIN:.2f}x)")
    else:
      text += f": {why})"
    return text

  def record(self) -> dict:
    return dataclasses.asdict(self)


# -- the shapes


def _rnn_shapes(mc, rows: int, batch: int) -> list[tuple[int, int, int]]:
  """The encoder's input projection over the source tokens and the decoder cell's recurrent
  matmul over the batch's rows (one per target step)."""
  from attn.models import registries  # pylint: disable=import-outside-toplevel
  r = mc.rnn
  gates = registries.CELLS.get(r.cell).gates
  return [(rows, r.emb_dim, gates * r.enc_hidden), (batch, r.dec_hidden, gates * r.dec_hidden)]


def _transformer_shapes(mc, rows: int, batch: int) -> list[tuple[int, int, int]]:
  """A projection (q, k, v, o) and the feed-forward's two matmuls over the batch's tokens."""
  del batch
  d, f = mc.transformer.d_model, mc.transformer.d_ff
  return [(rows, d, d), (rows, d, f), (rows, f, d)]


# The layer matmuls of each architecture; an architecture not listed is measured on its output
# layer alone (that layer is a large share of every architecture's step here).
_LAYER_SHAPES = {"rnn": _rnn_shapes, "transformer": _transformer_shapes}


def matmul_shapes(mc, batch_size: int,
                  tokens_per_batch: int = 0) -> tuple[tuple[int, int, int], ...]:
  """(M, K, N) of the matmuls [M, K] x [K, N] that `auto` times for model config `mc` (a
  sequence-to-sequence ModelConfig: its arch, its section's sizes, its target vocabulary) with
  batches of `batch_size` sentences (or `tokens_per_batch` tokens): the output layer
  [rows, D] x [D, V] and the architecture's layer matmuls, rows as the constants above say."""
  from attn.models import registries  # pylint: disable=import-outside-toplevel
  rows = min(MAX_ROWS, tokens_per_batch or batch_size * TOKENS_PER_ROW)
  arch = getattr(mc, "arch", None)
  shapes = list(_LAYER_SHAPES.get(arch, lambda *_: [])(mc, rows, batch_size))
  if arch in registries.ARCHS.names() and getattr(mc, "tgt_vocab", 0):
    shapes.append((rows, registries.ARCHS.get(arch).output_width(mc), mc.tgt_vocab))
  if not shapes:  # a model config this module cannot read: a square of the batch's tokens
    shapes = [(rows, 512, 2048)]
  capped = lambda m, k, n: max(MIN_ROWS, min(m, int(MAX_FLOP // (2 * k * n))))
  return tuple((min(m, capped(m, k, n)), k, n) for m, k, n in shapes)


# -- measuring


def measure(shapes, repeats: int = REPEATS) -> dict:
  """{"float32": GFLOP/s, "bfloat16": GFLOP/s}: the FLOPs of one call of every shape over the
  sum of their median seconds, each shape a jitted matmul of that dtype's operands accumulating
  in float32, its operands passed as arguments (closed-over arrays would be folded as
  constants), compiled and called once untimed first. The dtypes alternate call by call, so
  that load from other jobs hits both alike."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  dot = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32))
  calls = {}
  for i, (m, k, n) in enumerate(shapes):
    a = jax.random.normal(jax.random.PRNGKey(2 * i), (m, k), jnp.float32)
    b = jax.random.normal(jax.random.PRNGKey(2 * i + 1), (k, n), jnp.float32)
    for name, dtype in COMPUTE_DTYPES.items():
      args = (a.astype(dtype), b.astype(dtype))
      jax.block_until_ready(dot(*args))  # compile and warm up
      calls[name, i] = args
  seconds = {key: [] for key in calls}
  for _ in range(repeats):
    for key, args in calls.items():
      t0 = time.perf_counter()
      jax.block_until_ready(dot(*args))
      seconds[key].append(time.perf_counter() - t0)
  flop = sum(2 * m * k * n for m, k, n in shapes)
  return {name: flop / sum(float(np.median(seconds[name, i])) for i in range(len(shapes))) / 1e9
          for name in COMPUTE_DTYPES}


def choose(rates: dict) -> str:
  """bfloat16 where its rate is at least MARGIN times float32's, else float32."""
  return "bfloat16" if rates["bfloat16"] >= MARGIN * rates["float32"] else "float32"


# -- the cache


def machine() -> dict:
  """What the rates depend on besides the shapes: the CPU's model name and flags (/proc/cpuinfo;
  platform.processor() where it cannot be read), the jaxlib version and the backend."""
  import jax  # pylint: disable=import-outside-toplevel
  import jaxlib  # pylint: disable=import-outside-toplevel
  fields = cpuinfo_fields()
  cpu = "" if fields is None else (
      f"{fields.get('model name', '')} | {fields.get('flags', fields.get('Features', ''))}")
  return {"cpu": cpu or platform.processor() or platform.machine(),
          "jaxlib": jaxlib.__version__, "backend": jax.default_backend()}


def cache_path(shapes, environ=None) -> str | None:
  """The cache file of these shapes on this machine, in the compilation cache's directory; None
  when that cache is off (or left to JAX_COMPILATION_CACHE_DIR)."""
  directory = compile_cache.configured_dir(environ)
  if not directory:
    return None
  key = json.dumps({**machine(), "shapes": [list(s) for s in shapes]}, sort_keys=True)
  return os.path.join(directory, "dtype_choice",
                      hashlib.sha256(key.encode()).hexdigest()[:24] + ".json")


def rates_for(shapes, measure_fn=None, environ=None) -> tuple[dict, bool]:
  """(rates, whether they came from the cache): the cached rates of these shapes on this
  machine, else `measure_fn(shapes)`'s, then written to the cache (atomically; a directory that
  cannot be written keeps nothing)."""
  path = cache_path(shapes, environ)
  cached = files.read_json(path) if path else None
  if (isinstance(cached, dict) and isinstance(cached.get("rates"), dict)
      and all(isinstance(cached["rates"].get(d), (int, float)) and cached["rates"][d] > 0
              for d in COMPUTE_DTYPES)):
    return {d: float(cached["rates"][d]) for d in COMPUTE_DTYPES}, True
  rates = {d: float(v) for d, v in (measure_fn or measure)(shapes).items()}
  if path:
    try:
      os.makedirs(os.path.dirname(path), exist_ok=True)
      files.write_json(path, {**machine(), "shapes": [list(s) for s in shapes], "rates": rates,
                              "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    except OSError as e:
      log.info(f"the compute dtype's measurement is not cached ({path}: {e.strerror or e})")
  return rates, False


# -- resolving


def recorded_dtype(workdir: str) -> str | None:
  """The concrete compute dtype in the workdir's config.json (None: none recorded)."""
  from attn.training import resume  # pylint: disable=import-outside-toplevel
  value = resume.recorded_train(workdir).get("compute_dtype")
  return value if value in COMPUTE_DTYPES else None


def resolve(asked: str, shapes_fn, *, workdir: str | None = None, resumed: bool = False,
            measure_fn=None) -> Choice:
  """The Choice for `train.compute_dtype=asked` (module docstring). shapes_fn() gives the
  model's matmul shapes (`matmul_shapes`), called only when a measurement is needed; `resumed`:
  the workdir holds checkpoints, whose dtype config.json recorded; measure_fn: what measures
  (default `measure`)."""
  import jax  # pylint: disable=import-outside-toplevel
  from attn.training import distributed  # pylint: disable=import-outside-toplevel
  recorded = recorded_dtype(workdir) if resumed and workdir else None
  if asked != AUTO:
    if recorded and recorded != asked:
      log.info(f"train.compute_dtype={asked}, where the run so far trained in {recorded}: the "
               f"resumed steps run in {asked} (parameters and optimizer state are float32 in "
               "both)")
    return Choice(asked, asked, "asked")
  if recorded:
    earlier = files.read_json(os.path.join(workdir, RECORD))
    rates = (earlier.get("rates") if isinstance(earlier, dict)
             and earlier.get("dtype") == recorded else None)
    return Choice(AUTO, recorded, "resumed", rates)
  if jax.default_backend() != "cpu":
    return Choice(AUTO, "bfloat16", "backend")
  rates, cached = rates_for(shapes_fn(), measure_fn)
  dtype = choose(rates)
  if jax.process_count() > 1:  # one program for every process: process 0's choice
    dtype = "bfloat16" if distributed.agree(dtype == "bfloat16") else "float32"
  return Choice(AUTO, dtype, "cache" if cached else "measured", rates)


def record(workdir: str, choice: Choice) -> None:
  """Writes the choice to the workdir's compute_dtype.json (process 0; atomically)."""
  from attn.training import distributed  # pylint: disable=import-outside-toplevel
  if choice.asked == AUTO and choice.how != "resumed" and distributed.is_primary():
    files.write_json(os.path.join(workdir, RECORD), choice.record())


def figures(run) -> dict:
  """results.json's record of the compute dtype that ran and what chose it: `compute_dtype`,
  and `compute_dtype_choice` (asked, dtype, how, and the two rates in GFLOP/s that chose it)."""
  choice = getattr(run, "dtype_choice", None)
  if choice is None:
    return {}
  return {"compute_dtype": run.tc.compute_dtype, "compute_dtype_choice": choice.record()}


def with_dtype(config, dtype: str):
  """The experiment config `config` (a ConfigDict) with train.compute_dtype = `dtype`: what
  config.json records (a copy; `config` itself is left as it was)."""
  if config.train.compute_dtype == dtype:
    return config
  import copy  # pylint: disable=import-outside-toplevel
  out = copy.deepcopy(config)
  out.train.compute_dtype = dtype
  return out
