"""Faults a user or the machine can cause, injected for real: divergence, ties in the eval score,
a bad config on an existing workdir, another model's checkpoints, two runs on one workdir,
kill -9, Ctrl-C, a full disk, and command-line mistakes. Each must end in one clear line (or a
correct result) with nothing already computed lost. docs/reliability.md lists them."""

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

import full_disk
from attn import data, training
from attn.errors import ConfigError, DataError
from attn.training import evaluation, loop, workdir as workdir_lib
from experiments.configs import data as data_presets
from experiments.configs import translate as translate_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = "--config=experiments/configs/translate.py:smoke"
TRANSFORMER = "--config=experiments/configs/translate.py:demo_transformer"


def _tiny(**train_kw):
  c = translate_config.get_config("smoke")
  c.train.update(dict(steps=4, checkpoint_every=2, eval_every=100, log_every=2))
  c.train.update(train_kw)
  return c


def _cli(*args, max_file_bytes=None, timeout=300, env=None):
  """`python -m experiments.translate ARGS`; max_file_bytes emulates a full disk (full_disk.py);
  env entries are added to this process's environment."""
  if max_file_bytes is None:
    cmd = [sys.executable, "-m", "experiments.translate", *args]
  else:
    cmd = [sys.executable, "-c", full_disk.prelude(max_file_bytes) +
           "import runpy, sys; sys.argv = ['translate'] + sys.argv[1:]; "
           "runpy.run_module('experiments.translate', run_name='__main__')", *args]
  return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                        env=None if env is None else {**os.environ, **env})


def _one_error_line(p):
  errors = [l for l in p.stderr.splitlines() if l.startswith("error:")]
  assert len(errors) == 1 and "Traceback" not in p.stderr, p.stderr[-3000:]
  return errors[0]


def _checkpoint_leaves(path):
  """Every array of the newest step under an orbax directory, read back with orbax."""
  import orbax.checkpoint as ocp
  steps = sorted(int(n) for n in os.listdir(path) if n.isdigit())
  with ocp.CheckpointManager(path) as mgr:
    restored = mgr.restore(steps[-1], args=ocp.args.Composite(state=ocp.args.StandardRestore()))
  return [np.asarray(x) for x in jax.tree.leaves(restored["state"])
          if not jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)]


# ------------------------------------------------------------------------------ silently wrong

@pytest.mark.parametrize("lr", [1e38, 1e9])  # non-finite parameters / a finite exploded loss
def test_divergence_stops_the_run_and_saves_nothing_after_it(tmp_path, lr):
  cfg = _tiny(learning_rate=lr, warmup_steps=1, steps=8)
  with pytest.raises(loop.TrainingDiverged, match="diverged at step"):
    training.train_and_evaluate(cfg, str(tmp_path))
  assert not (tmp_path / "results.json").exists()
  for sub in ("checkpoints", "best"):
    d = tmp_path / sub
    if d.exists() and any(n.isdigit() for n in os.listdir(d)):
      for leaf in _checkpoint_leaves(str(d)):
        assert np.isfinite(leaf.astype(np.float64)).all() and np.abs(leaf).max() < 1e6, sub


def test_divergence_is_one_line_on_the_command_line(tmp_path):
  p = _cli(SMOKE, f"--workdir={tmp_path}", "--config.train.learning_rate=1e38",
           "--config.train.warmup_steps=1")
  assert p.returncode == 2
  assert "diverged" in _one_error_line(p)


