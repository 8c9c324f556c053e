r"""JoeyNMT, ours, JoeyNMT in one sitting: training rate, decoding time and BLEU after equal steps
of the RNN + attention at JoeyNMT's sizes, and the Transformer's training rate.

    python3 -m venv .peer-venv && .peer-venv/bin/python -m pip install -r peers/requirements.txt
    python -m experiments.bench_peer --peer_python=.peer-venv/bin/python \
        --out=workdirs/peer_sitting

The peer runs in its own environment (.peer-venv/: joeynmt 2.3.0, torch 2.14.1; never a
dependency of the project) through peers/joeynmt_peer.py, and torch's matmul ceiling through
peers/torch_ceiling.py; ours through experiments.bench_train (float32, bfloat16 and auto),
experiments.translate and experiments.bench_decode. Each of our training rows gives its share
of the better of XLA's and torch's ceilings, naming which. The stages, what each figure is, and how a
rerun with the same --out resumes: attn/benchmarks/peer_sitting.py. A failed stage ends the
command with one line naming the stage and its log.
"""

import os

from absl import flags

from attn.benchmarks import peer_sitting
from attn.launching import cli
from experiments.configs import data as data_presets
from experiments.configs import translate as translate_presets

FLAGS = flags.FLAGS


def preset_warmup(steps: int) -> int:
  """The multi30k preset's warm-up share of its steps, for a run of `steps` (at least 1)."""
  train = translate_presets.get_config("multi30k").train
  return max(1, round(steps * train.warmup_steps / train.steps))


def main(argv):
  del argv
  s = cli.settings_from_flags(peer_sitting.Settings)
  data = s.data_dir or os.path.join(data_presets.shared_data_dir(), "multi30k")
  peer_sitting.run(s, data=data, warmup=s.warmup_steps or preset_warmup(s.steps))


if __name__ == "__main__":
  cli.define_settings_flags(peer_sitting.Settings)
  cli.run(main)
