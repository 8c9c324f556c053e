"""The forward of the fused dot-product attention kernel for Hopper, in Mosaic GPU (TMA + WGMMA).

    out_i = Σ_j softmax_j(scale · q_i·k_j over valid j) v_j,   lse_i = log Σ_j exp(scale · q_i·k_j)

Same inputs, outputs and residuals as the Triton forward in `kernels/flash_attention.py` (chosen
with the "mosaic_gpu" targets, `kernels/targets/mosaic_gpu.py`), so the custom_vjp's Triton
backward consumes them unchanged: padded head-major q [B, H, Tq_p, d_p], k [B, H, Tk_p, d_p],
v [B, H, Tk_p, dv_p] -> (out [B, H, Tq_p, dv_p] in the input dtype, lse [B, H, Tq_p] float32,
natural log). Masks as in `kernels/_common.py` (key lengths, query lengths, causal top-left
aligned); a row with no visible key gets out = 0 and lse = -inf.

Two schedules (`SCHEDULES`; kernel bodies in `kernels/_mgpu_kernels.py`), one per target:
"pipelined" (target "mosaic_gpu"): one warpgroup per 64 query rows issues its own TMA copies of
[block_k, d] key and value tiles, STAGES shared-memory slots ahead. "warp_specialized" (target
"mosaic_gpu_ws"): FlashAttention-3's two compute warpgroups (128 query rows) sharing each
key/value tile, fed by a third, memory warpgroup, and taking turns on the tensor cores. Both: S
= Q Kᵀ by WGMMA from shared memory into float32 registers, the online softmax in base 2 (exp2,
approximate math; scale·log2 e folded into one multiply of the scores), P in the input dtype
and O += P V by WGMMA with P from registers into the rescaled accumulator in place (no second
[64, dv] float32 array: dv = 256 fits the registers). Key tiles past the key length (and the
causal diagonal) are never fetched; tiles every row of a query tile sees whole skip the mask.

block_k: the forward tile (`cfg.blocks.block_k`), 64, 128 or 256, the largest legal one at most
the one asked for; legal is what fits the 227 KiB of shared memory (`smem_bytes`,
`legal_block_ks`). The output tile reuses q's when dv_p = d_p.

Limits: WGMMA takes 16-bit operands here (bfloat16, float16); float32 inputs (tf32 WGMMA would
round q and k to 10 mantissa bits, far outside the float32 tolerance) and head dims above
MAX_HEAD_DIM run the Triton forward instead, and so do causal calls under a CUDA of 12.8.0 up
to 12.9.1 (`ptxas_miscompiles_causal`: JAX's own attention_mgpu refuses causal masking there
for a ptxas miscompile of its iota/where mask, the pattern this kernel's mask uses too). Head
dims are zero-padded to multiples of 64 (one 128-byte swizzled row of 16-bit values) and
sequences to multiples of the tiles, inside this module; the padding is sliced off.

Interpret mode (`interpret=True`, CPU) runs the same programs, both schedules (the three
warpgroups as concurrent threads), in JAX's Mosaic GPU interpreter (`InterpretGPUParams`:
simulated shared memory, TMA copies and barriers), except that the two matrix products become
`lax.dot_general` on the shared-memory tiles and P V is added to the rescaled accumulator
instead of accumulated in place: the 0.10 interpreter's WGMMA takes neither a transposed operand
nor one from registers, and it has no `pl.run_state`, `layout_cast` or `broadcasted_iota` with
a layout. exp2 is exact there (approx_math is a GPU compiler flag) and `set_max_registers` a
no-op. So interpret mode checks the copies, barriers (the consumed barriers and turns of the
warp-specialized schedule included), pipelining, masks, softmax and stores; the lowering checks
the WGMMA operands, layouts and shared memory; only a GPU checks the WGMMA results, the
in-place accumulation, approximate exp2 and the register budget.
"""

from __future__ import annotations

import dataclasses
import functools
import logging

import jax
import jax.numpy as jnp
from jax.experimental.pallas import mosaic_gpu as plgpu

