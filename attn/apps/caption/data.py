"""Digit-strip captioning data: images of K cells, some holding digits, captioned by the digits.

An image is a strip of `cells` square cells of `cell_px` pixels. Between `min_digits` and
`max_digits` cells (chosen at random) hold a digit 0-9; each other cell holds a distractor glyph
(a letter or a symbol, attn.apps.caption.glyphs.DISTRACTORS) with probability `distractor_rate`, else
nothing but noise. Every glyph is drawn from a random font of matplotlib's bundled ones with a
random scale, rotation and shift (attn.apps.caption.glyphs). The caption is the digits in reading order
(left to right), e.g. "7 3 5"; the gold alignment of output step t is the cell holding its digit
(the EOS step has none).

Batches have the shapes of the seq2seq pipeline (attn.data.pipeline), so the training loop, the
decoders and the evaluation read them unchanged, with the regions in the place of source tokens:

  src          [B, R, P*P] float32 in [0, 1]  each cell's pixels (R = cells regions)
  src_lengths  [B] int32                      R (the strips are never padded)
  tgt          [B, Tt] int32                  digit ids then EOS, PAD-padded (Tt = max_digits + 1)
  tgt_lengths  [B] int32                      digits + 1
  alignments   [B, Tt, R] float32             1 at (t, the cell of digit t)
  example_id   [B] int64                      -1 for the filler rows of a split's last batch

The training stream is drawn per step from (seed, step), so a resumed run reads the same batches;
the eval and test splits are fixed sets drawn from their own streams.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from attn.config import configurable
from attn.config.configurable import option
from attn.apps.caption import glyphs
from attn.data.base import DataError
from attn.data.tokenize import TokenizerSpec, Vocab
from attn.data.tokens import EOS, PAD

_STREAMS = {"train": 1, "eval": 2, "test": 3}  # the rng stream of each split, after the seed
BLANK = "_"  # how an empty cell is written in `sources`


@dataclasses.dataclass(frozen=True)
class CaptionDataConfig:
  """The `data` section of the captioning experiment: the one home of its fields and defaults."""
  cells: int = option(6, "cells in a strip: the regions the decoder attends over")
  cell_px: int = option(16, "cell size in pixels (a multiple of 4: the CNN pools twice by 2)")
  min_digits: int = option(1, "fewest digits in an image")
  max_digits: int = option(4, "most digits in an image (at most `cells`)")
  distractor_rate: float = option(0.5, "chance that a cell without a digit holds a distractor "
                                       "glyph (else it is blank)")
  fonts: tuple[str, ...] = option(glyphs.FONTS, "font files of matplotlib's mpl-data/fonts/ttf")
  max_rotate_deg: float = option(12.0, "glyph rotation, uniform in +-this")
  noise: float = option(0.06, "std of the Gaussian pixel noise")
  eval_examples: int = option(500, "images in the eval split (evaluated during training)")
  test_examples: int = option(1000, "images in the test split (scored at the end)")
  batch_size: int = option(64, "images per batch")
  seed: int = option(0, "data seed: the train stream and the eval/test sets")

  def __post_init__(self):
    def check(ok, msg):
      if not ok:
        raise DataError(f"data.{msg}")

    check(self.cells >= 1, f"cells={self.cells} must be >= 1")
    check(self.cell_px >= 8 and self.cell_px % 4 == 0,
          f"cell_px={self.cell_px} must be a multiple of 4, at least 8")
    check(1 <= self.min_digits <= self.max_digits,
          f"min_digits={self.min_digits} must be >= 1 and <= max_digits={self.max_digits}")
    check(self.max_digits <= self.cells,
          f"max_digits={self.max_digits} is over cells={self.cells}: one digit a cell")
    check(0.0 <= self.distractor_rate <= 1.0,
          f"distractor_rate={self.distractor_rate} must be in [0, 1]")
    check(len(self.fonts) >= 1, "fonts must name at least one font")
    check(self.max_rotate_deg >= 0 and self.noise >= 0, "max_rotate_deg and noise must be >= 0")
    check(self.eval_examples >= 1 and self.test_examples >= 1,
          "eval_examples and test_examples must be >= 1")
    check(self.batch_size >= 1, f"batch_size={self.batch_size} must be >= 1")
    for name in self.fonts:
      check(os.path.exists(glyphs.font_path(name)),
            f"fonts: {name!r} is not in matplotlib's mpl-data/fonts/ttf")

  tokens_per_batch = 0  # fixed batch sizes (the loop's mesh check reads it)

  @property
  def pixels(self) -> int:
    """P*P: the width of one region's input."""
    return self.cell_px * self.cell_px

  @property
  def max_tgt_len(self) -> int:
    return self.max_digits + 1

  @classmethod
  def from_config(cls, cfg) -> "CaptionDataConfig":
    return configurable.from_config(cls, cfg, section="data")


