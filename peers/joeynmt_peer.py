r"""The peer of the speed comparison: JoeyNMT trains and decodes Multi30k de->en with its own loop.

Run by the peer's own environment (.peer-venv/, see peers/requirements.txt), never by the
project's: it imports torch and joeynmt, which the project does not depend on. The project's
sitting driver (python -m experiments.bench_peer) calls it; by hand:

    .peer-venv/bin/python peers/joeynmt_peer.py train --arch=rnn --steps=200 \
        --data_dir=$ATTN_SHARED_DATA/multi30k --work=workdirs/peer/joey --run=rnn \
        --json_out=workdirs/peer/rnn_train.json
    .peer-venv/bin/python peers/joeynmt_peer.py decode --work=workdirs/peer/joey --run=rnn \
        --beam_sizes=1,5 --json_out=workdirs/peer/rnn_decode.json

`train` unpacks the shared gz files into <work>/data/ (JoeyNMT's plain format, once), writes
JoeyNMT's YAML config to <work>/<run>/config.yaml and trains for --steps updates through
`joeynmt.training.train`, exactly as `python -m joeynmt train config.yaml --skip-test` does, with
no validation. The step times are JoeyNMT's own: with logging_freq=1 its loop measures every
update (fetching and collating the batch included, validation excluded) and its token count
(target tokens, EOS included, padding excluded: ours counts them the same). `decode` runs
`joeynmt.prediction.test` on the test split once per beam size with the model of <work>/<run>/
and times it by JoeyNMT's own "Generation took" figure (the decoding loop) and by the wall
clock of the whole call (vocabulary, data and model loading included); its hypotheses (Moses-
detokenized, lowercased) are scored as the project scores its own: sacreBLEU 13a,
lowercase=True, against the raw references of the shared test file.

Only the standard library is imported at the top, so that the project's tests can read the
configs this file writes without torch.
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
import logging
import os
import pathlib
import statistics
import sys
import time

SPLITS = {"train": "train", "dev": "val", "test": "test_2016_flickr"}  # JoeyNMT's name: file
LANGS = ("de", "en")
WARMUP_STEPS = 5  # first updates left out of tokens/s (allocator and thread pools warming up)


def _side(lang: str) -> dict:
  """One language's data settings: word level after the Moses pretokenizer, lowercased, words
  seen fewer than twice in training -> <unk> (as the project's multi30k preset)."""
  return {"lang": lang, "level": "word", "lowercase": True, "normalize": False,
          "max_length": -1, "min_length": 1, "voc_min_freq": 2,
          "tokenizer_cfg": {"pretokenizer": "moses"}}


def _rnn_model() -> dict:
  """The RNN of the reference figures: embeddings 256, 1-layer bidirectional GRU encoder 512, a
  1-layer GRU decoder 512 with Bahdanau attention and input feeding, dropout 0.5 (12,995,328
  parameters on this vocabulary)."""
  return {
      "initializer": "xavier_uniform", "bias_initializer": "zeros",
      "embed_initializer": "normal", "embed_init_weight": 0.1,
      "encoder": {"type": "recurrent", "rnn_type": "gru", "hidden_size": 512,
                  "bidirectional": True, "num_layers": 1, "dropout": 0.5,
                  "embeddings": {"embedding_dim": 256, "scale": False}},
      "decoder": {"type": "recurrent", "rnn_type": "gru", "hidden_size": 512, "num_layers": 1,
                  "dropout": 0.5, "hidden_dropout": 0.5, "attention": "bahdanau",
                  "input_feeding": True, "init_hidden": "bridge",
                  "embeddings": {"embedding_dim": 256, "scale": False}}}


def _transformer_model() -> dict:
  """At the project's multi30k_transformer sizes: 3 + 3 pre-LN layers, d_model 256, 4 heads,
  d_ff 1024, dropout 0.2, target embeddings tied to the output layer."""
  layers = {"type": "transformer", "num_layers": 3, "num_heads": 4, "hidden_size": 256,
            "ff_size": 1024, "dropout": 0.2, "layer_norm": "pre",
            "embeddings": {"embedding_dim": 256, "scale": True}}
  return {"initializer": "xavier_uniform", "bias_initializer": "zeros",
          "embed_initializer": "xavier_uniform", "tied_softmax": True,
          "encoder": dict(layers), "decoder": dict(layers)}


# arch -> (model section, optimizer settings)
ARCHS = {
    # A constant 1e-3, as the reference figures. JoeyNMT 2.3.0 refuses a config without a
    # scheduler, and its "plateau" passes ReduceLROnPlateau a `verbose` that torch 2.14 no longer
    # takes: "exponential" by a factor of 1.0 at each epoch's end is the constant it can run.
    "rnn": (_rnn_model, {"learning_rate": 1e-3, "adam_betas": [0.9, 0.999],
                         "label_smoothing": 0.0, "scheduling": "exponential",
                         "decrease_factor": 1.0}),
    # as the project's multi30k_transformer: 400 warm-up steps to 1e-3 (then 1/sqrt decay)
    "transformer": (_transformer_model, {"learning_rate": 1e-3, "adam_betas": [0.9, 0.98],
                                         "label_smoothing": 0.1,
                                         "scheduling": "warmupinversesquareroot",
                                         "learning_rate_warmup": 400}),
}


def joey_config(arch: str, *, work: str, run: str, steps: int, batch_size: int = 128,
                beam_size: int = 1, seed: int = 42, with_dev: bool = True) -> dict:
  """JoeyNMT's config for `arch` (rnn | transformer): `steps` updates of `batch_size` sentences,
  Adam with gradient-norm clipping 1.0, no validation during training, loss normalized by target
  tokens (as ours), test decoding with `beam_size` (alpha 1.0 as JoeyNMT's examples). The dev
  split is left out when only decoding (JoeyNMT's test mode would decode it too)."""
  if arch not in ARCHS:
    raise ValueError(f"arch={arch!r}: known {', '.join(ARCHS)}")
  model, optim = ARCHS[arch]
  data_dir = os.path.join(work, "data")
  data = {"train": os.path.join(data_dir, "train"), "test": os.path.join(data_dir, "test"),
          "dataset_type": "plain", "src": _side("de"), "trg": _side("en")}
  if with_dev:
    data["dev"] = os.path.join(data_dir, "dev")
  training = {
      "model_dir": os.path.join(work, run), "overwrite": True, "random_seed": seed,
      "use_cuda": False, "fp16": False, "optimizer": "adam",
      "learning_rate_min": 1e-8, "clip_grad_norm": 1.0, "weight_decay": 0.0,
      "loss": "crossentropy", "normalization": "tokens", "batch_size": batch_size,
      "batch_type": "sentence", "batch_multiplier": 1, "shuffle": True,
      "epochs": 1000, "updates": steps, "logging_freq": 1, "validation_freq": 10 ** 9,
      "early_stopping_metric": "ppl", "keep_best_ckpts": 1, "print_valid_sents": [],
      "num_workers": 0, **optim}
  testing = {"beam_size": beam_size, "beam_alpha": 1.0, "batch_size": 64,
             "batch_type": "sentence", "n_best": 1, "max_output_length": -1,
             "eval_metrics": ["bleu"], "sacrebleu_cfg": {"tokenize": "13a", "lowercase": True}}
  return {"name": f"peer_{run}", "joeynmt_version": "2.3.0", "model_dir": training["model_dir"],
          "use_cuda": False, "data": data, "training": training, "testing": testing,
          "model": model()}


def write_config(cfg: dict, path: str) -> None:
  """JoeyNMT's YAML config file (PyYAML comes with JoeyNMT, and with the project's tests)."""
  import yaml  # pylint: disable=import-outside-toplevel
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    yaml.safe_dump(cfg, f, sort_keys=False)


def prepare_data(data_dir: str, work: str) -> str:
  """<work>/data/{train,dev,test}.{de,en} from the shared <data_dir>/<split>.<lang>.gz (once);
  returns the folder."""
  out = os.path.join(work, "data")
  os.makedirs(out, exist_ok=True)
  for name, split in SPLITS.items():
    for lang in LANGS:
      dest = os.path.join(out, f"{name}.{lang}")
      if os.path.exists(dest):
        continue
      source = os.path.join(data_dir, f"{split}.{lang}.gz")
      if not os.path.exists(source):
        raise FileNotFoundError(f"{source}: no such file (--data_dir is the multi30k folder)")
      with gzip.open(source, "rt", encoding="utf-8") as f, open(dest + ".tmp", "w",
                                                                encoding="utf-8") as g:
        g.write(f.read())
      os.replace(dest + ".tmp", dest)
  return out


def loadavg() -> str:
  """The 1/5/15-minute load averages, written as the project's harness writes them."""
  return " ".join(f"{x:.2f}" for x in os.getloadavg())


def summarize_steps(seconds: list[float], tokens: list[int], warmup: int = WARMUP_STEPS) -> dict:
  """Median s/step over every update, and target tokens/s over the updates after the first
  `warmup` (all of them when there are no more)."""
  timed = slice(warmup, None) if len(seconds) > warmup else slice(None)
  return {"steps": len(seconds), "median_s_per_step": statistics.median(seconds),
          "tokens_per_s": sum(tokens[timed]) / sum(seconds[timed]),
          "tokens_per_step": sum(tokens) / len(tokens), "warmup_steps_left_out": warmup
          if len(seconds) > warmup else 0}


def _versions() -> dict:
  import joeynmt  # pylint: disable=import-outside-toplevel
  import torch  # pylint: disable=import-outside-toplevel
  return {"joeynmt": joeynmt.__version__, "torch": torch.__version__,
          "torch_threads": torch.get_num_threads(), "cpus": os.cpu_count()}


def train(args) -> dict:
  """Trains `args.arch` for `args.steps` updates with JoeyNMT's loop; returns the figures."""
  prepare_data(args.data_dir, args.work)
  cfg = joey_config(args.arch, work=args.work, run=args.run, steps=args.steps,
                    batch_size=args.batch_size, seed=args.seed)
  path = os.path.join(args.work, args.run, "config.yaml")
  from joeynmt.helpers import make_model_dir  # pylint: disable=import-outside-toplevel
  from joeynmt.helpers_for_ddp import get_logger  # pylint: disable=import-outside-toplevel
  from joeynmt import training  # pylint: disable=import-outside-toplevel
  from joeynmt.config import load_config  # pylint: disable=import-outside-toplevel
  make_model_dir(pathlib.Path(cfg["model_dir"]), overwrite=True)
  write_config(cfg, path)
  get_logger("", log_file=os.path.join(cfg["model_dir"], "train.log"))
  seconds, tokens = [], []
  log_scores = training.TrainManager._log_scores  # pylint: disable=protected-access

  def record(self, epoch_no, elapsed_time, start_tokens, start_correct, total_batch_loss):
    # JoeyNMT's own measure of the update (logging_freq=1): time and target tokens since the
    # previous one.
    seconds.append(elapsed_time)
    tokens.append(self.stats.total_tokens - start_tokens)
    return log_scores(self, epoch_no, elapsed_time, start_tokens, start_correct,
                      total_batch_loss)

  training.TrainManager._log_scores = record  # pylint: disable=protected-access
  figures = _Figures.attach()
  load_before, t0 = loadavg(), time.time()
  training.train(rank=0, world_size=None, cfg=load_config(pathlib.Path(path)), skip_test=True)
  wall = time.time() - t0
  if len(seconds) != args.steps:
    raise RuntimeError(f"JoeyNMT logged {len(seconds)} updates, not {args.steps}")
  return {"arch": args.arch, "run": args.run, "config": path, "batch_size": args.batch_size,
          **summarize_steps(seconds, tokens), "step_s": seconds, "step_tokens": tokens,
          "params": figures.params[-1], "wall_s": wall, "includes_data_loading": True,
          "load_before": load_before, "load_after": loadavg(), **_versions()}


class _Figures(logging.Handler):
  """Keeps the figures of JoeyNMT's own log lines: "Total params: %d" and "Generation took
  %.4f[sec]." (its timing of the decoding loop)."""

  def __init__(self):
    super().__init__()
    self.params, self.generation_s = [], []

  def emit(self, record):
    msg = record.getMessage()
    if msg.startswith("Total params:"):
      self.params.append(int(msg.split()[2]))
    elif msg.startswith("Generation took"):
      self.generation_s.append(float(msg.split()[2].split("[")[0]))

  @classmethod
  def attach(cls):
    handler = cls()
    for name in ("joeynmt.model", "joeynmt.prediction"):
      logging.getLogger(name).addHandler(handler)
    return handler


def corpus_bleu(hypotheses: list[str], references: list[str]) -> float:
  """sacreBLEU 13a, case-insensitive: how the project scores its own lowercased outputs."""
  from sacrebleu.metrics import BLEU  # pylint: disable=import-outside-toplevel
  return float(BLEU(lowercase=True, tokenize="13a").corpus_score(hypotheses,
                                                                  [references]).score)


def decode(args) -> dict:
  """Decodes the test split with the model trained in <work>/<run>/ once per beam size."""
  from joeynmt.helpers_for_ddp import get_logger  # pylint: disable=import-outside-toplevel
  from joeynmt.config import load_config  # pylint: disable=import-outside-toplevel
  from joeynmt.prediction import test  # pylint: disable=import-outside-toplevel
  trained = load_config(pathlib.Path(args.work, args.run, "config.yaml"))
  refs_path = os.path.join(args.data_dir, SPLITS["test"] + ".en.gz")
  with gzip.open(refs_path, "rt", encoding="utf-8") as f:
    references = [line.rstrip("\n") for line in f]
  out_dir = os.path.join(args.work, args.run, f"decode_{args.tag}")
  os.makedirs(out_dir, exist_ok=True)
  get_logger("", log_file=os.path.join(out_dir, "test.log"))
  figures = _Figures.attach()
  results = []
  for k in args.beam_sizes:
    cfg = copy.deepcopy(trained)  # JoeyNMT's test mode also decodes a dev split: none here
    cfg["data"].pop("dev", None)
    cfg["testing"]["beam_size"] = k
    load_before, t0 = loadavg(), time.time()
    test(cfg=cfg, output_path=os.path.join(out_dir, f"beam{k}"))
    wall = time.time() - t0
    with open(os.path.join(out_dir, f"beam{k}.test"), encoding="utf-8") as f:
      hyps = [line.rstrip("\n") for line in f]
    results.append({"beam_size": k, "decode_s": figures.generation_s[-1], "wall_s": wall,
                    "bleu": corpus_bleu(hyps, references),
                    "mean_words": sum(len(h.split()) for h in hyps) / max(len(hyps), 1),
                    "load_before": load_before,
                    "load_after": loadavg()})
  # "score": the score each result holds, named as bench_decode's record names it
  return {"run": args.run, "score": "bleu", "sentences": len(references), "results": results,
          "decode_s_is": "JoeyNMT's own 'Generation took' (the decoding loop; wall_s adds "
                         "loading the vocabularies, the data and the model)", **_versions()}


def parse_args(argv):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("mode", choices=["train", "decode"])
  p.add_argument("--arch", choices=sorted(ARCHS), default="rnn")
  p.add_argument("--data_dir", default=os.path.join(
      os.environ.get("ATTN_SHARED_DATA", os.path.join("..", "shared", "data")), "multi30k"))
  p.add_argument("--work", required=True, help="JoeyNMT's data and model folders go here")
  p.add_argument("--run", required=True, help="the model folder's name under --work")
  p.add_argument("--steps", type=int, default=200)
  p.add_argument("--batch_size", type=int, default=128)
  p.add_argument("--seed", type=int, default=42)
  p.add_argument("--beam_sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1, 5])
  p.add_argument("--tag", default="1", help="decode: names the output folder decode_<tag>")
  p.add_argument("--json_out", required=True)
  return p.parse_args(argv)


def main(argv=None) -> int:
  args = parse_args(sys.argv[1:] if argv is None else argv)
  result = train(args) if args.mode == "train" else decode(args)
  tmp = args.json_out + ".tmp"
  os.makedirs(os.path.dirname(args.json_out) or ".", exist_ok=True)
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(result, f, indent=1)
  os.replace(tmp, args.json_out)
  brief = {k: v for k, v in result.items() if not isinstance(v, list) or k == "results"}
  print(json.dumps(brief, indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
