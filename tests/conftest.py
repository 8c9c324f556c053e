"""Fixtures shared by several test files."""

import os

import pytest

# The suite's subprocesses leave the user's persistent compilation cache alone
# (tests/test_compile_cache.py turns it on in directories of its own).
os.environ.setdefault("ATTN_COMPILE_CACHE", "off")

from attn import training
from experiments.configs import translate as translate_config
from experiments.configs import use_arch


@pytest.fixture(scope="session")
def smoke_bahdanau_workdir(tmp_path_factory):
  """One finished smoke run (decoder=bahdanau, one bucket shape), trained once per session and
  read by the diagnosis and notebook tests (which must not modify its checkpoints)."""
  workdir = str(tmp_path_factory.mktemp("smoke_bahdanau"))
  config = translate_config.get_config("smoke")
  config.model.rnn.decoder = "bahdanau"
  config.data.num_buckets = 1  # one batch shape: one compilation of each function downstream
  training.train_and_evaluate(config, workdir)
  return workdir


@pytest.fixture(scope="session")
def smoke_transformer_workdir(tmp_path_factory):
  """One finished smoke run on a tiny Transformer (2 decoder layers x 2 heads: per-layer and
  per-head attention differ), trained once per session; read by the viewer and diagnosis tests."""
  workdir = str(tmp_path_factory.mktemp("smoke_transformer"))
  config = translate_config.get_config("smoke")
  use_arch(config, "transformer", d_model=16, num_heads=2, d_ff=32)
  config.model.update(dict(enc_layers=1, dec_layers=2))
  config.data.num_buckets = 1
  training.train_and_evaluate(config, workdir)
  return workdir
