"""A generated interaction log with planted structure, for next-item recommendation.

Every user has a history of item ids (1..num_items; 0 is padding). Items fall in three disjoint
groups:
- triggers (ids 1..K): trigger t fixes a later item, target(t) = K + t, exactly `offset[t]`
  positions after it (offset[t] drawn once per trigger in 1..max_offset);
- targets (ids K+1..2K): they appear only where a trigger put them;
- noise (ids 2K+1..num_items): drawn from a Zipf law over the noise ids (popularity: a few items
  are frequent, most are rare), filling every other position.

Each history's last item (the test target) and, where it fits, its second-last (the valid
target) are planted targets; further pairs are planted in the training part every
`pair_every` positions on average, so the model sees the rule while training. For a test user
the position of the trigger that fixed the test item (`gold`) is therefore known: it is the
past item the final prediction should attend to. History lengths vary uniformly in
[min_len, max_len].

Leave-one-out split as SASRec (Kang & McAuley 2018): the last item is the test target, the
second-last the valid target, the rest trains. Sequences are right-padded: item j of a history
sits at position j, so the final query of a history of n items is position n - 1.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from attn.config.configurable import option
from attn.errors import ConfigError

PAD = 0  # the padding item id; real items are 1..num_items


@dataclasses.dataclass(frozen=True)
class InteractionConfig:
  """The generated log (the `data` section of experiments/configs/recommend.py)."""
  num_users: int = option(2000, "users (one history each)")
  num_items: int = option(300, "items (ids 1..num_items; 0 is padding)")
  num_triggers: int = option(20, "trigger items; each fixes one target item")
  max_offset: int = option(6, "a trigger's target follows it 1..max_offset positions later")
  min_len: int = option(10, "shortest history (test and valid items included)")
  max_len: int = option(40, "longest history (test and valid items included)")
  pair_every: int = option(10, "one planted trigger/target pair per this many training "
                           "positions, on average")
  zipf_a: float = option(1.2, "Zipf exponent of the noise items' popularity")
  seed: int = option(0, "generator seed (the log is a function of the config)")
  batch_size: int = option(64, "histories per training batch")

  def __post_init__(self):
    noise = self.num_items - 2 * self.num_triggers
    checks = (
        (self.num_users >= 1, f"data.num_users={self.num_users} must be at least 1"),
        (self.num_triggers >= 1, f"data.num_triggers={self.num_triggers} must be at least 1"),
        (noise >= 10, f"data.num_items={self.num_items} leaves {noise} noise items after "
         f"{self.num_triggers} triggers and their targets: it must be at least "
         f"2 * num_triggers + 10 = {2 * self.num_triggers + 10}"),
        (self.max_offset >= 1, f"data.max_offset={self.max_offset} must be at least 1"),
        (self.min_len >= self.max_offset + 3,
         f"data.min_len={self.min_len} is too short for data.max_offset={self.max_offset}: a "
         f"history needs room for the test pair and a training item (min_len >= max_offset + "
         f"3 = {self.max_offset + 3})"),
        (self.max_len >= self.min_len,
         f"data.max_len={self.max_len} is below data.min_len={self.min_len}"),
        (self.pair_every >= 1, f"data.pair_every={self.pair_every} must be at least 1"),
        (self.zipf_a > 0, f"data.zipf_a={self.zipf_a} must be positive"),
        (self.batch_size >= 1, f"data.batch_size={self.batch_size} must be at least 1"),
    )
    for ok, message in checks:
      if not ok:
        raise ConfigError(message)

  @property
  def tokens_per_batch(self) -> int:
    """0: batches hold `batch_size` histories, never a token budget (what the device mesh checks:
    attn.training.distributed.check_batch_rows)."""
    return 0

  @property
  def max_input_len(self) -> int:
    """The longest model input: a test input is a history without its last item."""
    return self.max_len - 1


@dataclasses.dataclass(frozen=True)
class InteractionLog:
  """The generated log. sequences: [U, max_len] int32 right-padded with PAD; lengths: [U];
  offsets: [K + 1] (offsets[t] for trigger t; offsets[0] unused); gold: [U], the position of
  the trigger of each user's last item (the test target)."""
  cfg: InteractionConfig
  sequences: np.ndarray
  lengths: np.ndarray
  offsets: np.ndarray
  gold: np.ndarray

  def target_of(self, trigger):
    """The item trigger(s) `trigger` fixes."""
    return np.asarray(trigger) + self.cfg.num_triggers

  def is_trigger(self, items):
    return (np.asarray(items) >= 1) & (np.asarray(items) <= self.cfg.num_triggers)


def _zipf_probs(n: int, a: float) -> np.ndarray:
  p = 1.0 / np.arange(1, n + 1) ** a
  return p / p.sum()


def _plant(seq, used, rng, cfg, offsets, target_pos) -> int | None:
  """Plants a random trigger whose target lands at `target_pos` (both positions free); returns
  the trigger's position, or None when no trigger fits there."""
  for t in rng.permutation(cfg.num_triggers) + 1:
    p = target_pos - offsets[t]
    if p >= 0 and not used[p] and not used[target_pos]:
      seq[p], seq[target_pos] = t, t + cfg.num_triggers
      used[p] = used[target_pos] = True
      return p
  return None


