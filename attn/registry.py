"""One Registry type for every kind of named thing, and the registries of the attention variants.

A `Registry` maps names (and aliases) to entries: a name registers once (duplicates are refused,
nothing is half-registered) and an unknown name fails with the list of known ones, as the
registry's own error type (a DataError for data sources, a ConfigError for launchers, ...).
Behaviour that depends on an entry (a score's key-side `prepare`, its fused kernel, its cost
model; a decoder's attention dimensions) is carried by the entry, so code never branches on a
name. The attention primitives (scores, normalizers, scopes) live in `VARIANTS` here; the
application keeps its own registries beside the code that fills them (model architectures,
decoders, cells and positional encodings in attn.models, tasks in attn.training, data sources in
attn.data, interventions in attn.inspection, launchers in attn.launching).

    SOURCES = Registry("data.task", error=DataError)

    @SOURCES.register("reverse")
    class Reverse: ...

    SOURCES.get("reverse")      # the class; SOURCES.get("revers") -> DataError listing the known
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
  """Named entries of one kind. `what` names the kind in errors (e.g. "model.arch", "score")."""

  def __init__(self, what: str, *, error: type[Exception] = KeyError):
    self.what = what
    self.error = error
    self._entries: dict[str, T] = {}
    self._alias_of: dict[str, str] = {}

  def add(self, name: str, entry: T, *, aliases=()) -> T:
    """Registers `entry` under `name` and `aliases`; refuses any name already taken."""
    for n in (name, *aliases):
      if n in self._entries:
        raise ValueError(f"{self.what} {n!r} is already registered")
    for n in (name, *aliases):
      self._entries[n] = entry
      if n != name:
        self._alias_of[n] = name
    return entry

  def register(self, name: str, *, aliases=()) -> Callable[[T], T]:
    """Decorator form of `add`: the decorated object is the entry (and is returned unchanged)."""
    return lambda entry: self.add(name, entry, aliases=aliases)

  def remove(self, name: str) -> None:
    """Forgets `name` and its aliases (tests that register a throwaway entry clean up with it)."""
    for n in [n for n, c in self._alias_of.items() if c == name] + [name]:
      self._entries.pop(n, None)
      self._alias_of.pop(n, None)

  def get(self, name: str) -> T:
    if name not in self._entries:
      raise self.error(f"unknown {self.what} {name!r}; known: {', '.join(self.names())}")
    return self._entries[name]

  def alias_of(self, name: str) -> str | None:
    """The canonical name `name` is an alias of, or None for a canonical name."""
    return self._alias_of.get(name)

  def names(self) -> list[str]:
    """Every registered name, aliases included, sorted."""
    return sorted(self._entries)

  def canonical_names(self) -> list[str]:
    """Registered names without aliases, sorted."""
    return [n for n in self.names() if n not in self._alias_of]

  def items(self) -> list[tuple[str, T]]:
    """(canonical name, entry) pairs, sorted by name."""
    return [(n, self._entries[n]) for n in self.canonical_names()]

  def __contains__(self, name: object) -> bool:
    return name in self._entries

  def __iter__(self) -> Iterator[str]:
    return iter(self.names())

  def __len__(self) -> int:
    return len(self._entries)

  def __getitem__(self, name: str) -> T:
    return self.get(name)

  def __repr__(self) -> str:
    return f"Registry({self.what!r}: {', '.join(self.canonical_names())})"


# The attention primitives' kinds. The application's kinds (architectures, decoders, tasks, ...)
# are registries of their own packages.
KINDS = ("score", "normalizer", "scope")


@dataclasses.dataclass(frozen=True)
class Variant:
  """A named attention variant.

  kind: one of KINDS.
  name: the registry name (what flags and configs say).
  fn: the pure function (signature depends on the kind, see scores.py, normalizers.py, scopes.py).
  init: parameter initializer, or None for parameter-free variants.
  doc: one line for listings.
  prepare: for scores, `prepare(params, k) -> k'`, the key-side work done once per source so a
    decoder scoring the same keys at every step does not redo it (Bahdanau's U h_j); then
    `fn(params, q, k')` is the score. None when there is nothing to precompute.
  full_attention: True for scopes that replace the whole score→normalize→sum pipeline (linear
    attention); then `fn` computes the context itself. False for scopes that mask or reweight.
  fused: for scores, the fused-kernel form of score → softmax → weighted sum,
    `fused(params, q, kp, v, *, temperature, causal, key_lengths) -> context`, head-major:
    q: [N, H, Tq, dq], kp (prepared keys): [N, H, Tk, dk'], v: [N, H, Tk, dv], params stacked on
    a leading H axis, key_lengths: [N] int32 or None; context [N, H, Tq, dv]; an optional
    `target=` names the kernel target (`kernels.targets`; "auto" when absent). None: no kernel.
  cost: for scores, `cost(dq, dk, d_attn) -> ScoreCost` (matmul FLOPs per key, per query and per
    query-key pair), used by benchmarks' analytic FLOP counts.
  positional: for scores, True when e_ij depends on where key j sits, not only on the query and
    key vectors (Luong's location score reads column j of W_a): such a score cannot score a
    re-indexed slice of the keys (attn.banded).
  fusable: for normalizers and scopes, True when a computation that forms no weights loses
    nothing by not running this stage: the fused kernels (an online softmax over every key) and
    a full-attention scope's feature map stand in for the softmax normalizer and the global scope.
  additive_keys: for scores, True when the prepared keys are a term added inside the score's
    nonlinearity (additive: v^T tanh(W q + U k)), so another per-key term can join them
    (coverage's w_c c_i, See et al. 2017).
  all_pairs: for scopes, True when every unmasked query-key pair is scored and summed (what an
    analytic count over the dense grid assumes).
  at_positions: for scopes that restrict query i by its row index i, the registered scope doing
    the same at explicit query positions (a cached decoding step has one row, at position t).
  banded: for scopes, True when attn.banded computes the restriction without the [T, T] scores.
  dot_scale: for scores of the dot-product form e = c q.k, `dot_scale(d) -> c` (so a path can
    score gathered keys itself); None for other scores.
  kept_keys: for scopes that keep a few keys a query, the path that attends over those alone
    for a `dot_scale` score under the softmax: `kept_keys(score_fn, c, q, kp, v, e, mask, *,
    top_k, temperature) -> (context, keep mask)`, or None where the dense form is the cheaper
    at those shapes (attn.topk_sparse). None: the scope narrows the mask and the dense
    normalizer runs.
  """
  kind: str
  name: str
  fn: Callable[..., Any]
  init: Callable[..., Any] | None = None
  doc: str = ""
  full_attention: bool = False
  alias_of: str | None = None
  prepare: Callable[..., Any] | None = None
  fused: Callable[..., Any] | None = None
  cost: Callable[..., Any] | None = None
  positional: bool = False
  fusable: bool = False
  additive_keys: bool = False
  all_pairs: bool = False
  at_positions: str | None = None
  banded: bool = False
  dot_scale: Callable[[int], float] | None = None
  kept_keys: Callable[..., Any] | None = None


VARIANTS: dict[str, Registry[Variant]] = {kind: Registry(kind) for kind in KINDS}


def _kind(kind: str) -> Registry[Variant]:
  if kind not in VARIANTS:
    raise ValueError(f"unknown variant kind {kind!r}; known kinds: {', '.join(KINDS)}")
  return VARIANTS[kind]


def register(kind: str, name: str, *, init=None, aliases=(), full_attention=False, prepare=None,
             fused=None, cost=None, positional=False, fusable=False, **flags):
  """Decorator registering the variant `fn` under `kind`/`name` (and aliases); `flags`: the
  Variant's other facts (additive_keys, all_pairs, at_positions, banded, dot_scale, kept_keys)."""
  reg = _kind(kind)

  def decorator(fn):
    doc = (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else ""
    for n in (name, *aliases):
      if n in reg:
        raise ValueError(f"{kind} {n!r} is already registered")
    for n in (name, *aliases):
      reg.add(n, Variant(kind, n, fn, init, doc, full_attention,
                         alias_of=None if n == name else name, prepare=prepare, fused=fused,
                         cost=cost, positional=positional, fusable=fusable, **flags))
    return fn

  return decorator


def get(name: str, kind: str | None = None) -> Variant:
  """Looks a variant up by name; `kind` disambiguates (and is required if a name is in two kinds)."""
  kinds = (kind,) if kind else KINDS
  regs = [_kind(k) for k in kinds]
  found = [r.get(name) for r in regs if name in r]
  if not found:
    known = "; ".join(f"{r.what}: {', '.join(r.names())}" for r in regs)
    raise KeyError(f"unknown {kind or 'variant'} {name!r}. Known — {known}")
  if len(found) > 1:
    raise KeyError(f"{name!r} names a variant of several kinds; pass kind=")
  return found[0]


def names(kind: str) -> list[str]:
  """Registered names of one kind, aliases included, sorted."""
  return _kind(kind).names()


def canonical_names(kind: str) -> list[str]:
  """Registered names of one kind without aliases, sorted."""
  return [n for n in names(kind) if VARIANTS[kind].get(n).alias_of is None]


def with_fused(kind: str = "score") -> list[str]:
  """Canonical names of the variants of `kind` that carry a fused-kernel implementation."""
  return [n for n in canonical_names(kind) if VARIANTS[kind].get(n).fused is not None]


def fusable(kind: str) -> list[str]:
  """Canonical names of the normalizers or scopes (`kind`) that fused attention stands in for."""
  return [n for n in canonical_names(kind) if VARIANTS[kind].get(n).fusable]
