"""Data parallel training over a device mesh, on one host or several (`jax.distributed`).

    initialize(mode)            jax.distributed from explicit flags or the cluster's environment
    make_mesh(mesh_shape)       Mesh with axes ("data", "model") over every device of every process
    state_shardings(state, m)   parameters and optimizer state: replicated, or the vocabulary
                                matrices split over "model" (see MODEL_AXIS_RULES)
    RowShard / global_batch     which rows of each global batch this process reads, and the global
                                jax.Array built from them
    local_copy(tree)            a single-device copy of the (global) state, for eval and decoding
    is_primary / agree / primary_first   who writes, and deciding things together

Decisions (and why):

- **Mesh.** Axes ("data", "model"), always both (model = 1 unless `train.mesh_shape` asks for
  more), built with `Auto` axis types so the models need no sharding annotations: the batch is
  split along "data", everything else is replicated or, where `MODEL_AXIS_RULES` names it (the
  embedding tables and the output projection, the vocabulary-sized matrices), split over "model"
  when the vocabulary divides by its size; XLA inserts the collectives. The loss is a sum over
  the global batch divided by its token count, so 1 and N devices compute the same loss up to the
  order of the sums (float32 round-off, ~1e-6 relative).
- **Data on several hosts.** Every process builds the same global batch plan (a pure function of
  the seed and the step, attn.data.pipeline) and collates only the rows that its own devices hold
  (`RowShard`); the global array is assembled from them (`make_array_from_callback`). grain's
  record sharding (`ShardByJaxProcess`) is not used: it splits the *records* between hosts, so
  which examples make up global batch k would depend on the number of hosts, a two-host run could
  not reproduce the one-host loss curve, and a checkpoint could not resume at the same step on
  another host count. Here the batches are the same whatever the topology.
- **Rows that do not divide.** A bucket's batch rows must split evenly over the data axis. With a
  fixed `data.batch_size` that does not divide, the run stops with a ConfigError naming both
  numbers (padding every batch would waste devices on every step). With `data.tokens_per_batch`
  the per-bucket sizes vary, so each batch is completed with filler rows (length 0, example_id
  -1, as in the eval batches): they hold no target tokens, so the loss and the gradient are those
  of the real rows.
- **Write once.** Process 0 writes config.json, model.json, metrics.jsonl, TensorBoard events and
  the result files, and holds the workdir lock; the other processes learn whether it got the lock
  (`agree`), so a second run on a busy workdir fails on every host rather than hanging in the
  first collective. The data cache and vocabularies are prepared by process 0 first
  (`primary_first`), then read by the others. Checkpoints are orbax's: every process calls save
  and restore, orbax writes each shard once and the metadata from process 0.
- **Restoring on another topology.** Restore targets carry the shardings of the current mesh
  (`jax.ShapeDtypeStruct(..., sharding=)`), so a checkpoint written on 4 devices restores on 1 and
  the other way round; the checkpoint stores arrays, not a device layout.
- **Evaluation and decoding** run on every process, each on one local device with a local copy
  of the parameters (`local_copy`): no collectives inside decoding loops, the same results on
  every process, and process 0 writes them. Decisions that must be the same everywhere (keep a
  new best checkpoint, stop at `max_wall_s`) are taken by process 0 and broadcast (`agree`).
- **CPU collectives.** Several processes on CPU (tests) need a cross-process collectives backend;
  jax 0.10.2's default is already "gloo", and `initialize` selects it where the option exists and
  is unset, before the backend starts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import re

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from attn.errors import ConfigError

log = logging.getLogger(__name__)

AXES = ("data", "model")
MODES = ("none", "auto")

# (regex over the leaf's path, spec for a matching leaf): the vocabulary-sized matrices, split
# over "model" along their vocabulary axis. Optimizer moments share their parameter's path
# suffix, so they follow it. A leaf whose axis does not divide stays replicated.
MODEL_AXIS_RULES = (
    (r"(^|/)embed/embedding(/value)?$", P("model", None)),  # [V, E]
    (r"(^|/)out/kernel(/value)?$", P(None, "model")),  # [H, V]
    (r"(^|/)out/bias(/value)?$", P("model")),  # [V]
)


# --- processes ----------------------------------------------------------------------------------


def initialize(mode: str = "none", *, coordinator_address: str | None = None,
               num_processes: int | None = None, process_id: int | None = None) -> bool:
  """Starts jax.distributed when asked; returns whether it did. Call before any JAX computation.

  mode "none" with no explicit setting: a single process (nothing happens). mode "auto": the
  cluster's environment supplies everything (Slurm, Cloud TPU pods, Open MPI; see
  `jax.distributed.initialize`). An explicit coordinator_address (host:port of process 0),
  num_processes and process_id start it whatever the mode (e.g. two local processes on
  127.0.0.1). Raises ConfigError for a bad mode or a missing setting.
  """
  if mode not in MODES:
    raise ConfigError(f"--distributed={mode!r} unknown; known: {', '.join(MODES)}")
  explicit = {k: v for k, v in (("coordinator_address", coordinator_address),
                                ("num_processes", num_processes), ("process_id", process_id))
              if v is not None}
  if mode == "none" and not explicit:
    return False
  if explicit and "coordinator_address" not in explicit and mode != "auto":
    raise ConfigError("--num_processes/--process_id need --coordinator_address (host:port of "
                      "process 0), or --distributed=auto inside a cluster job")
  if num_processes is not None and process_id is not None and not 0 <= process_id < num_processes:
    raise ConfigError(f"--process_id={process_id} must be in [0, --num_processes={num_processes})")
  _select_cpu_collectives()
  try:
    jax.distributed.initialize(**explicit)
  except ValueError as e:  # outside a cluster: "coordinator_address should be defined"
    raise ConfigError(f"jax.distributed.initialize failed: {e} (outside a Slurm or TPU-pod job, "
                      "pass --coordinator_address, --num_processes and --process_id)") from None
  log.info(f"process {jax.process_index()} of {jax.process_count()}: "
           f"{jax.local_device_count()} local of {jax.device_count()} devices")
  return True


def _select_cpu_collectives():
  """Cross-process collectives on CPU: gloo (the default of jax 0.10; set only where unset)."""
  name = "jax_cpu_collectives_implementation"
  # A jax without the option raises here: then there is nothing to select.
  with contextlib.suppress(AttributeError, ValueError):
    if getattr(jax.config, name, None) is None:
      jax.config.update(name, "gloo")


def shutdown():
  """Leaves jax.distributed (a barrier with every other process); no-op when not started."""
  if jax.distributed.is_initialized():
    jax.distributed.shutdown()


def is_primary() -> bool:
  """Whether this process writes the run's files (process 0)."""
  return jax.process_index() == 0


