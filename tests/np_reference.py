"""Independent float64 NumPy references for the attention primitives.

Written from the papers' definitions, row by row where that is clearer, and deliberately by a
different algorithm where one exists (sparsemax and entmax by bisection on the threshold tau, not by
sorting), so a shared mistake is unlikely.
"""

import numpy as np


def f64(x):
  return np.asarray(x, dtype=np.float64)


# ---------------------------------------------------------------- masks, built here (never taken
# from attn.masks, so a boundary mistake there cannot hide in the reference too)

def lengths_mask(lengths, T):
  """[..., T] bool, True at positions j < length, by a loop over every position."""
  lengths = np.asarray(lengths)
  out = np.zeros(lengths.shape + (T,), bool)
  for idx in np.ndindex(lengths.shape):
    for j in range(T):
      out[idx + (j,)] = j < lengths[idx]
  return out


def attention_mask(Tq, Tk, *, key_lengths=None, causal=False, lead=()):
  """[*lead, Tq, Tk] bool from key lengths ([*lead]) and top-left causal masking, loop by loop."""
  out = np.ones(tuple(lead) + (Tq, Tk), bool)
  for idx in np.ndindex(tuple(lead)):
    for i in range(Tq):
      for j in range(Tk):
        ok = True
        if key_lengths is not None:
          ok = ok and j < np.asarray(key_lengths)[idx]
        if causal:
          ok = ok and j <= i
        out[idx + (i, j)] = ok
  return out


def window_mask(centers, Tk, half_width):
  """[..., Tq, Tk] bool: |j - p_i| <= D, in float64."""
  centers = f64(centers)
  out = np.zeros(centers.shape + (Tk,), bool)
  for idx in np.ndindex(centers.shape):
    for j in range(Tk):
      out[idx + (j,)] = abs(j - centers[idx]) <= half_width
  return out


def gaussian_window(centers, Tk, half_width):
  """[..., Tq, Tk] float64 Luong eq. 10 gain exp(-(s - p)^2 / (2 sigma^2)), sigma = D / 2."""
  sigma = half_width / 2.0
  d = np.arange(Tk, dtype=np.float64) - f64(centers)[..., None]
  return np.exp(-d * d / (2.0 * sigma * sigma))


# ---------------------------------------------------------------- scores: [..., Tq, Tk]

def dot(params, q, k):
  return f64(q) @ np.swapaxes(f64(k), -1, -2)


def scaled_dot(params, q, k):
  return dot(params, q, k) / np.sqrt(np.shape(q)[-1])


def general(params, q, k):
  return f64(q) @ f64(params["W"]) @ np.swapaxes(f64(k), -1, -2)


def additive(params, q, k):
  q, k = f64(q), f64(k)
  W, U, b, v = (f64(params[n]) for n in ("W", "U", "b", "v"))
  Tq, Tk = q.shape[-2], k.shape[-2]
  out = np.zeros(np.broadcast_shapes(q.shape[:-2], k.shape[:-2]) + (Tq, Tk))
  for i in range(Tq):
    for j in range(Tk):
      out[..., i, j] = np.tanh(q[..., i, :] @ W + k[..., j, :] @ U + b) @ v
  return out


def location(params, q, k):
  Tk = np.shape(k)[-2]
  e = f64(q) @ f64(params["W"])[:, :Tk]
  return np.broadcast_to(e, np.broadcast_shapes(e.shape, np.shape(k)[:-2] + (1, Tk)))


SCORES = {"dot": dot, "scaled_dot": scaled_dot, "general": general, "bilinear": general,
          "additive": additive, "concat": additive, "location": location}


# ---------------------------------------------------------------- normalizers over one row

def _rows(fn, z, mask):
  z = f64(z)
  mask = np.broadcast_to(np.ones_like(z, bool) if mask is None else mask, z.shape)
  out = np.zeros_like(z)
  for idx in np.ndindex(z.shape[:-1]):
    m = mask[idx]
    if m.any():
      out[idx + (m,)] = fn(z[idx][m])
  return out


def _softmax_row(z):
  e = np.exp(z - z.max())
  return e / e.sum()


def _bisect_threshold(z, p_of_tau):
  """tau with sum(p_of_tau(z, tau)) == 1 by bisection (monotone decreasing in tau)."""
  lo, hi = z.max() - 1.0, z.max()
  for _ in range(200):
    mid = (lo + hi) / 2
    if p_of_tau(z, mid).sum() >= 1.0:
      lo = mid
    else:
      hi = mid
  return (lo + hi) / 2


def _sparsemax_row(z):
  f = lambda z, t: np.maximum(z - t, 0.0)
  return f(z, _bisect_threshold(z, f))