def test_ties_in_the_first_metric_are_broken_by_the_next_and_later_wins(tmp_path, monkeypatch):
  scripted = iter([  # exact match stays 0 while BLEU climbs; then an exact tie
      {"exact_match": 0.0, "bleu": 1.0, "chrf": 5.0},
      {"exact_match": 0.0, "bleu": 30.0, "chrf": 40.0},
      {"exact_match": 0.0, "bleu": 20.0, "chrf": 60.0},
      {"exact_match": 0.0, "bleu": 30.0, "chrf": 40.0},
  ])
  monkeypatch.setattr(evaluation, "evaluate", lambda run, role, n=None: dict(next(scripted)))
  cfg = _tiny(steps=4, eval_every=1, checkpoint_every=4, log_every=1)
  run = training.setup(cfg, str(tmp_path))
  ckpt = training.Checkpoints(str(tmp_path))
  try:
    training.train(run, ckpt, training.MetricsWriter(str(tmp_path)))
  finally:
    ckpt.close()
  assert run.progress.best_step == 4 and run.progress.best_score == (0.0, 30.0, 40.0)
  assert sorted(int(n) for n in os.listdir(tmp_path / "best") if n.isdigit()) == [4]
  assert loop.is_better((0.0, 2.0), (0.0, 1.0)) and not loop.is_better((0.0, 1.0), (0.0, 2.0))
  assert loop.is_better((1.0, 0.0), (0.0, 99.0)) and loop.is_better((0.5,), ())


def test_each_step_draws_its_own_dropout_key_and_resume_draws_the_same(tmp_path):
  cfg = _tiny(steps=6)
  cfg.model.dropout = 0.3
  run = training.setup(cfg, str(tmp_path))
  seen = []
  real = run.step_fn()

  def recording(state, batch, key):
    seen.append(np.asarray(jax.random.key_data(key) if jax.dtypes.issubdtype(
        key.dtype, jax.dtypes.prng_key) else key).tobytes())
    return real(state, batch, key)

  run.step_fn = lambda: recording
  ckpt = training.Checkpoints(str(tmp_path))
  try:
    training.train(run, ckpt, training.MetricsWriter(str(tmp_path)))
  finally:
    ckpt.close()
  assert len(seen) == 6 and len(set(seen)) == 6  # no two steps share a dropout mask
  again = [np.asarray(jax.random.key_data(k) if jax.dtypes.issubdtype(
      k.dtype, jax.dtypes.prng_key) else k).tobytes() for k in map(run.step_key, range(6))]
  assert again == seen  # a function of (seed, step) only: a resumed run draws the same
  seed = run.tc.seed + 1  # the keys the loop draws are PRNGKey(seed + 1) folded with the step
  assert seen == [np.asarray(jax.random.key_data(k) if jax.dtypes.issubdtype(
      k.dtype, jax.dtypes.prng_key) else k).tobytes()
                  for k in (jax.random.fold_in(jax.random.PRNGKey(seed), i) for i in range(6))]
  if run.mesh is not None:
    assert run.step_key(0).sharding.is_fully_replicated


def test_heatmap_labels_match_the_weights_even_without_eos_or_with_specials(tmp_path):
  """A short run's output may never emit EOS, or emit PAD/BOS mid-sequence: the heatmap still
  gets one label per row and column (the plot used to raise after results were computed)."""
  from attn.common import plots
  from attn.data.tokenize import TokenizerSpec, Vocab
  vocab = Vocab(["a", "b", "\u2581c"], TokenizerSpec(kind="space"))
  out = [4, 0, 1, 6, 5, 4, 99]  # PAD, BOS mid-output, an id past the vocabulary, no EOS
  src = [5, 6, 2]
  labels, src_labels = vocab.labels(out), vocab.labels(src)
  assert len(labels) == len(out) and len(src_labels) == len(src)
  assert labels[1:3] == ["<pad>", "<s>"] and labels[3] == "_c" and labels[-1] == "<unk>"
  path = tmp_path / "attention.png"
  plots.heatmap(np.full((len(out), len(src)), 1 / 3), src_labels, labels, str(path))
  assert path.stat().st_size > 1000


