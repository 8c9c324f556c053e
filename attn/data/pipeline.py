"""`load(data_config, workdir) -> DataBundle`: vocabularies, bucketed batches, references.

    TFDS data source (records) --lengths pass--> policies (drop/truncate/error) --> buckets
    grain.MapDataset.source(batch plan).map(collate) --> numpy batches

A batch is a dict of numpy arrays (B and the widths fixed per bucket, see `DataBundle.shapes`):
  src          [B, Ts] int32  source ids, then EOS, then PAD (=0)
  src_lengths  [B]     int32  tokens incl. EOS (0 for the filler rows that complete eval batches)
  tgt          [B, Tt] int32  target ids, then EOS, then PAD; the decoder input is BOS + tgt[:, :-1]
  tgt_lengths  [B]     int32  incl. EOS
  example_id   [B]     int32  record index in its split (line number - 1 for text files); -1 = filler
  alignments   [B, Tt, Ts] float32, built-in tasks only: row t is the gold distribution over the
               source positions target token t comes from (rows of aligned tokens sum to 1, target
               EOS -> source EOS, unaligned tokens and padding all zero).
With data.extended_vocab (copying models; V = the shared vocabulary's size), also:
  src_ext      [B, Ts] int32  `src`, but the k-th distinct OOV token of the (truncated) source, in
                              order of first appearance, is V + k instead of UNK (k < Ts - 1, so
                              V + Ts bounds every bucket's extended vocabulary)
  tgt_ext      [B, Tt] int32  `tgt`, but an OOV token that is the source's k-th OOV is V + k; other
                              OOV tokens stay UNK. Filler rows of both are all PAD.
  (`bundle.source_oovs(role)[example_id]` is that list, for `Vocab.decode_extended`.)
With data.pack, training batches are rows of one shape (`DataBundle.pack_widths`), each holding
several examples one after another (bucketing.pack_plan); src/tgt and their lengths are the
rows' (every example keeps its own EOS; the lengths count the filled slots), and:
  src_segments, tgt_segments    [B, T] int32  1, 2, ... the example of the row a slot holds; 0 pad
  src_positions, tgt_positions  [B, T] int32  a slot's position within its example
  example_id                    [B]    int32  the row's first example
They carry no alignments, src_ext or tgt_ext; evaluation batches are never packed.

Training: `bundle.train_iter(start_step)` is infinite, reshuffled every epoch from (seed, epoch),
and a pure function of the step: batch k is the same whether reached by iterating or by resuming
at k. Evaluation: `bundle.batches("eval")` / `("test")` is one exact pass over every example (none
dropped; over-long ones truncated), in bucket order; put outputs back in corpus order with
`example_id` and score them against `bundle.references(role)` (the target text), and where
data.reference_fields name more references (annotations) against `bundle.annotations(role)`.

Bad input: `DataError` (see base.py) before any batch is made. Reading a split and its policies
are in splits.py, making a batch in collate.py.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import os
import sys
import tempfile
import threading
from typing import Iterator

import numpy as np

from attn.data import bucketing
from attn.data import vocab_record
from attn.data.base import SOURCES, DataError, disk_error, disk_full
from attn.data.collate import Collate
from attn.data.config import DataConfig
from attn.data.splits import SplitData, apply_policies, scan, token_counts
from attn.data.tokenize import Vocab, build_vocab, load_vocab, vocab_from_counts

log = logging.getLogger(__name__)


class _TrainPlan:
  """Infinite sequence: step -> (bucket, rows); epoch e's order comes from rng([seed, e]).

  make_epoch(rng) -> one epoch's [(bucket, rows)]: `bucketing.train_plan` over the buckets, or
  `bucketing.pack_plan` (rows [B, P]: the examples of each packed row)."""

  def __init__(self, make_epoch, seed: int, per_epoch: int | None = None):
    self.make_epoch, self.seed = make_epoch, seed
    self.per_epoch = per_epoch or len(make_epoch(np.random.default_rng(0)))
    self._cache: dict[int, list] = {}
    self._lock = threading.Lock()  # grain reads from several threads

  def epoch(self, e: int) -> list:
    with self._lock:
      if e not in self._cache:
        if len(self._cache) > 2:
          self._cache.pop(min(self._cache))
        self._cache[e] = self.make_epoch(np.random.default_rng([self.seed, e]))
      return self._cache[e]

  def __len__(self) -> int:
    return sys.maxsize

  def __getitem__(self, step: int):
    e, j = divmod(int(step), self.per_epoch)
    return self.epoch(e)[j]


@dataclasses.dataclass
class DataBundle:
  """Everything the training code needs from the data.

  config: the validated DataConfig.  src_vocab, tgt_vocab: Vocab (the same object if shared).
  shapes: [(Ts, Tt)] per bucket; train_batch_sizes / eval_batch_sizes: B per bucket, so the batch
    shapes are (B_k, Ts_k) and (B_k, Tt_k): at most len(shapes) compilations per split kind.
  splits: role ("train", "eval", "test") -> SplitData, for the roles the data has.
  has_alignments: batches carry `alignments` (built-in tasks).
  config.extended_vocab: batches carry `src_ext` and `tgt_ext` (module docstring).
  steps_per_epoch: training batches in one pass over the training split.
  """
  config: DataConfig
  src_vocab: Vocab
  tgt_vocab: Vocab
  shapes: list[tuple[int, int]]
  train_batch_sizes: list[int]
  eval_batch_sizes: list[int]
  splits: dict[str, SplitData]
  has_alignments: bool
  _source: object = dataclasses.field(repr=False, default=None)
  _plan: _TrainPlan | None = dataclasses.field(repr=False, default=None)
  pack_widths: tuple[int, int] | None = None  # data.pack: the (Ts, Tt) of the training rows

  @property
  def steps_per_epoch(self) -> int:
    return self._plan.per_epoch

  @property
  def train_shapes(self) -> list[tuple[int, int]]:
    """The (Ts, Tt) training batches take: every bucket's, or with data.pack the packed rows'."""
    return [self.pack_widths] if self.pack_widths else list(self.shapes)

  def _collate(self, role: str) -> Collate:
    src = self._source
    return Collate(self.splits[role], self.src_vocab, self.tgt_vocab, self.shapes, src.read,
                    src.read_alignment if self.has_alignments else None,
                    extended=self.config.extended_vocab,
                    packed=self.pack_widths if role == "train" else None)

  def train_dataset(self, select_rows=None):
    """Infinite grain.MapDataset of training batches; element k = the batch of step k.

    select_rows: for data parallel training over several processes, a function from a global
    batch's rows ([B] record rows, -1 = filler) to the rows this process reads (see
    attn.training.distributed.RowShard); a row -1 becomes a filler row. None: the whole batch.
    """
    import grain  # pylint: disable=import-outside-toplevel
    ds = grain.MapDataset.source(self._plan)
    if select_rows is not None:
      ds = ds.map(lambda item: (item[0], select_rows(item[1])))
    return ds.map(self._collate("train"))

  def train_iter(self, start_step: int = 0, select_rows=None) -> Iterator[dict[str, np.ndarray]]:
    """Training batches from `start_step` on (resume with the number of batches consumed);
    `select_rows`: see train_dataset (every process computes the same global plan and reads
    only its rows of each batch).

    With data.num_threads > 0, grain threads prepare data.prefetch batches ahead. The iterator's
    get_state()/set_state() ({"next_index": k}, relative to start_step) also checkpoint it.
    """
    import grain  # pylint: disable=import-outside-toplevel
    ds = self.train_dataset(select_rows).slice(slice(int(start_step), None))
    if self.config.num_threads <= 0:
      return (ds[i] for i in range(len(ds)))
    opts = grain.ReadOptions(num_threads=self.config.num_threads,
                             prefetch_buffer_size=self.config.prefetch)
    return iter(ds.to_iter_dataset(opts))

  def train_tokens(self, step: int) -> int:
    """Target tokens (EOS included) of the whole global batch of `step`, from the plan (no
    record is read): what each process counts when it reads only its own rows."""
    _, rows = self._plan[step]
    return int(self.splits["train"].tgt_len[rows[rows >= 0]].sum())

  def eval_plan(self, role: str) -> list:
    sp = self.splits[role]
    return bucketing.eval_plan(sp.bucket, self.eval_batch_sizes, self.shapes, sp.src_len, sp.tgt_len)

  def batches(self, role: str = "eval") -> Iterator[dict[str, np.ndarray]]:
    """One exact pass over the split of `role` ("eval" or "test"; "train" too, unshuffled)."""
    if role not in self.splits:
      raise DataError(f"no {role} split (data.{role}_split is empty or the task has none)")
    collate = self._collate(role)
    for item in self.eval_plan(role):
      yield collate(item)

  def eval_batches(self):
    return self.batches("eval")

  def test_batches(self):
    return self.batches("test")

  def references(self, role: str = "test") -> list[str]:
    """Target text of every record of the split, indexed by example_id (raw text, not tokenized)."""
    return [t for _, t in scan(self.splits[role].source, self._source.read)]

  def annotations(self, role: str = "test") -> list[list[str]]:
    """The non-empty texts of data.reference_fields of every record of the split (raw text),
    indexed by example_id: the references besides the target, e.g. AESLC's three annotated
    subjects. [] for every training record (not read there) and without reference fields."""
    src = self._source
    return [[r for r in refs if r.strip()] for refs in
            scan(self.splits[role].source, lambda rec: src.read_references(role, rec))]

  def source_oovs(self, role: str = "test") -> list[list[str]]:
    """Per record, indexed by example_id: the tokens numbered V, V + 1, ... in its src_ext and
    tgt_ext (`Vocab.source_oovs` of its source, truncated as in its batches), for reading
    outputs with `Vocab.decode_extended` / `labels_extended`. [] for dropped training records."""
    sp, v = self.splits[role], self.src_vocab
    limit = dict(zip(sp.record.tolist(), (sp.src_len - 1).tolist()))
    return [v.source_oovs(s, limit[i]) if i in limit else []
            for i, s in enumerate(self.sources(role))]

  def sources(self, role: str = "test") -> list[str]:
    """Source text of every record of the split, indexed by example_id."""
    return [s for s, _ in scan(self.splits[role].source, self._source.read)]

  def train_epoch_batches(self, e: int = 0) -> list[tuple[int, int, np.ndarray]]:
    """The training batches of epoch `e` as [(Ts, Tt, rows)]: their padded shape and the rows
    of splits["train"] they hold (the same plan train_iter reads)."""
    return [(*(self.pack_widths or self.shapes[k]), rows) for k, rows in self._plan.epoch(e)]

  def padding_fraction(self, role: str = "train") -> float:
    """Padding share of source + target slots over one epoch (train) or the one pass (eval/test)."""
    sp = self.splits[role]
    if role == "train":
      return bucketing.batches_padding_fraction(self.train_epoch_batches(0), sp.src_len,
                                                sp.tgt_len)
    return bucketing.padding_fraction(self.eval_plan(role), self.shapes, sp.src_len, sp.tgt_len)

  def summary(self) -> str:
    batching = (f"training rows packed into {self.pack_widths}, {self.train_batch_sizes[0]} a "
                f"batch; eval buckets (Ts, Tt) {self.shapes}" if self.pack_widths else
                f"buckets (Ts, Tt) {self.shapes}; batch sizes {sorted(set(self.train_batch_sizes))}")
    lines = [f"data {self.config.task}: vocab src {self.src_vocab.size} tgt {self.tgt_vocab.size} "
             f"({self.src_vocab.spec.kind}); {batching}; {self.steps_per_epoch} steps/epoch"]
    for role, sp in self.splits.items():
      c = sp.counts
      lines.append(f"  {role} ({sp.name}): {c['kept']}/{c['read']} examples, dropped {c['dropped_empty']} "
                   f"empty + {c['dropped_long']} too long, truncated {c['truncated']}; "
                   f"padding {self.padding_fraction(role):.1%}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------


def _cache_dir(cfg: DataConfig, workdir: str | None) -> str:
  if cfg.cache_dir:
    return cfg.cache_dir
  if workdir:
    return os.path.join(workdir, "data_cache")
  return os.path.join(tempfile.gettempdir(), "attn_data_cache")


def _vocab_paths(cfg: DataConfig, workdir: str | None) -> list[str]:
  names = ("shared",) if cfg.shared_vocab else ("src", "tgt")
  return [os.path.join(workdir, f"vocab.{n}.json") for n in names] if workdir else []


def _vocabularies(cfg: DataConfig, source, workdir: str | None) -> tuple[Vocab, Vocab]:
  """Loaded from the workdir if a run saved them there, else built from the training split."""
  src_spec, tgt_spec = source.tokenizer_specs()
  shared = cfg.shared_vocab
  if shared and src_spec != tgt_spec:
    raise DataError(f"shared_vocab needs one tokenizer; this task tokenizes {src_spec} / {tgt_spec}")
  builtin = source.has_alignments  # built-in tasks: keep every symbol
  min_freq, max_size = (1, 0) if builtin else (cfg.min_freq, cfg.vocab_size)
  paths = _vocab_paths(cfg, workdir)
  if paths and all(os.path.exists(p) for p in paths):
    vocabs = [load_vocab(p) for p in paths]
    for v, spec, p in zip(vocabs, (src_spec, tgt_spec), paths):
      if v.spec != spec:
        raise DataError(f"{p} was built with tokenizer {v.spec}, but the config asks for {spec}; "
                        "use a fresh workdir or delete the vocabulary")
    log.info("data: reusing vocabularies %s", ", ".join(paths))
  else:
    pairs = scan(source.data_source("train"), source.read)
    kw = dict(min_freq=min_freq, max_size=max_size)
    if src_spec.learned:  # the trainer wants the sentences
      texts = list(pairs)
      sides = [[t for pair in texts for t in pair]] if shared else [[s for s, _ in texts],
                                                                    [t for _, t in texts]]
      vocabs = [build_vocab(side, src_spec, seed=cfg.seed, **kw) for side in sides]
    else:  # one streaming pass counts both sides
      counts = [collections.Counter() for _ in range(1 if shared else 2)]
      tok_src, tok_tgt = Vocab([], src_spec).tokenize, Vocab([], tgt_spec).tokenize
      for s, t in pairs:
        counts[0].update(tok_src(s))
        counts[-1].update(tok_tgt(t))
      vocabs = [vocab_from_counts(c, spec, **kw) for c, spec in zip(counts, (src_spec, tgt_spec))]
    for v, p in zip(vocabs, paths):
      v.save(p)
    if paths:
      vocab_record.write(cfg, source, workdir)
  return (vocabs[0], vocabs[0]) if shared else (vocabs[0], vocabs[1])


def split_names(data_config) -> dict[str, str]:
  """role -> the name of the split the source of `data_config` (a data ConfigDict, dict or
  DataConfig) reads for it, without reading any data: a corpus's or a TFDS dataset's
  data.<role>_split, a built-in task's own train/eval/test whatever those name
  (attn.data.sources). Raises DataError for a bad config."""
  cfg = DataConfig.from_config(data_config)
  return SOURCES.get(cfg.task)(cfg).splits()


def _checked(data_config):
  """(DataConfig, its source) of a data section, after the checks that read no record and write
  nothing: the settings, the task's name, the files that must exist (Source.check)."""
  cfg = DataConfig.from_config(data_config)
  source = SOURCES.get(cfg.task)(cfg)
  if cfg.reference_fields and not source.reads_references:
    raise DataError(f"data.reference_fields={','.join(cfg.reference_fields)}: data.task={cfg.task} "
                    "has no reference fields (only jsonl and tfds records do)")
  source.check()
  return cfg, source


