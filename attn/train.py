"""train_and_evaluate(config, workdir): train a seq2seq model, keep checkpoints, decode, score.

The loop, in named pieces: build (data, model, optimizer) -> restore -> train steps with progress,
evaluation and checkpoints -> restore the best -> decode the test split -> results on disk.
Library code: it never reads absl FLAGS; experiments/translate.py parses flags and calls it.

Workdir layout: config.json, vocab files and data cache (attn.data), checkpoints/ (latest, for
resuming), best/ (best eval score), metrics.jsonl and TensorBoard events, predictions.txt,
results.json, attention.npz, attention.png.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from attn import decode as decode_lib  # noqa
from attn import metrics as metrics_lib
from attn.models import ModelConfig, build_model, count_params, match_param_count, sequence_loss

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Optimization, evaluation and decoding settings (the `train` section of a config)."""
  steps: int = 2000
  learning_rate: float = 1e-3
  warmup_steps: int = 100
  schedule: str = "cosine"  # cosine | rsqrt | constant (after warm-up)
  end_lr_fraction: float = 0.1  # cosine decays to this fraction of the peak
  clip_norm: float = 1.0
  weight_decay: float = 0.0
  label_smoothing: float = 0.0
  log_every: int = 50
  eval_every: int = 500  # also saves `best/` when the eval score improves
  checkpoint_every: int = 250
  eval_decode_sentences: int = 500  # sentences of the eval split decoded (greedy) for the score
  beam_size: int = 1  # test decoding; 1 = greedy
  length_penalty: float = 0.6
  max_decode_ratio: float = 1.5  # decode at most ratio * Ts + 10 tokens
  attention_samples: int = 16  # examples whose attention goes to attention.npz
  max_wall_s: float = 0.0  # stop training (then evaluate) after this much training time; 0 = off
  seed: int = 0

  def __post_init__(self):
    if self.schedule not in _SCHEDULES:
      raise ValueError(f"train.schedule {self.schedule!r} unknown; known: {sorted(_SCHEDULES)}")
    if self.steps < 1 or self.beam_size < 1:
      raise ValueError("train.steps and train.beam_size must be >= 1")

  @classmethod
  def from_config(cls, cfg) -> "TrainConfig":
    fields = {f.name for f in dataclasses.fields(cls)}
    extra = set(dict(cfg)) - fields - {"batch_size"}
    if extra:
      raise ValueError(f"unknown train config fields {sorted(extra)}; known: {sorted(fields)}")
    return cls(**{k: v for k, v in dict(cfg).items() if k in fields})


_SCHEDULES = {
    "cosine": lambda c: optax.warmup_cosine_decay_schedule(
        0.0, c.learning_rate, c.warmup_steps, max(c.steps, c.warmup_steps + 1),
        c.learning_rate * c.end_lr_fraction),
    "rsqrt": lambda c: lambda step: c.learning_rate * jnp.minimum(
        (step + 1) / max(c.warmup_steps, 1), jnp.sqrt(max(c.warmup_steps, 1) / (step + 1))),
    "constant": lambda c: optax.linear_schedule(0.0, c.learning_rate, max(c.warmup_steps, 1)),
}


def make_optimizer(c: TrainConfig):
  """Adam(W) with warm-up/decay and global-norm clipping."""
  return optax.chain(optax.clip_by_global_norm(c.clip_norm),
                     optax.adamw(_SCHEDULES[c.schedule](c), weight_decay=c.weight_decay))


# --------------------------------------------------------------------------- jitted steps

def train_step(graphdef, state, batch, key, *, label_smoothing):
  """One optimizer step. state = nnx.state((model, optimizer)); returns (state, metrics)."""
  model, optimizer = nnx.merge(graphdef, state)

  def loss_fn(model):
    logits, _ = model(batch, dropout_key=key)
    total, ntok, nll = sequence_loss(logits, batch["tgt"], batch["tgt_lengths"], label_smoothing)
    return total / ntok, (ntok, nll)

  (loss, (ntok, nll)), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
  optimizer.update(model, grads)
  params = nnx.state(model, nnx.Param)
  metrics = {"loss": loss, "nll": nll / ntok, "tokens": ntok, "grad_norm": optax.tree.norm(grads),
             "param_norm": optax.tree.norm(params)}
  return nnx.state((model, optimizer)), metrics


def eval_step(graphdef, params, batch):
  """Summed NLL and token count of one batch (no dropout)."""
  model = nnx.merge(graphdef, params)
  logits, _ = model(batch)
  _, ntok, nll = sequence_loss(logits, batch["tgt"], batch["tgt_lengths"])
  return nll, ntok