# slow: tests/test_summarize.py's code_runs train the pointer-generator and switch coverage on
# fast
@pytest.mark.slow
def test_translation_trains_the_pointer_generator_and_coverage(tmp_path):
  # Before: experiments.translate accepted model.rnn.pointer / coverage and trained the plain
  # loss: the p_gen gate kept its initial weights while decoding mixed in the copy
  # distribution, and the coverage loss was dropped (loss == nll in metrics.jsonl).
  from flax import nnx
  from attn.models import build_model
  c = _tiny(eval_every=4, checkpoint_every=4)
  c.data.update(dict(shared_vocab=True, extended_vocab=True))
  c.model.rnn.update(dict(pointer=True, coverage=True))
  res = training.train_and_evaluate(c, str(tmp_path), task="translate")
  assert res["model_config"]["rnn"]["pointer"] and np.isfinite(res["bleu"])
  run = training.load_run(str(tmp_path), task="translate")
  init = build_model(run.mc, seed=run.tc.seed)
  trained, initial = (jax.tree.leaves(nnx.state(m.decoder.gate, nnx.Param))
                      for m in (run.model, init))
  assert trained and all(not np.array_equal(a, b) for a, b in zip(trained, initial))
  with open(tmp_path / "metrics.jsonl") as f:
    rows = [json.loads(l) for l in f]
  train_rows = [r for r in rows if r.get("split") == "train"]
  assert train_rows and all(r["loss"] > r["nll"] for r in train_rows)  # the coverage term
  assert [r["step"] for r in rows if r.get("split") == "eval"] == [4]  # evaluation ran


# slow: two runs; test_ctrl_c_saves_a_checkpoint_and_exits_130 and the resume tests of tests/test_train.py pin its parts fast
@pytest.mark.slow
def test_ctrl_c_during_the_last_evaluation_resumes_to_the_uninterrupted_result(tmp_path,
                                                                                 monkeypatch):
  """The checkpoint saved on Ctrl-C during the evaluation of the last step says the evaluation is
  due; the rerun runs it first, so it ends where the uninterrupted twin does."""
  tiny = lambda: _tiny(steps=4, eval_every=2, checkpoint_every=2)
  twin = training.train_and_evaluate(tiny(), str(tmp_path / "twin"))
  real = evaluation.evaluate

  def ctrl_c_at_the_last_step(run, *args, **kwargs):
    if run.progress.step == 4:
      raise KeyboardInterrupt
    return real(run, *args, **kwargs)
  monkeypatch.setattr(evaluation, "evaluate", ctrl_c_at_the_last_step)
  with pytest.raises(KeyboardInterrupt):
    training.train_and_evaluate(tiny(), str(tmp_path / "run"))
  monkeypatch.undo()
  assert not (tmp_path / "run" / "results.json").exists()
  resumed = training.train_and_evaluate(tiny(), str(tmp_path / "run"))
  assert resumed["best_step"] == twin["best_step"] == 4
  timing = ("wall_s", "decode_s", "eval_s", "tokens_per_sec", "tokens_per_sec_steady")
  assert ({k: v for k, v in resumed.items() if k not in timing}
          == {k: v for k, v in twin.items() if k not in timing})
  assert ((tmp_path / "run" / "predictions.txt").read_text()
          == (tmp_path / "twin" / "predictions.txt").read_text())


# ------------------------------------------------------------------------------ lost records

# slow: tests/test_train.py::test_max_wall_s_stops_training_then_evaluates_and_saves pins the
# budget fast
@pytest.mark.slow
def test_a_resumed_run_asked_for_more_steps_with_its_time_budget_spent_says_so(tmp_path):
  """train.max_wall_s is the whole run's budget: a rerun that raises train.steps but cannot
  train is refused in one line, the workdir untouched; the same command rerun still decodes."""
  training.train_and_evaluate(_tiny(max_wall_s=1e-3), str(tmp_path))  # stops after step 1
  before = {n: (tmp_path / n).read_bytes() for n in ("config.json", "results.json", "model.json")}
  with pytest.raises(ConfigError, match=r"train.steps was raised from 4 to 8, but this run "
                                        r"would train no step: train.max_wall_s=0.001 is spent"):
    training.train_and_evaluate(_tiny(steps=8, max_wall_s=1e-3), str(tmp_path))
  assert {n: (tmp_path / n).read_bytes() for n in before} == before
  assert training.train_and_evaluate(_tiny(steps=8, max_wall_s=600), str(tmp_path))["step"] == 8


