"""Searching for outputs: greedy and beam search over a pure `step(state, y_prev)` function
(`search`), shared by every architecture."""
