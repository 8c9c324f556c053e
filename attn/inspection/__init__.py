"""Looking inside trained models: what attention learned and what the output depends on.

- `diagnosis`: the diagnosis of a finished run (entropy, attribution agreement, counterfactual
  attention, per layer and head), built on `measures` (the per-step measures and the gold
  alignment scores) and `interventions` (the counterfactual weights, a Registry);
  `diagnosis_report` writes diagnose.json, the text summary and the plots;
- `viewer`: the run viewer's data and page;
- `measures`, `interventions`, `outputs`: what the diagnoses of every application share;
- `screenshot`: a PNG of a page in headless Chromium;
- `plots`: alignment heatmaps (matplotlib, headless).

Importing this package loads nothing heavy: each module imports what it needs.
"""
