"""The word tokenizer's joiner mark, here below the data layer so that the plots can strip it:
attn.data.tokenize marks the side of a token that takes no space with it ("l'eau" ->
"l" "￭'" "eau"), and attn.common.plots removes it from tick labels (plot fonts lack the glyph)."""

JOINER = "\uffed"  # "￭", OpenNMT Tokenizer's joiner
