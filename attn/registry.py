"""One registry of named variants: attention scores, normalizers and scopes, model decoders, cells,
architectures and positional encodings.

Flags, sweeps and tests look names up here; nothing else in the project branches on a
variant's name: behaviour that depends on the variant (its key-side `prepare`, its fused kernel,
its cost model) is carried by its entry, and lists such as "the fused scores" are derived from
the entries (`with_fused`). A name registers once (duplicates are refused) and an unknown name fails
with the list of known ones of that kind.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

KINDS = ("score", "normalizer", "scope", "decoder", "cell", "task", "arch", "pos_encoding")


@dataclasses.dataclass(frozen=True)
class Variant:
  """A named variant.

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
    a leading H axis, key_lengths: [N] int32 or None; context [N, H, Tq, dv]. None: no kernel.
  cost: for scores, `cost(dq, dk, d_attn) -> ScoreCost` (matmul FLOPs per key, per query and per
    query-key pair), used by benchmarks' analytic FLOP counts.
  positional: for scores, True when e_ij depends on where key j sits, not only on the query and
    key vectors (Luong's location score reads column j of W_a): such a score cannot score a
    re-indexed slice of the keys (attn.banded).
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


VARIANTS: dict[str, dict[str, Variant]] = {kind: {} for kind in KINDS}


def register(kind: str, name: str, *, init=None, aliases=(), full_attention=False, prepare=None,
             fused=None, cost=None, positional=False):
  """Decorator registering `fn` under `kind`/`name` (and aliases)."""
  if kind not in KINDS:
    raise ValueError(f"unknown variant kind {kind!r}; known kinds: {', '.join(KINDS)}")

  def decorator(fn):
    doc = (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else ""
    for n in (name, *aliases):
      if n in VARIANTS[kind]:
        raise ValueError(f"{kind} {n!r} is already registered")
    for n in (name, *aliases):
      VARIANTS[kind][n] = Variant(kind, n, fn, init, doc, full_attention,
                                  alias_of=None if n == name else name, prepare=prepare,
                                  fused=fused, cost=cost, positional=positional)
    return fn

  return decorator


def get(name: str, kind: str | None = None) -> Variant:
  """Looks a variant up by name; `kind` disambiguates (and is required if a name is in two kinds)."""
  kinds = (kind,) if kind else KINDS
  if kind is not None and kind not in KINDS:
    raise ValueError(f"unknown variant kind {kind!r}; known kinds: {', '.join(KINDS)}")
  found = [VARIANTS[k][name] for k in kinds if name in VARIANTS[k]]
  if not found:
    known = "; ".join(f"{k}: {', '.join(sorted(VARIANTS[k]))}" for k in kinds)
    raise KeyError(f"unknown {kind or 'variant'} {name!r}. Known — {known}")
  if len(found) > 1:
    raise KeyError(f"{name!r} names a variant of several kinds; pass kind=")
  return found[0]


def names(kind: str) -> list[str]:
  """Registered names of one kind, aliases included, sorted."""
  if kind not in KINDS:
    raise ValueError(f"unknown variant kind {kind!r}; known kinds: {', '.join(KINDS)}")
  return sorted(VARIANTS[kind])


def canonical_names(kind: str) -> list[str]:
  """Registered names of one kind without aliases, sorted."""
  return [n for n in names(kind) if VARIANTS[kind][n].alias_of is None]


def with_fused(kind: str = "score") -> list[str]:
  """Canonical names of the variants of `kind` that carry a fused-kernel implementation."""
  return [n for n in canonical_names(kind) if VARIANTS[kind][n].fused is not None]
