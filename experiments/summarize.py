r"""Train and evaluate a summarization model: seq2seq with attention, the pointer-generator, and
coverage (See et al. 2017).

    python -m experiments.summarize --config=experiments/configs/summarize.py:aeslc \
        --config.model.rnn.pointer=True --workdir=workdirs/aeslc_pg
    # coverage for a last phase: the same workdir, coverage on, more steps
    python -m experiments.summarize --config=experiments/configs/summarize.py:aeslc \
        --config.model.rnn.pointer=True --config.model.rnn.coverage=True \
        --config.train.steps=22000 --workdir=workdirs/aeslc_pg

Data: `data.dir` holds `<split>.jsonl[.gz]` with the fields `data.source_field` (email) and
`data.target_field` (subject); `data.reference_fields` names extra references used only for
scoring. The TFDS presets (cnn_dailymail, xsum, gigaword, aeslc_tfds) read prepared
array_record datasets. The same workdir layout and resume as experiments/translate.py:
results.json (rouge1/rouge2/rougeL F1 x100 on the test split, the mean over each example's
references, and *_max the best reference; the copy figures; params; wall_s), predictions.txt
(one summary a line, in test order), attention.npz/png, checkpoints/ and best/. A malformed
JSON line or a missing field exits with status 2 and one line naming file, line and field.
"""

from attn.launching import cli

cli.define_training_flags("experiments/configs/summarize.py:aeslc")
validate_config, main = cli.training_entry_point("summarize")


if __name__ == "__main__":
  cli.run(main)
