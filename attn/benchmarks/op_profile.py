"""Where a jitted step's time goes, per XLA operation: a `jax.profiler` trace of a few calls,
read back with `jax.profiler.ProfileData`, each operation's self time (its nested operations'
time subtracted: a `while` loop's own time is its loop overhead) attributed to a category and to
the JAX source operation it came from (entry point: experiments/profile_step.py).

    hlo = compiled_ops(step.lower(*args).compile().as_text())
    events = trace_events(step, arg_sets, logdir)
    table = summarize(self_times(events), hlo, calls=len(arg_sets))

Categories come from the compiled HLO: `matmul` (a dot, or a fusion or custom call that
contains one), `elementwise` (other fusions and elementwise operations), `copy/transpose`,
`slice/update` (dynamic slices and updates: the scans' stacked buffers), `gather/scatter`,
`reduce`, `rng`, `loop overhead` (a while loop's self time: bookkeeping between iterations),
`other`. Needs jax alone.
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import os
import re
import shutil

import jax

_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s([a-z][\w\-]*)\((.*)$")
_COMP = re.compile(r"^\s*(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_CALLS = re.compile(r"(?:calls|to_apply|body|condition)=%?([\w.\-]+)")
_OP_NAME = re.compile(r'op_name="([^"]*)"')

_BY_OPCODE = {
    "dot": "matmul", "convolution": "matmul",
    "copy": "copy/transpose", "transpose": "copy/transpose",
    "dynamic-slice": "slice/update", "dynamic-update-slice": "slice/update",
    "slice": "slice/update", "concatenate": "slice/update", "pad": "slice/update",
    "gather": "gather/scatter", "scatter": "gather/scatter",
    "reduce": "reduce", "reduce-window": "reduce",
    "rng": "rng", "rng-bit-generator": "rng",
    "while": "loop overhead", "conditional": "loop overhead", "call": "other",
}
CATEGORIES = ("matmul", "elementwise", "copy/transpose", "slice/update", "gather/scatter",
              "reduce", "rng", "loop overhead", "other")


@dataclasses.dataclass(frozen=True)
class Op:
  """One compiled HLO instruction: its opcode, category and the JAX operation it came from."""
  opcode: str
  category: str
  source: str  # the op_name metadata (e.g. "jit(step)/.../dot_general"), "" if none
  shape: str = ""  # the result type, layout left out (e.g. "f32[128,1280]")


def _fusion_category(called: set[str]) -> str:
  """The category of a fusion (or custom call) from the opcodes of what it calls."""
  if called & {"dot", "convolution"}:
    return "matmul"
  for opcode in ("scatter", "gather", "dynamic-update-slice", "reduce"):
    if opcode in called:
      return _BY_OPCODE[opcode]
  if called and called <= {"copy", "transpose", "bitcast", "parameter", "reshape", "broadcast"}:
    return "copy/transpose"
  return "elementwise"


def compiled_ops(hlo_text: str) -> dict[str, Op]:
  """Instruction name -> Op, for every instruction of a compiled module's text."""
  comps: dict[str, set[str]] = collections.defaultdict(set)  # computation -> opcodes in it
  instrs = []  # (name, opcode, called computations, op_name)
  current = None
  for line in hlo_text.splitlines():
    m = _INSTR.match(line)
    if m and current is not None:
      name, result, opcode, rest = m.groups()
      comps[current].add(opcode)
      op_name = _OP_NAME.search(rest)
      instrs.append((name, opcode, _CALLS.findall(rest), op_name.group(1) if op_name else "",
                     re.sub(r"\{[^}]*\}", "", result)))
      continue
    c = _COMP.match(line)
    if c and "=" not in line.split("{")[0]:
      current = c.group(1)

  def reach(names, seen):  # opcodes of the computations `names` call, transitively
    out = set()
    for n in names:
      if n in seen:
        continue
      seen.add(n)
      out |= comps.get(n, set())
    return out

  ops = {}
  for name, opcode, called, op_name, shape in instrs:
    if opcode in ("fusion", "custom-call"):
      category = _fusion_category(reach(called, set()) | (
          {"dot"} if opcode == "custom-call" and "matmul" in op_name.lower() else set()))
    else:
      category = _BY_OPCODE.get(opcode, "elementwise")
    ops[name] = Op(opcode, category, op_name, shape)
  return ops