def agree(flag: bool) -> bool:
  """Process 0's `flag` on every process (a broadcast: every process must call it)."""
  if jax.process_count() == 1:
    return bool(flag)
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
  return bool(multihost_utils.broadcast_one_to_all(np.int32(bool(flag))))


class PrimaryFailed(ConfigError):
  """Process 0 failed in a step the others wait for; its own error line says why."""


@contextlib.contextmanager
def primary_first(what: str):
  """Runs the block on process 0 first, then on the others (which then find what it wrote: the
  data cache, the vocabularies). When it fails on process 0, the others raise PrimaryFailed
  instead of waiting forever."""
  if jax.process_count() == 1:
    yield
    return
  if is_primary():
    try:
      yield
    except BaseException:
      agree(False)
      raise
    agree(True)
  else:
    if not agree(False):
      raise PrimaryFailed(f"process 0 failed while {what}; see its error")
    yield


# --- mesh and shardings -------------------------------------------------------------------------


def parse_mesh_shape(text: str) -> tuple[int, ...]:
  """'' -> (); '4' -> (4,); '2,2' -> (2, 2). Raises ConfigError for anything else."""
  text = str(text).strip()
  if not text:
    return ()
  parts = [p.strip() for p in text.split(",")]
  if len(parts) > len(AXES) or not all(re.fullmatch(r"[0-9]+", p) and int(p) >= 1
                                       for p in parts):
    raise ConfigError(f"train.mesh_shape={text!r} must be one or two positive integers, "
                      "data[,model], e.g. '4' or '2,2' ('' = every device on the data axis)")
  return tuple(int(p) for p in parts)


def make_mesh(mesh_shape: str = "", devices=None):
  """Mesh ("data", "model") over `devices` (default: every device of every process).

  mesh_shape: '' = (all devices, 1); 'D' = (D, 1); 'D,M'. Raises ConfigError when the product is
  not the device count."""
  devices = list(jax.devices() if devices is None else devices)
  shape = parse_mesh_shape(mesh_shape) or (len(devices),)
  shape = shape + (1,) * (len(AXES) - len(shape))
  if math.prod(shape) != len(devices):
    raise ConfigError(
        f"train.mesh_shape={mesh_shape!r} asks for {'x'.join(map(str, shape))} = "
        f"{math.prod(shape)} devices, but {len(devices)} are present ({jax.process_count()} "
        f"process(es) x {jax.local_device_count()}); use '' for all devices on the data axis")
  auto = (jax.sharding.AxisType.Auto,) * len(AXES)
  return jax.make_mesh(shape, AXES, axis_types=auto, devices=devices)


def data_size(mesh) -> int:
  return int(mesh.shape["data"])


