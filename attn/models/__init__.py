"""Flax NNX seq2seq models: a (bi)RNN encoder and decoders registered by name (none, bahdanau,
luong) (model.arch=rnn), and the Transformer (model.arch=transformer); each an `Architecture`."""

from attn.models.architecture import Architecture
from attn.models.config import AttentionRole, ModelConfig, RNNConfig, TransformerConfig
from attn.models.encoder import Encoder, EncoderOutput
from attn.models.seq2seq import Seq2Seq, build_model, count_params, match_param_count, sequence_loss
from attn.models.transformer import Transformer  # registers arch "transformer"