def decode_batch(graphdef, params, src, src_lengths, *, max_len, beam_size, length_penalty):
  """Greedy (beam_size=1) or beam search for one batch: DecodeOutput with tokens [B, max_len] and
  attention weights [B, max_len, Ts]."""
  model = nnx.merge(graphdef, params)
  init = model.initial_decode_state(src, src_lengths)
  if beam_size == 1:
    return decode_lib.greedy_decode(model.step_fn(), init, src.shape[0], max_len)
  return decode_lib.beam_search(model.step_fn(), init, src.shape[0], max_len, beam_size=beam_size,
                                length_penalty=length_penalty)


# --------------------------------------------------------------------------- the run

@dataclasses.dataclass
class Run:
  """Everything a training run holds; built by `setup`, advanced by `train`."""
  workdir: str
  tc: TrainConfig
  mc: ModelConfig
  bundle: object
  model: object
  optimizer: object
  graphdef: object
  state: object
  step: int = 0
  best_score: float = -np.inf
  wall_s: float = 0.0  # training wall time accumulated across restarts
  train_tokens: float = 0.0
  window_rates: list = dataclasses.field(default_factory=list)  # tok/s of each logging window


def model_config(config, bundle) -> ModelConfig:
  mc = ModelConfig.from_config(config.model, src_vocab=bundle.src_vocab.size,
                               tgt_vocab=bundle.tgt_vocab.size)
  ref = config.model.get("match_params_of", "")
  if ref and ref != mc.decoder:
    mc = match_param_count(mc, mc.replace(decoder=ref, fused=False))
  return mc


def setup(config, workdir) -> Run:
  from attn import data  # pylint: disable=import-outside-toplevel  (needs the data extras)

  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    f.write(config.to_json_best_effort(indent=1))
  tc = TrainConfig.from_config(config.train)
  bundle = data.load(config.data, workdir)
  log.info(bundle.summary())
  mc = model_config(config, bundle)
  model = build_model(mc, seed=tc.seed)
  optimizer = nnx.Optimizer(model, make_optimizer(tc), wrt=nnx.Param)
  graphdef, state = nnx.split((model, optimizer))
  return Run(workdir, tc, mc, bundle, model, optimizer, graphdef, state)


class Checkpoints:
  """Orbax managers: `checkpoints/` keeps the latest step (resume), `best/` the best eval score."""

  def __init__(self, workdir):
    import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
    self.ocp = ocp
    opts = lambda **kw: ocp.CheckpointManagerOptions(max_to_keep=1, create=True, **kw)
    self.latest = ocp.CheckpointManager(os.path.join(os.path.abspath(workdir), "checkpoints"),
                                        options=opts(enable_async_checkpointing=True))
    self.best = ocp.CheckpointManager(os.path.join(os.path.abspath(workdir), "best"),
                                      options=opts(enable_async_checkpointing=False))

  def save(self, manager, run: Run):
    meta = {"step": run.step, "best_score": float(run.best_score), "wall_s": run.wall_s,
            "train_tokens": run.train_tokens}
    manager.save(run.step, args=self.ocp.args.Composite(
        state=self.ocp.args.StandardSave(run.state), meta=self.ocp.args.JsonSave(meta)), force=True)

  def restore(self, manager, run: Run) -> bool:
    step = manager.latest_step()
    if step is None:
      return False
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), run.state)
    out = manager.restore(step, args=self.ocp.args.Composite(
        state=self.ocp.args.StandardRestore(abstract), meta=self.ocp.args.JsonRestore()))
    run.state = out["state"]
    run.step, run.best_score = int(out["meta"]["step"]), float(out["meta"]["best_score"])
    run.wall_s, run.train_tokens = float(out["meta"]["wall_s"]), float(out["meta"]["train_tokens"])
    return True

  def wait(self):
    self.latest.wait_until_finished()
    self.best.wait_until_finished()


class MetricsWriter:
  """metrics.jsonl plus TensorBoard event files (tensorboardX, when installed)."""

  def __init__(self, workdir):
    self.path = os.path.join(workdir, "metrics.jsonl")
    try:
      from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
      self.tb = SummaryWriter(os.path.join(workdir, "tb"))
    except ImportError:
      log.warning("tensorboardX is not installed: metrics go to metrics.jsonl only")
      self.tb = None

  def write(self, step, split, values):
    with open(self.path, "a") as f:
      f.write(json.dumps({"step": step, "split": split, **values}) + "\n")
    if self.tb is not None:
      for k, v in values.items():
        self.tb.add_scalar(f"{split}/{k}", v, step)
      self.tb.flush()