@dataclasses.dataclass(frozen=True)
class Event:
  """One traced execution of an HLO instruction on one thread (times in ns)."""
  op: str
  thread: str
  start: int
  duration: int


def trace_events(fn, arg_sets, logdir: str, module: str | None = None) -> list[Event]:
  """Calls fn(*args) for every args in `arg_sets` under `jax.profiler.trace` (each call blocked
  until ready) and returns the HLO instruction events of module `module` (any if None)."""
  shutil.rmtree(logdir, ignore_errors=True)
  with jax.profiler.trace(logdir):
    for args in arg_sets:
      jax.block_until_ready(fn(*args))
  paths = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)
  if not paths:
    raise RuntimeError(f"jax.profiler wrote no trace under {logdir}")
  data = jax.profiler.ProfileData.from_file(paths[0])
  events = []
  for plane in data.planes:
    for line in plane.lines:
      for e in line.events:
        stats = dict(e.stats)
        if "hlo_op" not in stats or (module and stats.get("hlo_module") != module):
          continue
        events.append(Event(str(stats["hlo_op"]), f"{plane.name}/{line.name}",
                            int(e.start_ns), int(e.duration_ns)))
  return events


def self_times(events: list[Event]) -> dict[str, float]:
  """Seconds per HLO instruction, summed over the events, each event's time less that of the
  events nested inside it on the same thread (a loop's body runs inside the loop's event)."""
  total: dict[str, float] = collections.defaultdict(float)
  by_thread = collections.defaultdict(list)
  for e in events:
    by_thread[e.thread].append(e)
  for evs in by_thread.values():
    evs.sort(key=lambda e: (e.start, -e.duration))
    stack: list[list] = []  # [event, time of its direct children]
    for e in evs:
      while stack and stack[-1][0].start + stack[-1][0].duration <= e.start:
        done, child = stack.pop()
        total[done.op] += (done.duration - child) / 1e9
      if stack:
        stack[-1][1] += e.duration
      stack.append([e, 0])
    for done, child in stack:
      total[done.op] += (done.duration - child) / 1e9
  return dict(total)


def _short_source(op_name: str, depth: int = 3) -> str:
  """The last `depth` parts of a JAX op_name path, without the jit(...) prefix."""
  parts = [p for p in op_name.split("/") if not p.startswith("jit(")]
  return "/".join(parts[-depth:]) if parts else "(no source)"


def summarize(times: dict[str, float], ops: dict[str, Op], *, calls: int, top: int = 15,
              depth: int = 3):
  """(per-category rows, per-source rows): (name, ms per call, share), largest first; a
  source is the last `depth` parts of the op_name path. Traced ops missing from `ops` (another
  module) count as "other"."""
  whole = sum(times.values()) or 1.0
  cats: dict[str, float] = collections.defaultdict(float)
  sources: dict[tuple[str, str], float] = collections.defaultdict(float)
  for name, t in times.items():
    op = ops.get(name, Op("?", "other", ""))
    cats[op.category] += t
    sources[(op.category, _short_source(op.source, depth))] += t
  cat_rows = [(c, 1e3 * cats[c] / calls, cats[c] / whole) for c in CATEGORIES if cats.get(c)]
  src_rows = sorted(((f"{c}: {s}", 1e3 * t / calls, t / whole) for (c, s), t in sources.items()),
                    key=lambda r: -r[1])[:top]
  return cat_rows, src_rows


def instructions(times: dict[str, float], ops: dict[str, Op], *, calls: int, top: int = 15,
                 depth: int = 3):
  """The `top` longest compiled instructions: (name, category, result shape, source, ms per
  call, share), longest first. Where the per-source rows of `summarize` add up instructions of
  every shape, these tell a [128, 1280] product from a [2048, 5908] one.

  XLA:CPU runs independent instructions side by side on its threads, and each traced event
  counts its own duration: the times add up to more than the step's wall time when they
  overlap, so an instruction that got faster shortens the step only if it was on its critical
  path (time the step itself, e.g. with bench_train, to know)."""
  whole = sum(times.values()) or 1.0
  rows = []
  for name, t in sorted(times.items(), key=lambda kv: -kv[1])[:top]:
    op = ops.get(name, Op("?", "other", ""))
    rows.append((name, op.category, op.shape, _short_source(op.source, depth), 1e3 * t / calls,
                 t / whole))
  return rows