def replicated(mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def stacked_batch_sharding(mesh) -> NamedSharding:
  """Batches of consecutive steps stacked on a leading axis: rows (axis 1) over "data"."""
  return NamedSharding(mesh, P(None, "data"))


def batch_sharding(mesh) -> NamedSharding:
  """Rows over "data" (any rank: the other axes replicated)."""
  return NamedSharding(mesh, P("data"))


def _leaf_spec(path: str, shape, mesh) -> P:
  m = int(mesh.shape["model"])
  if m > 1:
    for pattern, spec in MODEL_AXIS_RULES:
      if (re.search(pattern, path) and len(spec) == len(shape)
          and all(a is None or shape[i] % m == 0 for i, a in enumerate(spec))):
        return spec
  return P()


def path_str(path) -> str:
  """A pytree path as 'a/b/0/value' (DictKey keys, sequence indices, attribute names)."""
  name = lambda k: getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))
  return "/".join(str(name(k)) for k in path)


def state_shardings(state, mesh):
  """A NamedSharding per leaf of `state`: replicated, or split over "model" by MODEL_AXIS_RULES."""
  def one(path, x):
    return NamedSharding(mesh, _leaf_spec(path_str(path), np.shape(x), mesh))
  return jax.tree_util.tree_map_with_path(one, state)


def _is_key(x) -> bool:
  return hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def place(tree, shardings):
  """`tree` (values that are the same on every process) as global arrays with `shardings`."""
  def one(x, s):
    if isinstance(x, jax.Array) and x.sharding == s:
      return x
    if jax.process_count() == 1:
      return jax.device_put(x, s)
    if _is_key(x):  # typed PRNG keys travel as their raw data
      data = one(jax.random.key_data(x), s)
      return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, s, lambda idx: host[idx])
  return jax.tree.map(one, tree, shardings)


def _identity(x):
  return x


def local_copy(tree):
  """Each leaf of a (possibly multi-process) state as one array on this process's first device:
  model-split leaves are gathered first (a collective: every process must call this)."""
  dev = jax.local_devices()[0]

  def one(x):
    if not isinstance(x, jax.Array):
      return x
    if not x.is_fully_replicated:
      x = jax.jit(_identity, out_shardings=x.sharding.update(spec=P()))(x)  # all-gather
    on_dev = [s.data for s in x.addressable_shards if s.device == dev]
    return jax.device_put(on_dev[0] if on_dev else x.addressable_data(0), dev)
  return jax.tree.map(one, tree)


# --- batches ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RowShard:
  """The rows of each global batch one process reads.

  A global batch of B rows is completed to `pad_rows(B)` (a multiple of `blocks`, the data-axis
  size) with filler rows and cut into `blocks` equal blocks; block d goes to the devices at
  data-axis index d. `mine`: the blocks whose devices belong to this process (all of them on one
  host), in increasing order; the process's local batch is those blocks, concatenated.
  """
  blocks: int
  mine: tuple[int, ...]

  def pad_rows(self, rows: int) -> int:
    return -(-rows // self.blocks) * self.blocks

  def select(self, rows: np.ndarray) -> np.ndarray:
    """This process's rows of a global batch (`rows`: its record indices, -1 = filler; or
    [B, P], each packed row's)."""
    rows = np.asarray(rows)  # [B], or [B, P]: the examples of packed rows (data.pack)
    filler = -np.ones((self.pad_rows(len(rows)) - len(rows),) + rows.shape[1:], rows.dtype)
    full = np.concatenate([rows, filler])
    b = len(full) // self.blocks
    return np.concatenate([full[d * b:(d + 1) * b] for d in self.mine])


def row_shard(mesh) -> RowShard:
  """This process's blocks of the data axis of `mesh`."""
  me = jax.process_index()
  devs = np.asarray(mesh.devices).reshape(data_size(mesh), -1)  # [D, M]
  mine = tuple(d for d in range(devs.shape[0]) if any(x.process_index == me for x in devs[d]))
  return RowShard(devs.shape[0], mine)


def check_batch_rows(batch_size: int, tokens_per_batch: int, data: int, mesh_shape: str) -> None:
  """ConfigError when a fixed batch size does not split over the `data` devices of the data axis
  (per-bucket sizes from tokens_per_batch are completed with filler rows instead; module doc)."""
  if tokens_per_batch <= 0 and batch_size % data:
    raise ConfigError(
        f"data.batch_size={batch_size} does not divide over the {data} devices of the data axis "
        f"(train.mesh_shape={mesh_shape!r}); use a multiple of {data}")


def global_batch(local: dict, mesh, shard: RowShard) -> dict:
  """The global jax.Arrays (rows over "data") of a batch whose local rows are the blocks
  `shard.mine` of each array's leading axis (what `RowShard.select` picked)."""
  sharding = batch_sharding(mesh)
  if len(shard.mine) == shard.blocks:  # this process holds every row (one host)
    return jax.device_put(local, sharding)
  pos = {d: i for i, d in enumerate(shard.mine)}

  def one(x):
    x = np.asarray(x)
    b = x.shape[0] // len(shard.mine)
    shape = (b * shard.blocks,) + x.shape[1:]

    def cb(idx):
      start = idx[0].start or 0
      i = pos[start // b]
      return x[(slice(i * b, (i + 1) * b),) + tuple(idx[1:])]
    return jax.make_array_from_callback(shape, sharding, cb)
  return {k: one(v) for k, v in local.items()}