def _params_view(run: Run):
  """(graphdef, params state) of the model alone, for eval and decoding."""
  nnx.update((run.model, run.optimizer), run.state)
  return nnx.split(run.model)


def evaluate(run: Run, role="eval", max_sentences=None):
  """Perplexity over the split and decoded outputs (greedy) of up to `max_sentences`."""
  graphdef, params = _params_view(run)
  step = _jit(eval_step, graphdef)
  nll = ntok = 0.0
  for batch in run.bundle.batches(role):
    a, b = step(params, _device_batch(batch))
    nll, ntok = nll + float(a), ntok + float(b)
  out = {"perplexity": float(np.exp(nll / max(ntok, 1.0))), "nll": nll / max(ntok, 1.0)}
  hyps = translate(run, role, beam_size=1, max_sentences=max_sentences)
  out.update(score_outputs(run, role, hyps))
  return out


@functools.lru_cache(maxsize=None)
def _jit(fn, graphdef, **static):
  return jax.jit(functools.partial(fn, graphdef, **static))


def _device_batch(batch):
  return {k: v for k, v in batch.items() if k in ("src", "src_lengths", "tgt", "tgt_lengths")}


@dataclasses.dataclass
class Translations:
  """Decoded outputs of a split, by example_id: text, lengths and attention [Tt, Ts] per example."""
  text: dict
  weights: dict
  src_lengths: dict
  src_labels: dict
  tgt_labels: dict


def translate(run: Run, role, *, beam_size, max_sentences=None) -> Translations:
  graphdef, params = _params_view(run)
  src_vocab, vocab = run.bundle.src_vocab, run.bundle.tgt_vocab
  out = Translations({}, {}, {}, {}, {})
  for batch in run.bundle.batches(role):
    Ts = batch["src"].shape[1]
    max_len = int(run.tc.max_decode_ratio * Ts) + 10
    fn = _jit(decode_batch, graphdef, max_len=max_len, beam_size=beam_size,
              length_penalty=run.tc.length_penalty)
    res = fn(params, jnp.asarray(batch["src"]), jnp.asarray(batch["src_lengths"]))
    tokens, lengths, weights = map(np.asarray, (res.tokens, res.lengths, res.weights))
    for i, ex in enumerate(batch["example_id"]):
      ex = int(ex)
      if ex < 0:
        continue  # padding rows of a partial batch
      out.text[ex] = vocab.decode(tokens[i].tolist())
      out.weights[ex] = weights[i, :lengths[i], :batch["src_lengths"][i]]
      out.src_lengths[ex] = int(batch["src_lengths"][i])
      out.src_labels[ex] = src_vocab.decode_tokens(batch["src"][i].tolist()) + ["</s>"]
      out.tgt_labels[ex] = vocab.decode_tokens(tokens[i].tolist()) + ["</s>"]
    if max_sentences and len(out.text) >= max_sentences:
      break
  return out


def score_outputs(run: Run, role, hyps: Translations) -> dict:
  """BLEU/chrF for text tasks, exact match (+ per source-length bucket) for built-in tasks."""
  refs_all = run.bundle.references(role)
  ids = sorted(hyps.text)
  h = [hyps.text[i] for i in ids]
  r = [refs_all[i] for i in ids]
  lowercase = bool(run.bundle.config.lowercase)
  out = {"bleu": metrics_lib.bleu(h, r, lowercase=lowercase),
         "chrf": metrics_lib.chrf(h, r, lowercase=lowercase),
         "exact_match": metrics_lib.exact_match(h, r)}
  if run.bundle.has_alignments:
    lengths = [hyps.src_lengths[i] for i in ids]
    out["exact_match_by_src_len"] = metrics_lib.exact_match_by_bucket(
        h, r, lengths, buckets=10 if max(lengths) > 20 else 5)
  return out


