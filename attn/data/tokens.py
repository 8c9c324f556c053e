"""Reserved token ids, identical in every vocabulary (word, char and sentencepiece).

The data pipeline writes them, the models read BOS as the first decoder input, and decoding stops
at EOS and pads with PAD; all three import them from here.
"""

PAD = 0
BOS = 1
EOS = 2
UNK = 3
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")