def generate(cfg: InteractionConfig) -> InteractionLog:
  """The log of `cfg` (numpy, seeded by cfg.seed: the same config gives the same log)."""
  rng = np.random.default_rng(cfg.seed)
  K = cfg.num_triggers
  offsets = np.zeros(K + 1, np.int32)
  offsets[1:] = rng.integers(1, cfg.max_offset + 1, size=K)
  noise_ids = np.arange(2 * K + 1, cfg.num_items + 1)
  probs = _zipf_probs(len(noise_ids), cfg.zipf_a)
  lengths = rng.integers(cfg.min_len, cfg.max_len + 1, size=cfg.num_users).astype(np.int32)
  sequences = np.full((cfg.num_users, cfg.max_len), PAD, np.int32)
  gold = np.zeros(cfg.num_users, np.int32)
  for u, n in enumerate(lengths):
    seq = rng.choice(noise_ids, size=n, p=probs).astype(np.int32)
    used = np.zeros(n, bool)
    gold[u] = _plant(seq, used, rng, cfg, offsets, n - 1)  # always fits: n - 1 >= max_offset
    _plant(seq, used, rng, cfg, offsets, n - 2)  # the valid target, where a trigger fits
    for _ in range(max(1, (n - 2) // cfg.pair_every)):
      _plant(seq, used, rng, cfg, offsets, int(rng.integers(1, n - 2)))
    sequences[u, :n] = seq
  return InteractionLog(cfg, sequences, lengths, offsets, gold)


@dataclasses.dataclass(frozen=True)
class Split:
  """One role of the leave-one-out split. inputs: [U, T] right-padded histories; lengths: [U];
  targets: [U, T] the next item at every position (PAD past the end), for training; last: [U],
  the item after the final input position, for ranking; gold: [U] position of the trigger of
  `last` (-1 where unknown: the valid target when no trigger fit)."""
  inputs: np.ndarray
  lengths: np.ndarray
  targets: np.ndarray
  last: np.ndarray
  gold: np.ndarray


def _role(log: InteractionLog, drop: int) -> Split:
  """Histories without their last `drop` items as inputs, predicting the item after."""
  T = log.cfg.max_input_len
  U = len(log.lengths)
  keep = log.lengths - drop  # items in the role's sequence (inputs + the item predicted)
  seqs = np.where(np.arange(log.cfg.max_len)[None] < keep[:, None], log.sequences, PAD)
  inputs = seqs[:, :-1][:, :T].copy()
  lengths = keep - 1
  inputs[np.arange(T)[None] >= lengths[:, None]] = PAD
  targets = seqs[:, 1:][:, :T]
  last = seqs[np.arange(U), keep - 1]
  gold = np.full(U, -1, np.int32)
  if drop == 0:
    gold = log.gold.copy()
  else:
    # The valid target's trigger, where one was planted: a trigger `offset` positions earlier.
    is_target = (last > log.cfg.num_triggers) & (last <= 2 * log.cfg.num_triggers)
    trig = np.where(is_target, last - log.cfg.num_triggers, 0)
    pos = keep - 1 - log.offsets[trig]
    ok = is_target & (pos >= 0)
    ok[ok] &= seqs[np.arange(U)[ok], pos[ok]] == trig[ok]
    gold[ok] = pos[ok]
  return Split(inputs.astype(np.int32), lengths.astype(np.int32), targets.astype(np.int32),
               last.astype(np.int32), gold)


def leave_one_out(log: InteractionLog) -> dict[str, Split]:
  """{"train", "valid", "test"}: train predicts every next item of the history without its last
  two items; valid ranks the second-last item given the items before it; test ranks the last
  item given all the others (SASRec's protocol)."""
  return {"train": _role(log, 2), "valid": _role(log, 1), "test": _role(log, 0)}


def batch_rows(num_users: int, batch_size: int, seed: int, step: int) -> np.ndarray:
  """The users [batch_size] of training step `step`: the users are reshuffled every epoch with a
  seed of (seed, epoch); with fewer users than a batch, drawn with repetition."""
  per_epoch = max(1, num_users // batch_size)
  epoch, i = divmod(step, per_epoch)
  order = np.random.default_rng([seed, epoch]).permutation(num_users)
  rows = order[i * batch_size:(i + 1) * batch_size]
  return rows if len(rows) == batch_size else np.resize(order, batch_size)


def train_batches(split: Split, batch_size: int, seed: int, start_step: int = 0,
                  select_rows=None):
  """Yields (inputs [B, T], lengths [B], targets [B, T]) batches, step `start_step` first
  (`batch_rows`), so a resumed run sees the batches an uninterrupted one would. select_rows:
  this process's rows of a global batch (attn.training.distributed.RowShard.select; the batch
  size divides over the data axis, so it never adds filler rows); None: all of them."""
  step = start_step
  while True:
    rows = batch_rows(len(split.lengths), batch_size, seed, step)
    if select_rows is not None:
      rows = select_rows(rows)
    yield split.inputs[rows], split.lengths[rows], split.targets[rows]
    step += 1