def check(data_config) -> None:
  """What `load` refuses before it reads a record or writes a file (a bad setting, an unknown
  task, a missing data file: DataError), for a run to call before it touches its workdir."""
  _checked(data_config)


def load(data_config, workdir: str | None = None) -> DataBundle:
  """Prepares the data of `data_config` (a data ConfigDict, dict or DataConfig).

  workdir: where vocabularies (vocab.{src,tgt|shared}.json), cached lengths and, unless
  data.cache_dir is set, the TFDS-format copies of generated/local data go; a second call with the
  same workdir reuses them (resume), and refuses settings the vocabularies were not built with
  (attn.data.vocab_record). None keeps vocabularies in memory only.
  Raises DataError for bad input or config.
  """
  cfg, source = _checked(data_config)
  if workdir:  # before anything is written: a resumed run reuses the saved vocabularies
    vocab_record.check(cfg, source, workdir)
  try:
    return _load(cfg, source, workdir)
  except OSError as e:  # a full disk under the vocabularies or the lengths (the cache: builders)
    if not disk_error(e):
      raise
    raise disk_full(e, f"the data files in {workdir or _cache_dir(cfg, workdir)}") from e


def _load(cfg: DataConfig, source, workdir: str | None) -> DataBundle:
  """load() after the checks that read only."""
  if workdir:
    os.makedirs(workdir, exist_ok=True)
  source.prepare(_cache_dir(cfg, workdir))
  roles = source.splits()
  if "train" not in roles:
    raise DataError("the data has no training split")
  src_vocab, tgt_vocab = _vocabularies(cfg, source, workdir)

  explicit = [tuple(b) for b in cfg.bucket_boundaries]  # validated: sorted, widest last
  caps = (cfg.max_src_len, cfg.max_tgt_len)
  if explicit:
    caps = (min(caps[0], max(s for s, _ in explicit)), min(caps[1], max(t for _, t in explicit)))
  splits = {}
  for role in roles:
    counts = token_counts(source, role, src_vocab, tgt_vocab, workdir)
    splits[role] = apply_policies(cfg, source, role, *counts, caps)
  if not len(splits["train"]):
    c = splits["train"].counts
    raise DataError(
        f"{source.describe('train')}: no training example left after the policies: of "
        f"{c['read']} pairs, {c['dropped_empty']} have an empty side (data.empty={cfg.empty}) and "
        f"{c['dropped_long']} are over max_src_len={cfg.max_src_len}/max_tgt_len="
        f"{cfg.max_tgt_len} tokens with EOS (data.too_long={cfg.too_long})")

  if explicit:
    shapes = explicit
  else:
    pooled_s = np.concatenate([sp.src_len for sp in splits.values()])
    pooled_t = np.concatenate([sp.tgt_len for sp in splits.values()])
    shapes = bucketing.choose_buckets(pooled_s, pooled_t, cfg.num_buckets, cfg.length_multiple)
  for sp in splits.values():
    sp.bucket = bucketing.assign(sp.src_len, sp.tgt_len, shapes)
    assert (sp.bucket >= 0).all()
  eval_bs = bucketing.batch_sizes(shapes, cfg.eval_bs, cfg.tokens_per_batch)
  train = splits["train"]
  if cfg.pack:
    # shapes are sorted, and the last covers every example (choose_buckets, validate)
    pack_widths = bucketing.pack_widths(train.src_len, train.tgt_len, shapes[-1],
                                        cfg.length_multiple)
    rows = bucketing.packed_rows_per_batch(train.src_len, train.tgt_len, pack_widths,
                                           cfg.batch_size, cfg.tokens_per_batch)
    train_bs = [rows] * len(shapes)
    pack = functools.partial(bucketing.pack_plan, train.src_len, train.tgt_len, pack_widths,
                             rows, bucket=len(shapes) - 1)
    per_epoch = len(pack(np.random.default_rng(0)))
    make_epoch = functools.partial(pack, n_batches=per_epoch)
  else:
    pack_widths, per_epoch = None, None
    train_bs = bucketing.batch_sizes(shapes, cfg.batch_size, cfg.tokens_per_batch)
    make_epoch = functools.partial(bucketing.train_plan, train.bucket, train_bs)
  bundle = DataBundle(cfg, src_vocab, tgt_vocab, shapes, train_bs, eval_bs, splits,
                      source.has_alignments, source,
                      _TrainPlan(make_epoch, cfg.seed, per_epoch), pack_widths)
  for line in bundle.summary().splitlines():
    log.info("%s", line)
  return bundle