from kernels import _common, _mgpu_kernels

log = logging.getLogger(__name__)

_F32 = jnp.float32
WARPGROUP_ROWS = _mgpu_kernels.WARPGROUP_ROWS  # query rows of one compute warpgroup
FEATURE_MULTIPLE = 64  # one 128-byte swizzled shared-memory row of 16-bit values
MAX_HEAD_DIM = 256
SUPPORTED_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
STAGES = 2  # key/value shared-memory slots in flight
BLOCK_KS = (64, 128, 256)  # key tiles the forward takes (multiples of 64; more do not fit)
SMEM_LIMIT = _common.SMEM_BUDGETS["hopper"][0]  # Hopper only: 227 KiB per thread block
REDUCTION_SCRATCH = 2048  # plgpu.CompilerParams.reduction_scratch_bytes' default (row max/sum)
BARRIER_BYTES = 8
SMEM_ALIGNMENT = 1024  # the lowering aligns each shared-memory buffer to 1 KiB
# cudaRuntimeGetVersion's [lo, hi): 12.8.0 up to (not including) 12.9.1, JAX's bound.
PTXAS_CAUSAL_MISCOMPILE = (12080, 12091)


@dataclasses.dataclass(frozen=True)
class Schedule:
  """How a program is laid out: `compute_wgs` compute warpgroups of 64 query rows each, and a
  memory warpgroup issuing the copies (`memory_wg`) or not (each issues its own)."""
  name: str
  compute_wgs: int
  memory_wg: bool

  @property
  def kernel_name(self) -> str:  # the launch's name in a lowered module
    return "flash_attention_fwd_mgpu" + ("_ws" if self.memory_wg else "")

  @property
  def rows(self) -> int:  # query rows per program
    return self.compute_wgs * WARPGROUP_ROWS

  @property
  def barriers(self) -> int:  # q per compute warpgroup; k, v per slot; (k, v free per slot, turn)
    return self.compute_wgs + 2 * STAGES + (2 * STAGES + 1 if self.memory_wg else 0)


SCHEDULES = {s.name: s for s in (Schedule("pipelined", 1, False),
                                 Schedule("warp_specialized", 2, True))}


def supports(dtype, d: int, dv: int) -> bool:
  """Whether this forward takes these operands (otherwise the Triton forward runs)."""
  return jnp.dtype(dtype) in SUPPORTED_DTYPES and max(d, dv) <= MAX_HEAD_DIM


def _round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


def smem_bytes(d: int, dv: int, block_k: int, dtype, schedule: str = "pipelined",
               stages: int = STAGES) -> int:
  """Shared memory of one program, as the Mosaic GPU lowering counts it (each buffer aligned to
  1 KiB): per compute warpgroup q [64, d_p], the output tile [64, dv_p] (none when dv_p = d_p:
  it reuses q's) and the lse row [64] float32; `stages` slots of k [block_k, d_p] and v
  [block_k, dv_p]; the lowering's reduction scratch and the barriers."""
  s = SCHEDULES[schedule]
  d, dv = _round_up(d, FEATURE_MULTIPLE), _round_up(dv, FEATURE_MULTIPLE)
  item, rows = jnp.dtype(dtype).itemsize, s.compute_wgs * WARPGROUP_ROWS
  buffers = [rows * d * item, stages * block_k * d * item, stages * block_k * dv * item,
             rows * 4, REDUCTION_SCRATCH] + ([rows * dv * item] if dv != d else [])
  return sum(_round_up(n, SMEM_ALIGNMENT) for n in buffers) + s.barriers * BARRIER_BYTES


def legal_block_ks(d: int, dv: int, dtype, schedule: str = "pipelined") -> tuple[int, ...]:
  """The key tiles of BLOCK_KS whose program fits SMEM_LIMIT, e.g. (64, 128) at d = dv = 128."""
  return tuple(bk for bk in BLOCK_KS if smem_bytes(d, dv, bk, dtype, schedule) <= SMEM_LIMIT)


