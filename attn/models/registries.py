"""The models' named kinds, one `attn.registry.Registry` each: what `model.arch`,
`model.rnn.decoder`, `model.rnn.cell` and `model.transformer.pos_encoding` name. Entries are the
classes themselves; each carries the flags and hooks that code would otherwise get by comparing
names (a decoder's `has_attention`, a cell's `gates`, an architecture's `check_config`)."""

from attn.errors import ConfigError
from attn.registry import Registry

ARCHS = Registry("model.arch", error=ConfigError)
DECODERS = Registry("model.rnn.decoder", error=ConfigError)
CELLS = Registry("model.rnn.cell", error=ConfigError)
POS_ENCODINGS = Registry("model.transformer.pos_encoding", error=ConfigError)

KINDS = {"arch": ARCHS, "decoder": DECODERS, "cell": CELLS, "pos_encoding": POS_ENCODINGS}
