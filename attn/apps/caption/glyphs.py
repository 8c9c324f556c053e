"""Handwriting-free digit images: glyphs of the fonts matplotlib ships, rendered once, then warped.

Nothing is downloaded: the glyphs come from the TrueType files in matplotlib's mpl-data (DejaVu
Sans/Serif/Mono, STIX), drawn with FreeType (matplotlib.ft2font) at one size, cropped, and kept
as a bank `[F, C, G, G]` of canonical bitmaps in [0, 1] (built once per process; every image
afterwards is numpy indexing). A cell is a glyph of the bank drawn through a
random similarity transform (scale, small rotation, shift) with a random stroke intensity and
pixel noise; a blank cell is noise alone.

Axis names: N cells, F fonts, C characters, G the bank's glyph size, P the cell size in pixels.
"""

from __future__ import annotations

import functools
import os

import numpy as np

DIGITS = "0123456789"
# Distractors: glyphs no digit is easily read as (no O, I, l, S, B, Z, G, q, g).
DISTRACTORS = "ACEFHKMNPRTVWXY#%&?@+"
FONTS = ("DejaVuSans.ttf", "DejaVuSerif.ttf", "DejaVuSansMono.ttf", "STIXGeneral.ttf")
G = 32  # the bank's glyph bitmaps are G x G, the glyph's longer side G - 4
_RENDER_PT = 48  # FreeType size the glyphs are drawn at before resizing to G


def font_path(name: str) -> str:
  """The file of a font matplotlib ships (mpl-data/fonts/ttf)."""
  from matplotlib import get_data_path  # pylint: disable=import-outside-toplevel
  return os.path.join(get_data_path(), "fonts", "ttf", name)


def _resize(img: np.ndarray, h: int, w: int) -> np.ndarray:
  """Bilinear resize of a 2-D array to [h, w] (pixel centres aligned)."""
  ys = (np.arange(h) + 0.5) * img.shape[0] / h - 0.5
  xs = (np.arange(w) + 0.5) * img.shape[1] / w - 0.5
  return _bilinear(img[None], np.zeros((1,), np.int64), ys[None, :, None], xs[None, None, :])[0]


def _bilinear(bank: np.ndarray, idx: np.ndarray, ys: np.ndarray, xs: np.ndarray) -> np.ndarray:
  """Samples images bank[idx] ([N] of [H, W]) at float coordinates ys, xs (broadcast to
  [N, h, w]); zero outside the image. Returns [N, h, w] float32."""
  ys, xs = np.broadcast_arrays(ys, xs)
  H, W = bank.shape[-2:]
  y0, x0 = np.floor(ys).astype(np.int64), np.floor(xs).astype(np.int64)
  fy, fx = (ys - y0).astype(np.float32), (xs - x0).astype(np.float32)
  n = idx.reshape(-1, *([1] * (ys.ndim - 1)))
  out = np.zeros(ys.shape, np.float32)
  for dy, wy in ((0, 1 - fy), (1, fy)):
    for dx, wx in ((0, 1 - fx), (1, fx)):
      yy, xx = y0 + dy, x0 + dx
      inside = (yy >= 0) & (yy < H) & (xx >= 0) & (xx < W)
      v = bank[n, np.clip(yy, 0, H - 1), np.clip(xx, 0, W - 1)]
      out += np.where(inside, v, 0.0) * wy * wx
  return out


def _render_glyph(font, ch: str) -> np.ndarray:
  """One character as a G x G bitmap in [0, 1], centred, its longer side G - 4 pixels."""
  font.set_text(ch)
  font.draw_glyphs_to_bitmap()
  img = np.asarray(font.get_image(), np.float32) / 255.0
  rows, cols = np.nonzero(img > 0.05)
  img = img[rows.min():rows.max() + 1, cols.min():cols.max() + 1]
  side = G - 4
  scale = side / max(img.shape)
  h, w = max(1, round(img.shape[0] * scale)), max(1, round(img.shape[1] * scale))
  out = np.zeros((G, G), np.float32)
  top, left = (G - h) // 2, (G - w) // 2
  out[top:top + h, left:left + w] = np.clip(_resize(img, h, w), 0.0, 1.0)
  return out


@functools.lru_cache(maxsize=8)
def glyph_bank(chars: str = DIGITS + DISTRACTORS, fonts: tuple[str, ...] = FONTS) -> np.ndarray:
  """[F, C, G, G] float32 in [0, 1]: every character of `chars` in every font of `fonts`
  (file names in matplotlib's mpl-data/fonts/ttf). Cached: rendered once per process."""
  from matplotlib import ft2font  # pylint: disable=import-outside-toplevel
  bank = np.zeros((len(fonts), len(chars), G, G), np.float32)
  for f, name in enumerate(fonts):
    font = ft2font.FT2Font(font_path(name))
    font.set_size(_RENDER_PT, 72)
    for c, ch in enumerate(chars):
      bank[f, c] = _render_glyph(font, ch)
  return bank


def render_cells(bank: np.ndarray, font: np.ndarray, char: np.ndarray, rng: np.random.Generator,
                 cell_px: int, *, scale=(0.65, 0.95), max_rotate_deg=12.0, max_shift=0.1,
                 noise=0.06) -> np.ndarray:
  """Draws cells: bank[font[n], char[n]] ([F, C, G, G] bank; char -1 = blank) through a random
  similarity transform: the glyph's box spans `scale` of the cell, rotated by up to
  +-max_rotate_deg, shifted by up to max_shift of the cell; the stroke's intensity varies in
  [0.6, 1] and Gaussian noise of std `noise` is added. Returns [N, P, P] float32 in [0, 1]."""
  n = char.shape[0]
  s = rng.uniform(*scale, n) * cell_px / G  # output pixels per bank pixel
  theta = np.deg2rad(rng.uniform(-max_rotate_deg, max_rotate_deg, n))
  shift = rng.uniform(-max_shift, max_shift, (n, 2)) * cell_px
  ink = rng.uniform(0.6, 1.0, n).astype(np.float32)
  c = (cell_px - 1) / 2
  py, px = np.meshgrid(np.arange(cell_px) - c, np.arange(cell_px) - c, indexing="ij")
  py = py[None] - shift[:, 0, None, None]  # [N, P, P]
  px = px[None] - shift[:, 1, None, None]
  cos, sin = np.cos(theta)[:, None, None], np.sin(theta)[:, None, None]
  # The inverse map: output pixel -> bank pixel (rotate back, unscale, about both centres).
  ys = (cos * py + sin * px) / s[:, None, None] + (G - 1) / 2
  xs = (-sin * py + cos * px) / s[:, None, None] + (G - 1) / 2
  F, C = bank.shape[:2]
  flat = bank.reshape(F * C, G, G)
  img = _bilinear(flat, font * C + np.maximum(char, 0), ys, xs) * ink[:, None, None]
  img = np.where((char >= 0)[:, None, None], img, 0.0)
  img = img + rng.normal(0.0, noise, img.shape).astype(np.float32)
  return np.clip(img, 0.0, 1.0).astype(np.float32)


def strip(cells: np.ndarray) -> np.ndarray:
  """[..., R, P, P] cells -> [..., P, R * P], the image they tile left to right."""
  *lead, R, P, _ = cells.shape
  return np.moveaxis(cells, -3, -2).reshape(*lead, P, R * P)


def cell_boxes(num_cells: int, cell_px: int) -> np.ndarray:
  """[R, 4] (top, left, height, width) in pixels of each cell of a strip (`strip`)."""
  return np.array([[0, r * cell_px, cell_px, cell_px] for r in range(num_cells)], np.int32)