@dataclasses.dataclass
class Layout:
  """What a set of images shows, before any pixel is drawn ([N, R] each): char indexes into
  glyphs.DIGITS + glyphs.DISTRACTORS (-1 = blank) and the font of each cell."""
  char: np.ndarray
  font: np.ndarray

  def digit_cells(self, n: int) -> np.ndarray:
    """The cells holding digits in image n, left to right."""
    return np.nonzero((self.char[n] >= 0) & (self.char[n] < len(glyphs.DIGITS)))[0]

  def caption(self, n: int) -> str:
    return " ".join(glyphs.DIGITS[self.char[n, r]] for r in self.digit_cells(n))

  def description(self, n: int) -> str:
    """The cells' contents, e.g. "7 _ K 3": what the image shows, as text."""
    chars = glyphs.DIGITS + glyphs.DISTRACTORS
    return " ".join(BLANK if c < 0 else chars[c] for c in self.char[n])


def draw_layout(cfg: CaptionDataConfig, rng: np.random.Generator, n: int) -> Layout:
  """n random images' contents (module docstring)."""
  R, nd = cfg.cells, len(glyphs.DIGITS)
  k = rng.integers(cfg.min_digits, cfg.max_digits + 1, n)
  order = np.argsort(rng.random((n, R)), axis=1)  # a random permutation of the cells per image
  holds_digit = np.zeros((n, R), bool)
  np.put_along_axis(holds_digit, order, np.arange(R)[None, :] < k[:, None], axis=1)
  digit = rng.integers(0, nd, (n, R))
  distractor = nd + rng.integers(0, len(glyphs.DISTRACTORS), (n, R))
  shown = rng.random((n, R)) < cfg.distractor_rate
  char = np.where(holds_digit, digit, np.where(shown, distractor, -1))
  return Layout(char, rng.integers(0, len(cfg.fonts), (n, R)))


def render(cfg: CaptionDataConfig, layout: Layout, rng: np.random.Generator) -> np.ndarray:
  """The cells' pixels [N, R, P, P] float32 in [0, 1]."""
  N, R = layout.char.shape
  bank = glyphs.glyph_bank(glyphs.DIGITS + glyphs.DISTRACTORS, tuple(cfg.fonts))
  cells = glyphs.render_cells(bank, layout.font.reshape(-1), layout.char.reshape(-1), rng,
                              cfg.cell_px, max_rotate_deg=cfg.max_rotate_deg, noise=cfg.noise)
  return cells.reshape(N, R, cfg.cell_px, cfg.cell_px)


def make_batch(cfg: CaptionDataConfig, vocab: Vocab, layout: Layout, cells: np.ndarray,
               example_ids: np.ndarray) -> dict:
  """The batch dict (module docstring) of images `layout` / `cells` ([N, R, P, P])."""
  N, R = layout.char.shape
  Tt = cfg.max_tgt_len
  tgt = np.full((N, Tt), PAD, np.int32)
  align = np.zeros((N, Tt, R), np.float32)
  lengths = np.zeros((N,), np.int32)
  for n in range(N):
    where = layout.digit_cells(n)
    tgt[n, :len(where)] = [vocab.token_to_id(glyphs.DIGITS[layout.char[n, r]]) for r in where]
    tgt[n, len(where)] = EOS
    align[n, np.arange(len(where)), where] = 1.0
    lengths[n] = len(where) + 1
  return {"src": cells.reshape(N, R, -1).astype(np.float32),
          "src_lengths": np.full((N,), R, np.int32), "tgt": tgt, "tgt_lengths": lengths,
          "alignments": align, "example_id": np.asarray(example_ids, np.int64)}


class RegionLabels:
  """The heatmaps' column labels of the regions ("#1" ... "#R"): what `src_vocab.labels` gives
  for token sources, given one row of `src` ([R, P*P])."""

  @staticmethod
  def labels(regions) -> list[str]:
    return [f"#{r + 1}" for r in range(len(regions))]


@dataclasses.dataclass
class Split:
  layout: Layout
  cells: np.ndarray  # [N, R, P, P]