def alignment_scores(run: Run, role="test") -> dict:
  """Teacher-forced attention against the gold alignments of a built-in task: AER of the argmax
  links and the attention mass on gold links, pooled over the split."""
  graphdef, params = _params_view(run)
  forward = _jit(_teacher_forced_weights, graphdef)
  preds, golds, tl, sl = [], [], [], []
  for batch in run.bundle.batches(role):
    w = forward(params, _device_batch(batch))
    if w is None:
      return {}  # the fused kernel never forms the weights
    keep = batch["example_id"] >= 0
    preds.append(np.asarray(w)[keep])
    golds.append(batch["alignments"][keep])
    tl.append(batch["tgt_lengths"][keep])
    sl.append(batch["src_lengths"][keep])
  Tt = max(p.shape[1] for p in preds)
  Ts = max(p.shape[2] for p in preds)
  pad = lambda x: np.pad(x, ((0, 0), (0, Tt - x.shape[1]), (0, Ts - x.shape[2])))
  w, g = np.concatenate([pad(p) for p in preds]), np.concatenate([pad(x) for x in golds])
  tl, sl = np.concatenate(tl), np.concatenate(sl)
  return {"aer": metrics_lib.alignment_error_rate(w, g, tl, sl),
          "attention_on_gold": metrics_lib.attention_on_gold(w, g, tl, sl)}


def _teacher_forced_weights(graphdef, params, batch):
  return nnx.merge(graphdef, params)(batch)[1]


def _progress(run, m, seconds, steps, tokens):
  """One progress line; rates over the last logging window (eval time excluded)."""
  eta = seconds / max(steps, 1) * (run.tc.steps - run.step)
  return (f"step {run.step}/{run.tc.steps} loss {m['loss']:.3f} ppl {np.exp(m['nll']):.1f} "
          f"|g| {m['grad_norm']:.2f} tok/s {tokens / max(seconds, 1e-9):.0f} "
          f"ETA {time.strftime('%H:%M:%S', time.gmtime(eta))}")


def train(run: Run, ckpt: Checkpoints, writer: MetricsWriter, *, stop_after=None):
  """Runs steps from run.step to tc.steps (or `stop_after` steps, for tests of resuming)."""
  tc = run.tc
  # No buffer donation: async checkpoint saves may still be reading the previous state.
  step_fn = jax.jit(functools.partial(train_step, run.graphdef, label_smoothing=tc.label_smoothing))
  base_key = jax.random.PRNGKey(tc.seed + 1)
  step_start = run.step
  it = run.bundle.train_iter(run.step)
  t_seg = time.time()  # start of the current timed segment (evals and saves excluded)
  win = {"s": 0.0, "steps": 0, "tokens": 0.0}  # the logging window
  last = None
  while run.step < tc.steps and (stop_after is None or run.step - step_start < stop_after):
    if tc.max_wall_s and run.wall_s >= tc.max_wall_s:
      break  # resumed a run that had already used its time
    batch = _device_batch(next(it))
    run.state, last = step_fn(run.state, batch, jax.random.fold_in(base_key, run.step))
    run.step += 1
    ntok = float(batch["tgt_lengths"].sum())
    run.train_tokens += ntok
    win["steps"] += 1
    win["tokens"] += ntok
    if run.step % tc.log_every == 0 or run.step == tc.steps:
      m = {k: float(v) for k, v in jax.device_get(last).items()}  # waits for the step
      now = time.time()
      run.wall_s += now - t_seg
      win["s"] += now - t_seg
      t_seg = now
      rate = win["tokens"] / max(win["s"], 1e-9)
      run.window_rates.append(rate)
      writer.write(run.step, "train", {**m, "tokens_per_sec": rate})
      log.info(_progress(run, m, win["s"], win["steps"], win["tokens"]))
      win = {"s": 0.0, "steps": 0, "tokens": 0.0}
    out_of_time = bool(tc.max_wall_s) and run.wall_s + time.time() - t_seg >= tc.max_wall_s
    if out_of_time:
      log.info(f"train.max_wall_s={tc.max_wall_s:.0f} reached at step {run.step}: stopping")
    last_step = run.step == tc.steps or out_of_time
    eval_now = (run.step % tc.eval_every == 0 or last_step) and "eval" in run.bundle.splits
    save_now = run.step % tc.checkpoint_every == 0 or last_step
    if eval_now or save_now:
      jax.block_until_ready(run.state)
      now = time.time()
      run.wall_s += now - t_seg
      win["s"] += now - t_seg
    if eval_now:
      ev = evaluate(run, "eval", tc.eval_decode_sentences)
      writer.write(run.step, "eval", {k: v for k, v in ev.items() if isinstance(v, float)})
      log.info(f"eval at step {run.step}: " + ", ".join(
          f"{k} {v:.3f}" for k, v in ev.items() if isinstance(v, float)))
      score = ev["exact_match"] if run.bundle.has_alignments else ev["bleu"]
      if score > run.best_score:
        run.best_score = score
        ckpt.save(ckpt.best, run)
    if save_now:
      ckpt.save(ckpt.latest, run)
    if eval_now or save_now:
      t_seg = time.time()
    if out_of_time:
      break
  jax.block_until_ready(run.state)
  run.wall_s += time.time() - t_seg
  return last


