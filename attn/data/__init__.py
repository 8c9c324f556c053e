"""Data pipeline: built-in tasks with gold alignments, local corpora and TFDS datasets.

    from attn import data
    bundle = data.load(config.data, workdir)      # config.data: experiments/configs/data.py
    for step, batch in enumerate(bundle.train_iter(start_step), start_step): ...
    for batch in bundle.batches("test"): ...      # one exact pass; score against bundle.references("test")

Every source goes the same way: a TFDS builder (array_record, no TensorFlow) -> TFDS data source ->
grain (bucketing, padding, batching) -> dicts of numpy arrays (shapes in pipeline.py). The heavy
libraries (tensorflow_datasets, grain, babel, sentencepiece) are imported only when used.
"""

from attn.data import config
from attn.data.base import BOS, EOS, PAD, ROLES, SOURCES, SPECIAL_TOKENS, UNK, DataError
from attn.data.config import DataConfig
from attn.data import sources as _sources  # registers the sources  # noqa: F401
from attn.data.pipeline import DataBundle, check, load, split_names
from attn.data.splits import SplitData
from attn.data.builtin_tasks import BUILTIN_TASKS, Example
from attn.data.tokenize import TOKENIZERS, TokenizerSpec, Vocab, build_vocab, load_vocab