class CaptionBundle:
  """What the training loop reads from a data bundle (attn.data.pipeline.DataBundle's
  interface): the train stream, one exact pass over eval/test, references and sources."""
  has_alignments = True

  def __init__(self, cfg: CaptionDataConfig):
    self.config = cfg
    self.src_vocab = RegionLabels()
    self.tgt_vocab = Vocab(list(glyphs.DIGITS), TokenizerSpec("space"))
    self.splits = {}
    for role, n in (("eval", cfg.eval_examples), ("test", cfg.test_examples)):
      rng = np.random.default_rng([cfg.seed, _STREAMS[role]])
      layout = draw_layout(cfg, rng, n)
      self.splits[role] = Split(layout, render(cfg, layout, rng))
    self.splits["train"] = None  # drawn per step (train_iter)

  def _train_rng(self, step: int) -> np.random.Generator:
    return np.random.default_rng([self.config.seed, _STREAMS["train"], int(step)])

  def train_batch(self, step: int, select_rows=None) -> dict:
    """The batch of training step `step` (the same on every call); `select_rows` picks this
    process's rows (attn.training.distributed.RowShard.select)."""
    rng = self._train_rng(step)
    layout = draw_layout(self.config, rng, self.config.batch_size)
    rows = np.arange(self.config.batch_size)
    if select_rows is not None:
      rows = np.asarray(select_rows(rows))
      rows = np.where(rows >= 0, rows, 0)  # filler rows repeat row 0
    layout = Layout(layout.char[rows], layout.font[rows])
    return make_batch(self.config, self.tgt_vocab, layout, render(self.config, layout, rng), rows)

  def train_iter(self, start_step: int = 0, select_rows=None):
    """Training batches from `start_step` on; a thread draws the next batch while the caller
    trains on this one (numpy releases the GIL in the warps, JAX in the step)."""
    import concurrent.futures  # pylint: disable=import-outside-toplevel
    step = int(start_step)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
      ahead = pool.submit(self.train_batch, step, select_rows)
      while True:
        batch = ahead.result()
        step += 1
        ahead = pool.submit(self.train_batch, step, select_rows)
        yield batch

  def train_tokens(self, step: int) -> int:
    """Target tokens (EOS included) of the global batch of `step`."""
    layout = draw_layout(self.config, self._train_rng(step), self.config.batch_size)
    return int(sum(len(layout.digit_cells(n)) + 1 for n in range(self.config.batch_size)))

  def batches(self, role: str = "eval"):
    """One exact pass over `role` in batches of batch_size (the last one completed with filler
    rows whose example_id is -1, so every batch has one shape)."""
    if role not in ("eval", "test"):
      raise DataError(f"no {role} split to pass over (eval or test)")
    sp, B = self.splits[role], self.config.batch_size
    N = sp.cells.shape[0]
    for start in range(0, N, B):
      ids = np.arange(start, start + B)
      rows = np.minimum(ids, N - 1)
      layout = Layout(sp.layout.char[rows], sp.layout.font[rows])
      yield make_batch(self.config, self.tgt_vocab, layout, sp.cells[rows],
                       np.where(ids < N, ids, -1))

  def references(self, role: str = "test") -> list[str]:
    sp = self.splits[role]
    return [sp.layout.caption(n) for n in range(sp.cells.shape[0])]

  def sources(self, role: str = "test") -> list[str]:
    sp = self.splits[role]
    return [sp.layout.description(n) for n in range(sp.cells.shape[0])]

  def image(self, role: str, example_id: int) -> np.ndarray:
    """[P, R * P] uint8: the strip of example `example_id` (0 = black, 255 = white ink)."""
    return np.round(glyphs.strip(self.splits[role].cells[example_id]) * 255).astype(np.uint8)

  def regions(self) -> np.ndarray:
    """[R, 4] (top, left, height, width) of each region in `image`'s pixels."""
    return glyphs.cell_boxes(self.config.cells, self.config.cell_px)

  def summary(self) -> str:
    c = self.config
    return (f"digit strips: {c.cells} cells of {c.cell_px}px, {c.min_digits}-{c.max_digits} "
            f"digits, distractor rate {c.distractor_rate:g}, {len(c.fonts)} fonts; eval "
            f"{c.eval_examples}, test {c.test_examples}, batch {c.batch_size}")


def load(data_config, workdir=None) -> CaptionBundle:
  """The bundle of a `data` section (a ConfigDict or a CaptionDataConfig); nothing is written."""
  del workdir  # everything is drawn from the seed; there is nothing to cache on disk
  cfg = (data_config if isinstance(data_config, CaptionDataConfig)
         else CaptionDataConfig.from_config(data_config))
  return CaptionBundle(cfg)
