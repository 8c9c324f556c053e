r"""Train and evaluate a seq2seq model with or without attention.

    python -m experiments.translate --config=experiments/configs/translate.py:multi30k \
        --config.model.rnn.decoder=bahdanau --config.model.rnn.score=additive \
        --workdir=workdirs/m30k

Several devices: every local device goes on the data axis (`--config.train.mesh_shape` picks
another mesh). Several hosts: `--distributed=auto` inside a Slurm job or on a Cloud TPU pod, or
`--coordinator_address=HOST:PORT --num_processes=N --process_id=I` on each process; every
process gets the same flags and --workdir (on a shared filesystem); see docs/scale.md.

The pointer-generator and coverage (`--config.model.rnn.pointer=True` with
`--config.data.shared_vocab=True --config.data.extended_vocab=True`; `model.rnn.coverage=True`)
train here as in experiments/summarize.py: copying names is useful in translation too.

Rerunning with the same --workdir resumes from its latest checkpoint. Writes config.json,
metrics.jsonl (+ TensorBoard events), checkpoints/, best/, predictions.txt, results.json,
attention.npz and attention.png into the workdir. Bad input (missing files, mismatched line
counts, unknown variant names) exits with status 2 and one `error:` line before any training.
"""

import attn.apps  # noqa: F401  (registers the built-in applications)
from attn.launching import cli

cli.define_training_flags("experiments/configs/translate.py:multi30k")
validate_config, main = cli.training_entry_point("translate")


if __name__ == "__main__":
  cli.run(main)
