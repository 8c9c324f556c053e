r"""Train and evaluate an image captioner: show, attend and tell in miniature.

    python -m experiments.caption --config=experiments/configs/caption.py:default \
        --workdir=workdirs/caption/bahdanau
    python -m experiments.caption --config=experiments/configs/caption.py:default \
        --config.model.rnn.decoder=none --config.model.rnn.match_params_of=bahdanau \
        --workdir=workdirs/caption/none

Images are strips of glyph cells drawn from matplotlib's bundled fonts (attn.apps.caption.data;
nothing is downloaded), captioned with their digits in reading order by a small CNN over the
cells and a GRU decoder that attends over the cells (model.rnn.decoder=bahdanau, any registered
score and normalizer) or reads only their mean (decoder=none). The same loop, workdir layout and
resume as experiments/translate.py: results.json (exact_match, digit_accuracy, both by number of
digits, aer and attention_on_gold against the cell of each digit, params, wall_s),
predictions.txt, attention.npz (with each sampled image and its cell boxes, which the run
viewer draws under the attention: python -m experiments.inspect --workdir=...), checkpoints/
and best/. A bad preset or field exits with status 2 and one `error:` line before anything is
written.
"""

import attn.apps  # noqa: F401  (registers the built-in applications)
from attn.launching import cli

cli.define_training_flags("experiments/configs/caption.py:default")
validate_config, main = cli.training_entry_point("caption")


if __name__ == "__main__":
  cli.run(main)
