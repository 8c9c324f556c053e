"""Flax NNX seq2seq models: a (bi)RNN encoder and decoders registered by name (none, bahdanau, luong),
and the Transformer (model.arch=transformer)."""

from attn.models.config import ModelConfig
from attn.models.encoder import Encoder, EncoderOutput
from attn.models.seq2seq import Seq2Seq, build_model, count_params, match_param_count, sequence_loss
from attn.models.transformer import Transformer  # registers arch "transformer"
