"""The applications, one package each (see docs/architectures.md, "Adding an application").

Each package adds one `App` to `APPS` (attn.common.applications, the registry the shared layers
read) when imported; importing this package registers the built-in ones, as the entry points
(experiments/, launch.py) and the tests do. A package's `__init__` imports nothing heavy: it
gives its task (and a diagnosis hook, where it has one) as a function of no arguments that
imports and returns the class, called when first used (a string is refused: `App` takes a class
or such a function).

- `translate`: seq2seq translation (RNN and Transformer) on text corpora and the built-in tasks;
- `summarize`: summarization (attention, pointer-generator, coverage; ROUGE);
- `caption`: image captioning, attention over image regions (digit strips);
- `recommend`: next-item recommendation (self-attention, mean-pooling, GRU);
- `retrieve`: retrieval, then read (two-hop questions in pools of distractor stories);
- `focus`: the reading-focus demo (readers with each normalizer, their page).
"""

from attn.common.applications import (APPS, App, app, app_of_records, app_of_results,
                                      app_of_workdir, not_a_run_of)
from attn.apps import translate, summarize, caption, recommend, retrieve, focus  # noqa: F401  (register)

__all__ = ["APPS", "App", "app", "app_of_records", "app_of_results", "app_of_workdir",
           "not_a_run_of"]