def pick_block_k(requested: int, d: int, dv: int, dtype, schedule: str = "pipelined") -> int:
  """The largest legal key tile at most `requested` (64 when it asks for less)."""
  legal = legal_block_ks(d, dv, dtype, schedule)
  return max([bk for bk in legal if bk <= requested] or [legal[0]])


# ----------------------------------------------------------------------------------------------
# The CUDA versions whose ptxas miscompiles the causal mask.


def cuda_runtime_version() -> int | None:
  """cudaRuntimeGetVersion (1000·major + 10·minor) of the CUDA jax runs, or None without its
  CUDA plugin (a CPU host, where an export for "cuda" is traced)."""
  from jax._src.lib import cuda_versions  # pylint: disable=import-outside-toplevel
  return None if cuda_versions is None else int(cuda_versions.cuda_runtime_get_version())


def ptxas_miscompiles_causal(version: int | None) -> bool:
  """Whether a CUDA `version` is in JAX's range of the ptxas miscompile of causal masking
  (attention_mgpu's guard). None (unknown: traced on a host without CUDA) is taken as good."""
  return version is not None and PTXAS_CAUSAL_MISCOMPILE[0] <= version < PTXAS_CAUSAL_MISCOMPILE[1]


@functools.lru_cache(maxsize=None)
def _log_causal_fallback(version: int) -> None:  # once per process and version
  log.warning("Mosaic GPU attention: causal masking runs the Triton forward under CUDA %d.%d "
              "(runtime %d): ptxas 12.8.0-12.9.0 miscompiles the causal mask", version // 1000,
              version % 1000 // 10, version)


# ----------------------------------------------------------------------------------------------
# The launch.


def _interpret_params():
  # The Mosaic GPU interpreter is not exported under jax.experimental in jax 0.10.
  from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams
  return InterpretGPUParams()


def _scratch(s: Schedule, dtype, d_p: int, dv_p: int, block_k: int):
  """Shared memory and barriers of one program, in the kernel bodies' argument order."""
  swizzled = lambda: (plgpu.TilingTransform((8, FEATURE_MULTIPLE)), plgpu.SwizzleTransform(128))
  lead = (s.compute_wgs,) if s.memory_wg else ()  # one tile per compute warpgroup
  q = plgpu.SMEM((*lead, WARPGROUP_ROWS, d_p), dtype, transforms=swizzled())
  o = None if dv_p == d_p else plgpu.SMEM((*lead, WARPGROUP_ROWS, dv_p), dtype,
                                          transforms=swizzled())
  tiles = [plgpu.SMEM((STAGES, block_k, d_p), dtype, transforms=swizzled()),
           plgpu.SMEM((STAGES, block_k, dv_p), dtype, transforms=swizzled()),
           plgpu.SMEM((*lead, WARPGROUP_ROWS), _F32),
           plgpu.Barrier(num_barriers=s.compute_wgs if s.memory_wg else 1),
           plgpu.Barrier(num_barriers=STAGES), plgpu.Barrier(num_barriers=STAGES)]
  if s.memory_wg:  # both compute warpgroups release a slot; they take turns
    tiles += [plgpu.Barrier(num_arrivals=s.compute_wgs, num_barriers=STAGES)] * 2
    tiles += [plgpu.Barrier(num_arrivals=s.compute_wgs)]
  return q, o, tiles


def mosaic_forward(q, k, v, kl, ql, *, scale: float, causal: bool, block_k: int,
                   schedule: str = "pipelined", interpret: bool = False):
  """The Mosaic GPU kernel on head-major operands of any length (padded here, sliced back).

  q: [B, H, Tq, d], k: [B, H, Tk, d], v: [B, H, Tk, dv], bfloat16 or float16, one dtype;
  kl, ql: [B] int32 in [0, Tk], [0, Tq]. block_k: key tile, one of legal_block_ks(...);
  schedule: a key of SCHEDULES.
  Returns (out [B, H, Tq, dv] in the input dtype, lse [B, H, Tq] float32).
  """
  B, H, Tq, d = q.shape
  Tk, dv = k.shape[2], v.shape[-1]
  s = SCHEDULES[schedule]
  if not supports(q.dtype, d, dv) or block_k not in legal_block_ks(d, dv, q.dtype, schedule):
    raise ValueError(f"the Mosaic GPU forward takes bfloat16/float16, head dims <= {MAX_HEAD_DIM} "
                     f"and block_k in {legal_block_ks(d, dv, q.dtype, schedule)} ({schedule}); "
                     f"got {q.dtype}, d={d}, dv={dv}, {block_k=}")
  Tq_p, Tk_p = _round_up(Tq, s.rows), _round_up(Tk, block_k)
  d_p, dv_p = _round_up(d, FEATURE_MULTIPLE), _round_up(dv, FEATURE_MULTIPLE)
  pad = lambda x, T, width: _common.pad_axis(_common.pad_axis(x, 2, T), 3, width)
  q, k, v = pad(q, Tq_p, d_p), pad(k, Tk_p, d_p), pad(v, Tk_p, dv_p)
  q_scratch, o_scratch, scratch = _scratch(s, q.dtype, d_p, dv_p, block_k)
  body = (_mgpu_kernels.warp_specialized_kernel if s.memory_wg
          else _mgpu_kernels.pipelined_kernel)

  def run(*refs):
    refs = list(refs)
    if o_scratch is None:  # the output tile is q's
      refs.insert(8, refs[7])
    body(*refs, scale=scale, causal=causal, interpret=interpret)

  threads = dict(num_threads=s.compute_wgs + 1, thread_name="wg") if s.memory_wg else {}
  out, lse = plgpu.kernel(
      run, kernel_name=s.kernel_name,
      out_type=[jax.ShapeDtypeStruct((B, H, Tq_p, dv_p), q.dtype),
                jax.ShapeDtypeStruct((B, H, Tq_p), _F32)],
      scratch_types=[q_scratch] + ([] if o_scratch is None else [o_scratch]) + scratch,
      grid=(H, Tq_p // s.rows, B), grid_names=("heads", "q_blocks", "batch"),
      compiler_params=plgpu.CompilerParams(approx_math=True),
      interpret=_interpret_params() if interpret else False, **threads,
  )(q, k, v, kl, ql)
  return out[:, :, :Tq, :dv], lse[:, :, :Tq]


def forward(q, k, v, theta, kl, ql, cfg, *, fallback, schedule: str = "pipelined"):
  """The "mosaic_gpu" targets' forward of the dot-product kernel (`kernels/targets/mosaic_gpu.py`):
  the Mosaic GPU forward with `schedule` where it applies, `fallback` (the kernel's own forward
  on the Triton launch, same arguments) for float32, wide heads, and causal calls compiled under
  a CUDA whose ptxas miscompiles the mask (`cuda_runtime_version()`; logged once). The target is
  compiled for CUDA only, or interpreted (cfg.interpret: the Mosaic GPU interpreter, no ptxas).

  Operands as `_skeleton.FusedKernel.forward`'s (padded, head-major). Returns (out [B, H, Tq_p,
  dv_p], lse [B, H, Tq_p] float32). cfg.poison does not apply: every tile is written whole.
  cfg.blocks.block_k asks for the key tile (`pick_block_k`).
  """
  d, dv = q.shape[-1], v.shape[-1]
  if not supports(q.dtype, d, dv):
    return fallback(q, k, v, theta, kl, ql, cfg)
  if cfg.causal and not cfg.interpret:
    version = cuda_runtime_version()
    if ptxas_miscompiles_causal(version):
      _log_causal_fallback(version)
      return fallback(q, k, v, theta, kl, ql, cfg)
  block_k = pick_block_k(cfg.blocks.block_k, d, dv, q.dtype, schedule)
  return mosaic_forward(q, k, v, kl, ql, scale=dict(cfg.score_kw)["scale"], causal=cfg.causal,
                        block_k=block_k, schedule=schedule, interpret=bool(cfg.interpret))
