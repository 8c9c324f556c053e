r"""Train and evaluate a summarization model: seq2seq with attention, the pointer-generator, and
coverage (See et al. 2017).

    python -m experiments.summarize --config=experiments/configs/summarize.py:aeslc \
        --config.model.rnn.pointer=True --workdir=workdirs/aeslc_pg
    # coverage for a last phase: the same workdir, coverage on, more steps
    python -m experiments.summarize --config=experiments/configs/summarize.py:aeslc \
        --config.model.rnn.pointer=True --config.model.rnn.coverage=True \
        --config.train.steps=22000 --workdir=workdirs/aeslc_pg
    # the published AESLC test split (get_data's files): chosen on dev, test scored at the end
    python -m experiments.summarize --config=experiments/configs/summarize.py:aeslc_test \
        --config.data.dir=data/aeslc --config.model.rnn.pointer=True --workdir=workdirs/aeslc_test

Data: `data.dir` holds `<split>.jsonl[.gz]` with the fields `data.source_field` (email) and
`data.target_field` (subject); `data.reference_fields` names the annotations (AESLC dev/test:
ann0,ann1,ann2), used only for scoring. The TFDS presets (cnn_dailymail, xsum, gigaword,
aeslc_tfds) read prepared array_record datasets. The same workdir layout and resume as
experiments/translate.py: results.json (ROUGE F1 x100 on the test split: with annotations,
rouge1/rouge2/rougeL the mean over each example's annotations, *_max the best, rouge*_subject
against the subject alone; without, rouge1/2/L against the subject; rouge_references says which;
attn/apps/summarize/task.py; the copy figures; params; wall_s), predictions.txt (one summary a
line, in test order), attention.npz/png, checkpoints/ and best/. A malformed JSON line or a
missing field exits with status 2 and one line naming file, line and field.
"""

import attn.apps  # noqa: F401  (registers the built-in applications)
from attn.launching import cli

cli.define_training_flags("experiments/configs/summarize.py:aeslc")
validate_config, main = cli.training_entry_point("summarize")


if __name__ == "__main__":
  cli.run(main)
