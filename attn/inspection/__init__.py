"""Looking inside trained models: what attention learned and what the output depends on.

- `diagnosis`: entropy, attribution agreement, counterfactual attention, per layer and head;
- `viewer`: the run viewer's data and page;
- `stories`, `focus`: bAbI-style stories and the reading-focus demo;
- `plots`: alignment heatmaps (matplotlib, headless).

Importing this package loads nothing heavy: each module imports what it needs.
"""