def write_results(run: Run, ckpt: Checkpoints, role="test") -> dict:
  """Decodes `role` with the best checkpoint (else the last) and writes the result files."""
  if "eval" in run.bundle.splits and ckpt.best.latest_step() is not None:
    last_step = run.step
    ckpt.restore(ckpt.best, run)
    log.info(f"restored best checkpoint (step {run.step}, eval score {run.best_score:.3f})")
    best_step, run.step = run.step, last_step
  else:
    best_step = run.step
  if role not in run.bundle.splits:
    role = "eval"
  t0 = time.time()
  hyps = translate(run, role, beam_size=run.tc.beam_size)
  decode_s = time.time() - t0
  scores = score_outputs(run, role, hyps)
  if run.bundle.has_alignments and run.mc.decoder != "none":
    scores.update(alignment_scores(run, role))
  if run.tc.beam_size > 1:  # the greedy figure too, for comparison with beam search
    greedy = score_outputs(run, role, translate(run, role, beam_size=1))
    scores.update({f"{k}_greedy": v for k, v in greedy.items() if isinstance(v, float)})
  ids = sorted(hyps.text)
  with open(os.path.join(run.workdir, "predictions.txt"), "w") as f:
    f.writelines(hyps.text[i] + "\n" for i in ids)
  sample = ids[:run.tc.attention_samples]
  sources = run.bundle.sources(role)
  np.savez_compressed(
      os.path.join(run.workdir, "attention.npz"),
      **{f"weights_{i}": hyps.weights[i] for i in sample},
      example_ids=np.array(sample), sources=np.array([sources[i] for i in sample]),
      predictions=np.array([hyps.text[i] for i in sample]))
  results = {
      "split": role, **scores, "params": count_params(run.model), "step": run.step,
      "best_step": best_step, "tokens_per_sec": run.train_tokens / max(run.wall_s, 1e-9),
      # steady state: median over logging windows, the first (compilation) left out
      "tokens_per_sec_steady": float(np.median(run.window_rates[1:] or run.window_rates or [0.0])),
      "wall_s": run.wall_s, "decode_s": decode_s, "beam_size": run.tc.beam_size,
      "decoder": run.mc.decoder, "score": run.mc.score, "normalizer": run.mc.normalizer,
      "model_config": dataclasses.asdict(run.mc),
  }
  with open(os.path.join(run.workdir, "results.json"), "w") as f:
    json.dump(results, f, indent=1)
  if run.mc.decoder != "none" and sample:
    from attn import viz  # pylint: disable=import-outside-toplevel
    i = max(sample, key=lambda j: hyps.src_lengths[j])  # the longest sampled source
    viz.heatmap(hyps.weights[i], hyps.src_labels[i], hyps.tgt_labels[i],
                os.path.join(run.workdir, "attention.png"),
                title=f"{run.mc.decoder}/{run.mc.score}: example {i}")
  return results


def train_and_evaluate(config, workdir) -> dict:
  """Trains (resuming from `workdir` if it holds a checkpoint), then decodes and scores the test
  split. Returns the results dict also written to `workdir/results.json`."""
  run = setup(config, workdir)
  log.info(f"model {run.mc.decoder}/{run.mc.score}/{run.mc.normalizer}: "
           f"{count_params(run.model):,} parameters")
  ckpt = Checkpoints(workdir)
  if ckpt.restore(ckpt.latest, run):
    log.info(f"resumed from step {run.step}")
  writer = MetricsWriter(workdir)
  try:
    train(run, ckpt, writer)
  finally:
    ckpt.wait()
  results = write_results(run, ckpt)
  ckpt.wait()
  return results


def results_table(rows) -> str:
  """A markdown table of results dicts (one row each)."""
  cols = ["decoder", "score", "normalizer", "params", "bleu", "chrf", "exact_match",
          "tokens_per_sec", "wall_s"]
  fmt = lambda v: f"{v:,}" if isinstance(v, int) else f"{v:.3f}" if isinstance(v, float) else str(v)
  lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
  for r in rows:
    lines.append("| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |")
  for r in rows:
    if "exact_match_by_src_len" in r:
      lines.append(f"\n{r['decoder']}: exact match by source length " + ", ".join(
          f"{k}: {v:.2f}" for k, v in r["exact_match_by_src_len"].items()))
  return "\n".join(lines)
