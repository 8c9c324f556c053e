"""What both searches share: the step-function interface (its checks and its outputs) and the
search results `DecodeOutput` / `NBest` (see the package docstring for the contract)."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

NEG_INF = -jnp.inf  # only ever combined through jnp.where / max / top_k, never multiplied by 0

StepFn = Callable[[Any, jax.Array], tuple]  # (state, log_probs, weights[, extras])


class NBest(NamedTuple):
  """All K hypotheses of a beam search, best first (sorted by `scores`)."""
  tokens: jax.Array     # [B, K, T] int32, PAD after EOS
  lengths: jax.Array    # [B, K] int32, EOS included (T for a hypothesis cut at max_len)
  weights: jax.Array    # [B, K, T, Ts] float32, zeros after EOS
  log_probs: jax.Array  # [B, K] float32, sum of token log-probs
  # [B, K] float32, the ranking: log_probs / gnmt_length_penalty(lengths)
  # + gnmt_coverage_penalty(weights) (the latter 0 unless coverage_penalty > 0)
  scores: jax.Array
  valid: jax.Array      # [B, K] bool: False for filler slots (fewer than K possible hypotheses)
  extras: dict | None = None  # name -> [B, K, T] float32, zeros after EOS; None without extras


class DecodeOutput(NamedTuple):
  tokens: jax.Array    # [B, T] int32
  lengths: jax.Array   # [B] int32
  weights: jax.Array   # [B, T, Ts] float32
  scores: jax.Array    # [B] float32, sum of token log-probs (not length-normalized)
  nbest: NBest | None = None  # beam search only
  extras: dict | None = None  # name -> [B, T] float32, zeros after EOS; None without extras


def tile_beams(tree, beam_size):
  """[B, ...] -> [B*K, ...] (row b*K + k is beam k of example b), for every leaf of `tree`.

  Use it to close step_fn over per-source arrays that never change during decoding (encoder
  memory) instead of carrying them in `state`, which beam search reorders at every step.
  """
  return jax.tree.map(lambda x: jnp.repeat(x, beam_size, axis=0), tree)


def unpack(out):
  """step_fn's output -> (state, log_probs, weights, extras dict or None)."""
  if not isinstance(out, tuple) or len(out) not in (3, 4):
    raise ValueError("step_fn must return (state, log_probs, weights) or (state, log_probs, "
                     f"weights, extras), got {type(out).__name__} of length "
                     f"{len(out) if isinstance(out, tuple) else '?'}")
  return (*out[:3], out[3] if len(out) == 4 else None)


def step_shapes(step_fn, init_state, batch_size):
  """V, Ts and the extras' names (None without extras) from an abstract evaluation of one step;
  checks the state's batch axis and the shapes step_fn returns."""
  for path, leaf in jax.tree_util.tree_leaves_with_path(init_state):
    if jnp.ndim(leaf) == 0 or jnp.shape(leaf)[0] != batch_size:
      raise ValueError(f"state leaf {jax.tree_util.keystr(path)} has shape {jnp.shape(leaf)}; "
                       f"every leaf needs a leading batch axis of size {batch_size}")
  y0 = jax.ShapeDtypeStruct((batch_size,), jnp.int32)
  _, logp, w, extras = unpack(jax.eval_shape(step_fn, init_state, y0))
  if logp.ndim != 2 or logp.shape[0] != batch_size:
    raise ValueError(f"step_fn log_probs must be [B={batch_size}, V], got {logp.shape}")
  if w.ndim != 2 or w.shape[0] != batch_size:
    raise ValueError(f"step_fn weights must be [B={batch_size}, Ts], got {w.shape}")
  if extras is not None:
    if not isinstance(extras, dict):
      raise ValueError(f"step_fn extras must be a dict name -> [B], got {type(extras).__name__}")
    for name, x in extras.items():
      if getattr(x, "shape", None) != (batch_size,):
        raise ValueError(f"step_fn extras[{name!r}] must be [B={batch_size}], got "
                         f"{getattr(x, 'shape', type(x).__name__)}")
    extras = tuple(extras)
  return logp.shape[1], w.shape[1], extras


def check_sizes(batch_size, max_len, beam_size=1):
  for name, v in (("batch_size", batch_size), ("max_len", max_len), ("beam_size", beam_size)):
    if not isinstance(v, int) or v < 1:
      raise ValueError(f"{name} must be a positive Python int (static), got {v!r}")


def check_room(step_fn, init_state, max_len):
  """A step function whose state holds a fixed number of steps (a Transformer's key/value cache)
  carries `check_room(state, max_len)`, which raises if a search of max_len steps would run past
  it. Checked here, on the static shapes, before the search is traced, so the step itself needs
  no run-time check (one calling back into Python would keep XLA's compilation cache from
  keeping the search)."""
  check = getattr(step_fn, "check_room", None)
  if check is not None:
    check(init_state, max_len)


def f32_extras(extras, shape):
  """Per-step extras as float32 arrays of `shape` ({} for none)."""
  return {k: v.astype(jnp.float32).reshape(shape) for k, v in (extras or {}).items()}