def _corpus(tmp_path):
  d = tmp_path / "corpus"
  d.mkdir()
  for split, n in (("train", 40), ("val", 4), ("test_2016_flickr", 4)):
    for lang, words in (("de", "ein zwei drei vier fünf"), ("en", "one two three four five")):
      (d / f"{split}.{lang}").write_text(
          "".join(" ".join(words.split()[:1 + i % 5]) + "\n" for i in range(n)))
  return d


def _corpus_data(d, **overrides):
  c = data_presets.get_config("multi30k")
  c.update({"dir": str(d), "min_freq": 1, "num_buckets": 1, "num_threads": 0, "batch_size": 4,
            **overrides})
  return c


def _tree(path):
  return {os.path.join(r, n): os.stat(os.path.join(r, n)).st_mtime_ns
          for r, _, names in os.walk(path) for n in names}


def test_resuming_with_other_vocabulary_settings_is_refused_naming_them(tmp_path):
  d, wd = _corpus(tmp_path), str(tmp_path / "wd")
  data.load(_corpus_data(d, vocab_size=6), wd)
  other = tmp_path / "other"
  shutil.copytree(d, other)
  (other / "train.en").write_text((other / "train.en").read_text().replace("five", "six"))
  before = _tree(wd)
  for change, expect in (({"vocab_size": 8}, "data.vocab_size=6 there, 8 here"),
                         ({"min_freq": 2}, "data.min_freq=1 there, 2 here"),
                         ({"dir": str(other)}, f"data.dir={str(d)!r} there, {str(other)!r} here"),
                         ({"shared_vocab": True}, "data.shared_vocab=False there, True here")):
    with pytest.raises(DataError, match="holds vocabularies built with other data settings") as e:
      data.load(_corpus_data(d, **{"vocab_size": 6, **change}), wd)
    assert expect in str(e.value) and "\n" not in str(e.value)
  assert _tree(wd) == before  # refused before anything was written
  assert data.load(_corpus_data(d, vocab_size=6, max_src_len=64), wd).src_vocab.size == 6
  moved = tmp_path / "moved"
  shutil.copytree(d, moved)  # the same training files elsewhere: the vocabularies still fit
  assert data.load(_corpus_data(moved, vocab_size=6), wd).src_vocab.size == 6
  # A workdir saved before the settings were: they are read from its config.json.
  os.remove(os.path.join(wd, "vocab.settings.json"))
  with open(os.path.join(wd, "config.json"), "w") as f:
    json.dump({"data": _corpus_data(d, vocab_size=6).to_dict()}, f)
  with pytest.raises(DataError, match="data.vocab_size=6 there, 8 here"):
    data.load(_corpus_data(d, vocab_size=8), wd)


def test_a_full_disk_while_the_data_cache_is_written_is_one_line(tmp_path, monkeypatch):
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  d, wd = _corpus(tmp_path), str(tmp_path / "wd")

  def disk_full(self, path, examples):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
  monkeypatch.setattr(tfds.core.writer.ExampleWriter, "write", disk_full)
  with pytest.raises(DataError) as e:
    data.load(_corpus_data(d), wd)
  line = str(e.value)
  assert line.startswith(f"writing the data cache in {wd}/data_cache failed: No space left on "
                         "device") and "rerun the same command" in line and "\n" not in line
  monkeypatch.undo()
  assert len(data.load(_corpus_data(d), wd).splits["train"])  # nothing half-written was kept



def test_an_invalid_config_leaves_an_existing_workdir_untouched(tmp_path):
  training.train_and_evaluate(_tiny(), str(tmp_path))
  before = {n: (tmp_path / n).read_bytes() for n in ("config.json", "results.json", "model.json")}
  for override in ("--config.train.eval_every=0", "--config.model.rnn.score=nope",
                   "--config.data.too_long=sometimes"):
    p = _cli(SMOKE, f"--workdir={tmp_path}", override)
    assert p.returncode == 2, p.stderr[-2000:]
    _one_error_line(p)
  assert {n: (tmp_path / n).read_bytes() for n in before} == before


