"""`Search`: how outputs are searched for, the one home of the search settings' defaults."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Search:
  """How outputs are searched for: beam_size 1 is greedy. length_penalty: GNMT alpha (the default
  of beam_search too); min_len: no EOS before this many tokens (EOS counted); block_repeat_ngram:
  n-gram blocking (3 = no repeated trigram); coverage_penalty: GNMT beta (beam search only);
  attention: record each output step's attention (False: the same outputs, weights [B, T, 0],
  for decoding whose attention nobody reads, such as the evaluations during training);
  shrink_to: finished examples leave the batch (greedy and beam search), which halves down to
  this many rows (0: never; the same outputs, less work per pass, one more loop to compile per
  halving: see `beam_search`); stop: when beam search ends an example's search, "bound"
  (exact: no live hypothesis can still enter its K best) or "k_finished" (once K hypotheses
  have finished, as fairseq and JoeyNMT do: fewer steps, not exact)."""
  beam_size: int = 1
  length_penalty: float = 0.6
  min_len: int = 0
  block_repeat_ngram: int = 0
  coverage_penalty: float = 0.0
  attention: bool = True
  shrink_to: int = 0
  stop: str = "bound"

  def greedy(self) -> "Search":
    return dataclasses.replace(self, beam_size=1)