def _entmax15_row(z):
  # p = [z/2 - tau]^2_+ ; work with y = z/2, tau in [max(y) - 1, max(y)].
  f = lambda y, t: np.maximum(y - t, 0.0) ** 2
  y = z / 2.0
  return f(y, _bisect_threshold(y, f))


def softmax(z, mask=None):
  return _rows(_softmax_row, z, mask)


def sparsemax(z, mask=None):
  return _rows(_sparsemax_row, z, mask)


def entmax15(z, mask=None):
  return _rows(_entmax15_row, z, mask)


NORMALIZERS = {"softmax": softmax, "sparsemax": sparsemax, "entmax15": entmax15}


# ---------------------------------------------------------------- whole attention

def attend(e, v, mask=None, normalizer="softmax", temperature=1.0, gain=None):
  w = NORMALIZERS[normalizer](f64(e) / temperature, mask)
  if gain is not None:
    w = w * gain
  return w @ f64(v), w


def topk_mask(e, mask, k):
  """Keep the k largest valid scores of each row (ties with the k-th all kept)."""
  e = f64(e)
  mask = np.broadcast_to(mask, e.shape)
  out = np.zeros(e.shape, bool)
  for idx in np.ndindex(e.shape[:-1]):
    valid = np.flatnonzero(mask[idx])
    if valid.size == 0:
      continue
    vals = np.sort(e[idx][valid])[::-1]
    kth = vals[min(k, valid.size) - 1]
    out[idx + (valid[e[idx][valid] >= kth],)] = True
  return out


def linear_attention(q, k, v, key_mask=None, causal=False):
  """Linear attention by its weight-matrix definition: w_ij ∝ phi(q_i).phi(k_j)."""
  phi = lambda x: np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))  # elu(x) + 1
  s = phi(f64(q)) @ np.swapaxes(phi(f64(k)), -1, -2)  # [..., Tq, Tk]
  Tq, Tk = s.shape[-2:]
  m = np.ones(s.shape, bool)
  if key_mask is not None:
    m = m & np.asarray(key_mask)[..., None, :]
  if causal:
    m = m & (np.arange(Tk)[None, :] <= np.arange(Tq)[:, None])
  s = np.where(m, s, 0.0)
  den = s.sum(-1, keepdims=True)
  w = np.divide(s, den, out=np.zeros_like(s), where=den > 0)
  return w @ f64(v)


def local_p(params, q, mask, half_width):
  """Luong local-p centres, window mask and Gaussian gain, loop by loop."""
  q = f64(q)
  S = np.asarray(mask).sum(-1).astype(np.float64)  # [..., Tq]
  h = np.tanh(q @ f64(params["W_p"])) @ f64(params["v_p"])
  p = S / (1.0 + np.exp(-h))
  Tk = np.shape(mask)[-1]
  return p, np.asarray(mask) & window_mask(p, Tk, half_width), gaussian_window(p, Tk, half_width)


def multihead(params, x_q, x_kv, num_heads, score="scaled_dot", *, key_lengths=None,
              causal=False):
  """Multi-head attention in float64, head by head: project, score, softmax over the keys this
  reference masks itself (key_lengths, causal), weighted sum, output projection summed over heads.

  x_q: [B, Tq, d], x_kv: [B, Tk, d_kv]; params as attn.init_multihead. Returns (out [B, Tq, d_out],
  weights [B, H, Tq, Tk]).
  """
  x_q, x_kv = f64(x_q), f64(x_kv)
  B, Tq, Tk = x_q.shape[0], x_q.shape[-2], x_kv.shape[-2]
  m = attention_mask(Tq, Tk, key_lengths=key_lengths, causal=causal, lead=(B,))
  out, weights = 0.0, []
  for h in range(num_heads):
    q = x_q @ f64(params["wq"])[:, h]  # [B, Tq, dh]
    k = x_kv @ f64(params["wk"])[:, h]
    v = x_kv @ f64(params["wv"])[:, h]
    sp = None if "score" not in params else {n: np.asarray(p)[h] for n, p in params["score"].items()}
    ctx, w = attend(SCORES[score](sp, q, k), v, m)
    out = out + ctx @ f64(params["wo"])[h]
    weights.append(w)
  return out, np.stack(weights, axis=-3)


def numeric_grad(f, x, eps=1e-6):
  """d f(x) / dx of a scalar float64 function by central differences, entry by entry."""
  x = f64(x)
  g = np.zeros_like(x)
  for idx in np.ndindex(x.shape):
    hi, lo = x.copy(), x.copy()
    hi[idx] += eps
    lo[idx] -= eps
    g[idx] = (f(hi) - f(lo)) / (2 * eps)
  return g