@pytest.mark.parametrize("fresh,overrides,message", [
    ("absent", ["--config.data.task=parallel_text", "--config.data.dir={tmp}/nowhere"],
     "data directory '{tmp}/nowhere' does not exist"),
    ("empty", ["--config.data.task=parallel_text", "--config.data.dir={tmp}"],
     "no file train.de[.gz] in {tmp} (it holds: run)"),
    ("empty", ["--config.data.task=jsonl", "--config.data.dir={tmp}",
               "--config.data.source_field=a", "--config.data.target_field=b"],
     "no file train.jsonl[.gz] in {tmp}"),
    ("absent", ["--config.data.task=revers"], "unknown data.task 'revers'; known: copy,"),
])
def test_a_run_refused_on_its_data_leaves_a_fresh_workdir_as_it_was(tmp_path, fresh, overrides,
                                                                    message):
  # Before: the workdir was bound (application.json) and locked (.lock) before the data files
  # were looked for, so a refused run left them behind though the docs promised nothing written.
  workdir = tmp_path / "run"
  if fresh == "empty":
    workdir.mkdir()
  p = _cli(SMOKE, f"--workdir={workdir}", *(o.format(tmp=tmp_path) for o in overrides))
  assert p.returncode == 2, p.stderr[-2000:]
  assert message.format(tmp=tmp_path) in _one_error_line(p)
  if fresh == "empty":
    assert os.listdir(workdir) == []  # no application.json, .lock or data cache
  else:
    assert not workdir.exists()


def test_resuming_with_another_model_is_refused_naming_the_fields(tmp_path):
  training.train_and_evaluate(_tiny(), str(tmp_path))
  config_json = (tmp_path / "config.json").read_bytes()
  other = _tiny()
  other.model.rnn.dec_hidden = 24
  other.model.rnn.cell = "lstm"
  with pytest.raises(workdir_lib.WorkdirError) as e:
    training.train_and_evaluate(other, str(tmp_path))
  assert "model.rnn.dec_hidden=16 there, 24 here" in str(e.value)
  assert "model.rnn.cell" in str(e.value)
  assert (tmp_path / "config.json").read_bytes() == config_json  # the record stays true
  longer = _tiny(steps=6)  # the same model trained further is a resume, not a conflict
  assert training.train_and_evaluate(longer, str(tmp_path))["step"] == 6


def test_a_second_run_on_a_workdir_fails_at_once_naming_the_holder(tmp_path):
  with workdir_lib.lock(str(tmp_path)):
    t0 = time.time()
    p = _cli(SMOKE, f"--workdir={tmp_path}")
    assert p.returncode == 2 and time.time() - t0 < 60
    assert f"process {os.getpid()}" in _one_error_line(p)


