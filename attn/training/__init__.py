"""Training and evaluation, split by responsibility:

- `loop`: `train_and_evaluate(config, workdir, task)`, `setup`, `train`, `train_step`;
- `run`: `Run`, a run's state and the programs it compiles;
- `evaluation`: perplexity, decoding a split, scores, alignment quality, the result files;
- `checkpoints`: orbax `checkpoints/` (latest) and `best/`;
- `resume`: what a resumed run may do (nothing to train, switched features) and when its records
  (config.json, model.json) are written;
- `metrics_log`: metrics.jsonl and TensorBoard;
- `results`: atomic JSON and the one results table;
- `task`: the task interface every application gives the loop (data, model, loss, selection);
- `seq2seq_task`: what sequence-to-sequence tasks share (loss, decoding, output text);
- `config`: `TrainConfig` and the optimizer;
- `distributed`: the device mesh, shardings, jax.distributed and what only process 0 writes.
"""

from attn.decoding import Search
from attn.training import distributed
from attn.training.checkpoints import Checkpoints
from attn.training.config import TrainConfig, make_optimizer
from attn.training.building import load_run, setup, validate_config
from attn.training.loop import Run, train, train_and_evaluate, train_step
from attn.training.metrics_log import MetricsWriter
from attn.training.results import results_table
from attn.training.seq2seq_task import Seq2SeqTask
from attn.training.task import Task, get_task

__all__ = ["Checkpoints", "MetricsWriter", "Run", "Search", "Seq2SeqTask", "Task", "TrainConfig",
           "distributed", "get_task", "load_run", "make_optimizer", "results_table", "setup",
           "train", "train_and_evaluate", "train_step", "validate_config"]
