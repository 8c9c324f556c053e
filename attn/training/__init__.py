"""Training and evaluation, split by responsibility:

- `loop`: `train_and_evaluate(config, workdir, task)`, `setup`, `train`, `train_step`;
- `evaluation`: perplexity, decoding a split, scores, alignment quality, the result files;
- `checkpoints`: orbax `checkpoints/` (latest) and `best/`;
- `resume`: what a resumed run may do (nothing to train, switched features) and when its records
  (config.json, model.json) are written;
- `metrics_log`: metrics.jsonl and TensorBoard;
- `results`: atomic JSON and the one results table;
- `task`: the task interface (what to build, score and decode) and the translation task;
- `summarization`: the summarization task (ROUGE, pointer-generator loss, copy figures);
- `captioning`: the image captioning task (digit strips, region CNN, exact match by digits);
- `config`: `TrainConfig` and the optimizer;
- `distributed`: the device mesh, shardings, jax.distributed and what only process 0 writes.
"""

from attn.decoding import Search
from attn.training import distributed
from attn.training.checkpoints import Checkpoints
from attn.training.config import TrainConfig, make_optimizer
from attn.training.loop import (Run, load_run, setup, train, train_and_evaluate, train_step,
                                validate_config)
from attn.training.metrics_log import MetricsWriter
from attn.training.results import results_table
from attn.training.summarization import SummarizationTask
from attn.training.captioning import CaptionTask
from attn.training.task import Task, TranslationTask, get_task

__all__ = ["CaptionTask", "Checkpoints", "MetricsWriter", "Run", "Search", "SummarizationTask", "Task",
           "TrainConfig", "TranslationTask",
           "distributed", "get_task", "load_run", "make_optimizer", "results_table", "setup",
           "train", "train_and_evaluate", "train_step", "validate_config"]