def test_a_killed_run_does_not_leave_the_lock_behind(tmp_path):
  holder = subprocess.Popen(
      [sys.executable, "-c", "import sys, time; from attn.training import workdir; "
       "ctx = workdir.lock(sys.argv[1]); ctx.__enter__(); print('locked', flush=True); "
       "time.sleep(600)", str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == "locked"
    with pytest.raises(workdir_lib.WorkdirError, match=f"process {holder.pid}"):
      workdir_lib.lock(str(tmp_path)).__enter__()
  finally:
    holder.kill()  # kill -9
    holder.wait()
  with workdir_lib.lock(str(tmp_path)):  # the kernel dropped the dead process's lock
    assert (tmp_path / workdir_lib.LOCK_FILE).read_text().strip() == str(os.getpid())


def test_metrics_rows_past_the_restored_step_are_dropped_on_resume(tmp_path):
  path = tmp_path / "metrics.jsonl"
  rows = [{"step": s, "split": "train", "loss": 1.0 / s} for s in range(1, 9)]
  path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 9, "spl')  # cut short
  training.MetricsWriter(str(tmp_path), resumed_step=4).write(5, "train", {"loss": 0.5})
  steps = [json.loads(l)["step"] for l in path.read_text().splitlines()]
  assert steps == [1, 2, 3, 4, 5]


def test_a_resumed_cli_run_writes_every_step_once(tmp_path):
  training.train_and_evaluate(_tiny(steps=4, log_every=1), str(tmp_path))
  with open(tmp_path / "metrics.jsonl", "a") as f:  # a killed process logged past its last save
    f.write(json.dumps({"step": 5, "split": "train", "loss": 9.0}) + "\n")
  training.train_and_evaluate(_tiny(steps=6, log_every=1), str(tmp_path))
  train_steps = [json.loads(l)["step"] for l in open(tmp_path / "metrics.jsonl")
                 if json.loads(l)["split"] == "train"]
  assert train_steps == [1, 2, 3, 4, 5, 6]


def test_a_failed_save_stops_at_that_step_keeping_earlier_checkpoints(tmp_path):
  training.train_and_evaluate(_tiny(steps=2), str(tmp_path))  # checkpoint of step 2

  # A full disk: no file may grow past 20 kB (a checkpoint's arrays do; the logs do not). The
  # disk is full for the compilation cache too, so the run reads the suite's shared cache but
  # writes nothing to it: an entry cut short there would stop every process writing to it until
  # the next one starts (attn/common/compile_cache.py).
  p = _cli(SMOKE, f"--workdir={tmp_path}", "--config.train.steps=8",
           "--config.train.log_every=1", "--config.train.eval_every=100", max_file_bytes=20_000,
           env={"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "1e9"})
  assert p.returncode == 2
  line = _one_error_line(p)
  assert "checkpoint of step 4 failed" in line and "step 2 is intact" in line, line
  assert "step 5/8" not in p.stderr  # no step after the failed save
  assert sorted(int(n) for n in os.listdir(tmp_path / "checkpoints") if n.isdigit()) == [2]
  assert training.train_and_evaluate(_tiny(steps=4), str(tmp_path))["step"] == 4  # resumes


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl_c", "sigterm"])
def test_ctrl_c_saves_a_checkpoint_and_exits_130(tmp_path, signum):
  """Ctrl-C, and a scheduler's SIGTERM (a preemption, `srun` or `kill` outside a launch.py
  Slurm task; before: the run died at once, nothing saved since the last checkpoint)."""
  p = subprocess.Popen(
      [sys.executable, "-m", "experiments.translate", SMOKE, f"--workdir={tmp_path}",
       "--config.train.steps=1000000", "--config.train.log_every=50",
       "--config.train.checkpoint_every=100000", "--config.train.eval_every=1000000"],
      cwd=REPO, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
  lines = []
  for line in p.stderr:
    lines.append(line)
    if "step 100/" in line:
      break
  p.send_signal(signum)
  rest = p.stderr.read()
  assert p.wait(timeout=120) == 130, "".join(lines)[-2000:] + rest[-2000:]
  assert "Traceback" not in rest and "interrupted at step" in rest
  saved = [int(n) for n in os.listdir(tmp_path / "checkpoints") if n.isdigit()]
  assert len(saved) == 1 and saved[0] >= 100


# ------------------------------------------------------------------------------ one-line errors

@pytest.mark.parametrize("args,expect", [
    (["--config.model.rnn.decodr=none"], 'Did you mean "decoder"'),
    (["--config.model.decoder=none"], "it moved to model.rnn.decoder"),
    (["--config.model.transformer.num_heads=8"], "model.transformer.num_heads=8 belongs to "
                                                 "model.arch=transformer; model.arch=rnn reads"),
    (["--config=experiments/configs/translate.py:smok"], "unknown translate preset 'smok'"),
    (["--config=experiments/configs/translat.py:smoke"], "No such file"),
    (["--config.train.steps=many"], "config.train.steps"),
    (["--config.train.log_every=0"], "train.log_every=0"),
    (["--config.train.learning_rate=-0.01"], "learning_rate=-0.01"),
    (["--config.train.warmup_steps=-5"], "warmup_steps=-5"),
    (["--config.model.rnn.score=dot"], "does not fit decoder 'bahdanau'"),
    # Before: every word <unk>, exit 0.
    (["--config.data.vocab_size=1"], "data config: vocab_size=1 leaves no room for a word: the 4 "
                                     "reserved ids (<pad> <s> </s> <unk>) count in it; use at "
                                     "least 5, or 0 for no cap"),
    # Before: a traceback inside the first jitted step, after the workdir files were written.
    (["--config.model.rnn.scope=window", "--config.model.rnn.half_width=-1"],
     "model.rnn.half_width must be positive, got -1"),
    # Before: trained, then a traceback at the first evaluation (no src_ext to copy from).
    (["--config.model.rnn.pointer=True"], "model.rnn.pointer=True needs data.extended_vocab=True"),
    # Before: passed validation and launch --dry_run, then failed inside the first step.
    (["--config.model.rnn.pointer=True", "--config.data.shared_vocab=True",
      "--config.data.extended_vocab=True", "--config.train.label_smoothing=0.1"],
     "train.label_smoothing=0.1 with model.rnn.pointer=True: label smoothing is not defined on "
     "the pointer-generator's mixed distribution; set train.label_smoothing=0"),
    # Before: trained, and the first evaluation died with a traceback (learned positions, and
    # the location score's weights, end at model.max_src_len).
    ([TRANSFORMER, "--config.model.transformer.pos_encoding=learned",
      "--config.model.max_src_len=20"],
     "model.max_src_len=20 is below the widest source batch, 28 tokens (data.max_src_len=28): "
     "with model.transformer.pos_encoding='learned' the model has no position past "
     "model.max_src_len; raise it to 28 or narrow the data"),
    ([TRANSFORMER, "--config.model.transformer.pos_encoding=learned",
      "--config.model.transformer.max_tgt_len=16", "--config.data.length_multiple=8"],
     "model.transformer.max_tgt_len=16 is below the widest target batch, 32 tokens "
     "(data.max_tgt_len=28 rounded up to a multiple of data.length_multiple=8)"),
    (["--config.model.rnn.score=location", "--config.model.max_src_len=8"],
     "model.max_src_len=8 is below the widest source batch, 16 tokens (data.max_src_len=16): "
     "with model.rnn.score='location' the model"),
])
def test_command_line_mistakes_are_one_line(tmp_path, args, expect):
  config = [a for a in args if a.startswith("--config=")] or [SMOKE]
  p = _cli(*config, f"--workdir={tmp_path / 'wd'}", *[a for a in args if a not in config])
  assert p.returncode == 2
  assert expect in _one_error_line(p)
  assert not (tmp_path / "wd").exists()  # refused before the workdir was touched


@pytest.mark.parametrize("make,expect", [
    (lambda d: (d / "f").write_text("x") and d / "f", "is not a directory"),
    (lambda d: "/proc/1", "is not writable"),
    (lambda d: (d / "f").write_text("x") and d / "f" / "sub", "cannot create workdir"),
])
def test_unusable_workdirs_are_one_line(tmp_path, make, expect):
  wd = make(tmp_path)
  p = _cli(SMOKE, f"--workdir={wd}")
  assert p.returncode == 2 and expect in _one_error_line(p)


def test_only_user_mistakes_become_one_line_a_bug_keeps_its_traceback(monkeypatch, capsys):
  from attn.errors import ConfigError
  from attn.launching import cli
  monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)  # cli.run installs its own
  monkeypatch.setattr(cli.app, "run", lambda main, flags_parser=None: main(["prog"]))

  def mistake(argv):
    raise ConfigError("train.steps=0 must be >= 1")

  def bug(argv):
    raise KeyError("a genuine bug")

  with pytest.raises(SystemExit) as e:
    cli.run(mistake)
  assert e.value.code == 2 and capsys.readouterr().err == "error: train.steps=0 must be >= 1\n"
  with pytest.raises(KeyError, match="a genuine bug"):  # not caught, not shortened
    cli.run(bug)
