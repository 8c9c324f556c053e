"""The fast paths of decoding give the outputs of the plain ones, and the decoding benchmark
(python -m experiments.bench_decode) reports them, or refuses in one line."""

import functools
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attn import decoding as decode
from attn.benchmarks import decode_speed
from attn import apps, training
from attn.errors import ConfigError
from attn.training import building, evaluation
from attn.apps.translate.task import TranslationTask
from experiments.configs import caption as caption_config
from tests.test_decode import edge_case_table, random_table, toy_init, toy_step

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def copying_step(step_fn):
  """step_fn whose every state leaf is a new array: beam search then reorders all of them (what
  it did for every leaf before it learned to skip the ones a step hands back untouched)."""
  def step(state, y_prev):
    new, *rest = step_fn(state, y_prev)
    return (jax.tree.map(jnp.copy, new), *rest)
  return step


def memory_step(step_fn):
  """The toy's step with an encoder-memory-like leaf [B, 7, 11] it reads and hands back as is."""
  def step(state, y_prev):
    inner = {k: v for k, v in state.items() if k != "memory"}
    new, logp, w = step_fn(inner, y_prev)
    return {**new, "memory": state["memory"]}, logp + 0.0 * state["memory"][:, :1, 0], w
  return step


def test_beam_search_does_not_reorder_a_leaf_the_step_hands_back():
  """The [B*K, 7, 11] memory is never gathered inside the loop (it was, at every step)."""
  B, K = 2, 3
  init = {**toy_init(np.array([0, 1])), "memory": jnp.ones((B, 7, 11))}
  search = lambda table, state: decode.beam_search(memory_step(toy_step(table)), state, B, 4,
                                                   beam_size=K)
  jaxpr = jax.make_jaxpr(search)(jnp.asarray(random_table(0)), init)
  body = next(e for e in jaxpr.jaxpr.eqns if e.primitive.name == "while").params["body_jaxpr"]
  shapes = [v.aval.shape for e in body.jaxpr.eqns if e.primitive.name == "gather"
            for v in e.outvars]
  assert (B * K, 7, 11) not in shapes
  assert (B * K,) in shapes  # the toy's code, which each step changes, is still reordered


@pytest.mark.parametrize("seed,K,alpha", [(0, 2, 0.6), (1, 3, 1.0)])
def test_skipping_untouched_leaves_and_weights_keeps_every_output(seed, K, alpha):
  """Against the search that reorders every leaf: the same tokens, lengths, scores, weights and
  K-best list; keep_weights=False gives the same again without the weights."""
  table = jnp.asarray(edge_case_table(seed) if seed % 2 else random_table(seed, eos_bias=0.3))
  ex = np.array([0, 1, 2], np.int32)
  init = {**toy_init(ex), "memory": jnp.arange(3 * 7 * 11, dtype=jnp.float32).reshape(3, 7, 11)}
  run = lambda wrap, keep: jax.jit(lambda tb, s: decode.beam_search(
      wrap(memory_step(toy_step(tb))), s, 3, 5, beam_size=K, length_penalty=alpha,
      keep_weights=keep))(table, init)
  ref, fast, light = run(copying_step, True), run(lambda f: f, True), run(lambda f: f, False)
  for name in ("tokens", "lengths", "scores", "weights"):
    np.testing.assert_array_equal(getattr(fast, name), getattr(ref, name), err_msg=name)
  for name in ("tokens", "lengths", "log_probs", "scores", "valid"):
    np.testing.assert_array_equal(getattr(fast.nbest, name), getattr(ref.nbest, name))
    np.testing.assert_array_equal(getattr(light.nbest, name), getattr(ref.nbest, name))
  assert light.weights.shape == (3, 5, 0) and light.nbest.weights.shape == (3, K, 5, 0)
  greedy = lambda keep: jax.jit(lambda tb: decode.greedy_decode(
      toy_step(tb), toy_init(ex), 3, 5, keep_weights=keep))(table)
  g, g_light = greedy(True), greedy(False)
  for name in ("tokens", "lengths", "scores"):
    np.testing.assert_array_equal(getattr(g_light, name), getattr(g, name), err_msg=name)
  assert g_light.weights.shape == (3, 5, 0)


def test_no_weights_and_a_coverage_penalty_are_refused():
  with pytest.raises(ValueError, match="keep_weights=True"):
    decode.beam_search(toy_step(jnp.asarray(random_table(0))), toy_init(np.array([0])), 1, 3,
                       beam_size=2, coverage_penalty=0.2, source_lengths=jnp.array([3]),
                       keep_weights=False)


def test_a_real_model_decodes_the_same_tokens_on_the_fast_path(smoke_bahdanau_workdir):
  """A trained (smoke) RNN with attention, float32: beam 3 gives the same tokens, scores and
  weights as the search that reorders every state leaf, and without the attention history, or
  with finished examples leaving the batch (shrink_to), the same tokens and scores."""
  run = building.load_run(smoke_bahdanau_workdir)
  graphdef, params = evaluation.params_view(run)
  batch = evaluation.decode_inputs(next(run.bundle.batches("test")))
  B = batch["src"].shape[0]

  @functools.partial(jax.jit, static_argnames=("copy", "keep", "shrink"))
  def search(params, src, src_lengths, *, copy, keep, shrink=0):
    model = nnx.merge(graphdef, params)
    init = model.initial_decode_state(src, src_lengths, max_len=12)
    step = copying_step(model.step_fn()) if copy else model.step_fn()
    return decode.beam_search(step, init, B, 12, beam_size=3, keep_weights=keep,
                              shrink_to=shrink)

  args = (params, batch["src"], batch["src_lengths"])
  ref = search(*args, copy=True, keep=True)
  fast, light = search(*args, copy=False, keep=True), search(*args, copy=False, keep=False)
  assert B >= 4
  shrunk = search(*args, copy=False, keep=True, shrink=B // 4)
  np.testing.assert_array_equal(shrunk.nbest.tokens, fast.nbest.tokens)
  np.testing.assert_array_equal(shrunk.nbest.weights, fast.nbest.weights)
  for out in (fast, light, shrunk):
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_array_equal(out.scores, ref.scores)
  np.testing.assert_array_equal(fast.weights, ref.weights)


def test_a_real_model_decodes_greedily_the_same_with_a_shrinking_batch(smoke_bahdanau_workdir):
  """Greedy with finished rows leaving the batch (shrink_to, run as a one-beam search) gives
  the trained RNN's greedy tokens, lengths, attention and scores."""
  run = building.load_run(smoke_bahdanau_workdir)
  graphdef, params = evaluation.params_view(run)
  batch = evaluation.decode_inputs(next(run.bundle.batches("test")))
  B = batch["src"].shape[0]

  @functools.partial(jax.jit, static_argnames=("shrink",))
  def greedy(params, src, src_lengths, *, shrink):
    model = nnx.merge(graphdef, params)
    init = model.initial_decode_state(src, src_lengths, max_len=12)
    return decode.greedy_decode(model.step_fn(), init, B, 12, shrink_to=shrink)

  args = (params, batch["src"], batch["src_lengths"])
  plain, shrunk = greedy(*args, shrink=0), greedy(*args, shrink=B // 4)
  for name in ("tokens", "lengths", "weights"):
    np.testing.assert_array_equal(getattr(shrunk, name), getattr(plain, name), err_msg=name)
  np.testing.assert_allclose(shrunk.scores, plain.scores, rtol=1e-5, atol=1e-5)


def test_bench_decode_times_each_beam_size_and_scores_like_the_run(smoke_bahdanau_workdir,
                                                                  tmp_path):
  out = tmp_path / "speed.json"
  s = decode_speed.Settings(workdir=smoke_bahdanau_workdir, beam_sizes=(1, 2),
                            json_out=str(out), shrink_to=2, stops=("run", "k_finished"),
                            ceiling_sizes=(128,))
  record = decode_speed.run(s)
  assert json.loads(out.read_text()) == json.loads(json.dumps(record))
  with open(os.path.join(smoke_bahdanau_workdir, "results.json")) as f:
    results = json.load(f)
  assert results["beam_size"] == 1
  assert record["sentences"] == len(building.load_run(smoke_bahdanau_workdir).bundle.references())
  # greedy once; beam 2 with the run's stop rule (bound) and with k_finished
  assert [(r["beam_size"], r["stop"]) for r in record["results"]] == [
      (1, "bound"), (2, "bound"), (2, "k_finished")]
  greedy = record["results"][0]
  # the task's own score, named by the record: BLEU for a translate run
  assert (record["application"], record["score"]) == ("translate", "bleu")
  assert greedy["bleu"] == pytest.approx(results["bleu"])  # the run's own test decoding
  for r in record["results"]:
    assert r["decode_s"] > 0 and r["compile_s"] >= 0
    assert r["sentences_per_s"] == pytest.approx(record["sentences"] / r["decode_s"])
    assert r["words_per_s"] == pytest.approx(r["mean_words"] * r["sentences_per_s"])
    # the matmul work along the outputs (test_output_work_...), beam 2 twice greedy's at least
    assert r["matmul_gflop_per_s"] == pytest.approx(r["matmul_gflop"] / r["decode_s"])
    assert r["percent_of_ceiling"] == pytest.approx(
        100 * r["matmul_gflop_per_s"] / record["ceiling_gflop_per_s"]["best"])
  assert record["results"][1]["matmul_gflop"] > 1.5 * greedy["matmul_gflop"] > 0
  assert record["ceiling_gflop_per_s"]["dtype"] == "float32"
  assert len(record["ceiling_gflop_per_s"]["128"]) == 2  # before the timed passes and after
  run = building.load_run(smoke_bahdanau_workdir)
  texts = evaluation.decode_split(run, "test", search=run.tc.search()).text
  assert greedy["mean_words"] == pytest.approx(
      np.mean([len(t.split()) for t in texts.values()]))
  assert set(record["load"]) == {"start", "end"} and record["shrink_to"] == 2
  # The step alone, on the split's first batch at each beam size's rows: its traced matmuls
  # (K times greedy's at K times the rows) and their rate against the same ceiling.
  first = next(iter(run.bundle.batches("test")))
  for r in record["results"]:
    alone = r["step_alone"]
    assert alone["rows"] == first["src"].shape[0] * r["beam_size"]
    assert alone["source_width"] == first["src"].shape[1] and alone["steps"] == 20
    assert alone["step_ms"] > 0
    assert alone["step_gflop_per_s"] == pytest.approx(alone["step_gflop"] / alone["step_ms"] * 1e3)
    assert alone["percent_of_ceiling"] == pytest.approx(
        100 * alone["step_gflop_per_s"] / record["ceiling_gflop_per_s"]["best"])
  assert record["results"][1]["step_alone"]["step_gflop"] == pytest.approx(
      2 * greedy["step_alone"]["step_gflop"], rel=0.01)


def test_the_step_alone_counts_the_traced_step_and_can_be_left_out(smoke_bahdanau_workdir):
  """step_alone's matmul work is the traced step's at its rows (the model's own step function,
  as the search calls it); --step_steps=0 times no step."""
  from attn.models import cost
  run = building.load_run(smoke_bahdanau_workdir)
  batch = next(iter(run.bundle.batches("test")))
  alone = decode_speed.step_alone(run, batch, 3, steps=4)
  src = jnp.repeat(jnp.asarray(batch["src"]), 3, axis=0)
  lengths = jnp.repeat(jnp.asarray(batch["src_lengths"]), 3, axis=0)
  state = run.model.initial_decode_state(src, lengths)
  want = cost.jaxpr_flops(run.model.step_fn(), state, jnp.full((src.shape[0],), 1, jnp.int32))
  assert alone["step_gflop"] == pytest.approx(want / 1e9)
  assert (alone["rows"], alone["steps"]) == (src.shape[0], 4)
  s = decode_speed.Settings(workdir=smoke_bahdanau_workdir, beam_sizes=(1,), step_steps=0,
                            ceiling_sizes=(128,))
  assert decode_speed.run(s)["results"][0]["step_alone"] is None


@pytest.fixture(scope="module")
def tiny_caption_workdir(tmp_path_factory):
  """A finished caption run of the tiny preset, two steps (what it learns does not matter)."""
  workdir = str(tmp_path_factory.mktemp("tiny_caption"))
  config = caption_config.get_config("tiny")
  config.train.update(dict(steps=2, eval_every=2, checkpoint_every=2, log_every=1,
                           attention_samples=1))
  training.train_and_evaluate(config, workdir, task="caption")
  return workdir


def test_bench_decode_scores_a_caption_run_by_its_tasks_own_score(tiny_caption_workdir,
                                                                  tmp_path):
  """A caption run is timed and scored by its task's first score (digit accuracy), the number
  its results.json holds, never by BLEU (it ended in KeyError: 'bleu')."""
  out = tmp_path / "speed.json"
  record = decode_speed.run(decode_speed.Settings(workdir=tiny_caption_workdir, beam_sizes=(1,),
                                                  json_out=str(out), ceiling_sizes=()))
  assert json.loads(out.read_text()) == json.loads(json.dumps(record))
  with open(os.path.join(tiny_caption_workdir, "results.json")) as f:
    results = json.load(f)
  own = apps.app("caption").task_class.scores[0]
  assert (record["application"], record["score"]) == ("caption", own)
  [greedy] = record["results"]
  assert results["beam_size"] == 1 and "bleu" not in greedy
  assert greedy[own] == pytest.approx(results[own])
  assert greedy["decode_s"] > 0 and record["sentences"] == 64
  # the captioner's image encoder has no analytic count; no ceiling was asked for
  assert greedy["matmul_gflop"] is None and record["ceiling_gflop_per_s"]["best"] is None


class _Scored(TranslationTask):
  """A task registered later, a sequence-to-sequence task with a first score of its own (the
  exact match of translation under another name): whether it decodes is what its class is, not
  its name."""
  scores = ("later_score",) + TranslationTask.scores
  metrics = ("later_score",)
  columns = ("later_score",)

  def score(self, bundle, role, hyps, src_lengths):
    scored = super().score(bundle, role, hyps, src_lengths)
    return {"later_score": scored["exact_match"], **scored}

  def selection_metrics(self, bundle):
    return ("later_score",)


@pytest.fixture
def later_applications():
  ranking = apps.app("recommend").task_class
  apps.APPS.add("later_seq2seq", apps.App("experiments.translate", "decodes", task=_Scored))
  apps.APPS.add("later_ranking", apps.App("experiments.recommend", "ranks", task=ranking))
  yield
  apps.APPS.remove("later_seq2seq")
  apps.APPS.remove("later_ranking")


def test_the_applications_bench_decode_reads_are_those_whose_task_decodes(later_applications):
  decoding = decode_speed.decoding_applications()
  assert {"translate", "summarize", "caption", "later_seq2seq"} <= set(decoding)
  assert not {"recommend", "retrieve", "focus", "later_ranking"} & set(decoding)


@pytest.mark.parametrize("name,records", [
    ("recommend", {"application.json": {"application": "recommend"}}),
    ("retrieve", {"retrieve.json": {}, "model.json": {}}),
    ("focus", {"focus.json": {}}),
    ("later_ranking", {"application.json": {"application": "later_ranking"}}),
])
def test_a_run_whose_task_decodes_nothing_is_refused_before_any_work(
    tmp_path, monkeypatch, later_applications, name, records):
  for file, record in records.items():
    (tmp_path / file).write_text(json.dumps(record))

  def no_work(*a, **k):
    raise AssertionError("worked before refusing")
  monkeypatch.setattr(decode_speed.harness, "machine", no_work)
  monkeypatch.setattr(building, "load_run", no_work)
  with pytest.raises(ConfigError) as e:
    decode_speed.run(decode_speed.Settings(workdir=str(tmp_path)))
  message = str(e.value)
  assert "\n" not in message
  assert message.startswith(f"{tmp_path} holds a {name} run, whose task decodes nothing: "
                            "bench_decode times a run's decoding of its split and reads")
  assert message.endswith("of an application whose task decodes (caption, later_seq2seq, "
                          "summarize, translate)")


def _finished(path, results, config=None):
  """A workdir whose records say a run of some experiment finished (no checkpoint)."""
  (path / "results.json").write_text(json.dumps(results))
  if config is not None:
    (path / "config.json").write_text(json.dumps(config.to_dict(), default=list))
  return str(path)


@pytest.mark.parametrize("make,says", [
    (lambda p: str(p / "absent"), "is not a directory"),
    (lambda p: str(p), "has no config.json: not a finished run"),
    # a recommend run decodes nothing; a caption run is read with its own task's data settings
    (lambda p: _finished(p, {"hr10": 0.5, "ndcg10": 0.3}), "holds a recommend run, whose task "
                                                         "decodes nothing"),
    (lambda p: _finished(p, {"digit_accuracy": 1.0, "exact_match": 1.0},
                         caption_config.get_config("tiny")), "holds no checkpoint to restore"),
])
def test_bench_decode_refuses_a_missing_or_unfinished_run_in_one_line(tmp_path, make, says):
  workdir = make(tmp_path)
  json_out = tmp_path / "out.json"
  done = subprocess.run([sys.executable, "-m", "experiments.bench_decode",
                         f"--workdir={workdir}", f"--json_out={json_out}"],
                        cwd=REPO, capture_output=True, text=True, check=False)
  assert done.returncode == 2, done.stderr
  lines = done.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], lines
  assert not json_out.exists()


def test_evaluation_during_training_decodes_without_attention(smoke_bahdanau_workdir,
                                                             monkeypatch):
  """The evaluations' greedy decoding scores text only: its search keeps no attention history,
  and it scores what the run's own evaluation of that checkpoint scored."""
  run = building.load_run(smoke_bahdanau_workdir)
  seen, real = [], evaluation.decode_split
  monkeypatch.setattr(evaluation, "decode_split",
                      lambda *a, search, **kw: seen.append(search) or real(*a, search=search, **kw))
  ev = evaluation.evaluate(run, "eval", run.tc.eval_decode_sentences)
  assert [(s.beam_size, s.attention) for s in seen] == [(1, False)]
  with open(os.path.join(smoke_bahdanau_workdir, "results.json")) as f:
    best = json.load(f)["best_eval"]
  assert ev["bleu"] == pytest.approx(best["bleu"]) and ev["nll"] == pytest.approx(best["nll"])


def test_a_run_records_what_each_evaluation_cost(smoke_bahdanau_workdir):
  """metrics.jsonl's eval rows carry eval_s, and results.json their sum (the run's wall_s leaves
  the evaluations out)."""
  with open(os.path.join(smoke_bahdanau_workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  evals = [r["eval_s"] for r in rows if r["split"] == "eval"]
  assert evals and all(s > 0 for s in evals)
  with open(os.path.join(smoke_bahdanau_workdir, "results.json")) as f:
    assert json.load(f)["eval_s"] == pytest.approx(sum(evals))


def test_first_argmax_is_jnp_argmax_and_its_value():
  """Ties go to the lowest index, a NaN wins as in jnp.argmax, -inf rows give index 0."""
  from attn.decoding.greedy import first_argmax  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(0)
  x = rng.integers(-3, 1, (64, 9)).astype(np.float32)  # many ties
  x[1, 4] = np.nan
  x[2, [3, 6]] = np.nan
  x[3] = -np.inf
  tok, val = jax.jit(first_argmax)(jnp.asarray(x))
  ref = np.asarray(jnp.argmax(jnp.asarray(x), -1))
  np.testing.assert_array_equal(tok, ref)
  np.testing.assert_array_equal(val, x[np.arange(64), ref])


@pytest.mark.parametrize("field,value,says", [
    ("shrink_to", -1, "--shrink_to must be >= 0, got -1"),
    ("step_steps", -1, "--step_steps must be >= 0, got -1"),
    ("beam_sizes", (0,), "--beam_sizes must be integers >= 1"),
    ("rounds", 0, "--rounds must be >= 1"),
    ("ceiling_sizes", (1024, 0), r"--ceiling_sizes must be integers >= 1, got \[1024, 0\]"),
    ("split", "train", "--split must be test or eval"),
    ("stops", ("bound", "soon"), "--stops=bound,soon: each must be one of run, bound, "
                                 "k_finished"),
])
def test_bench_decode_settings_refuse_bad_values(field, value, says):
  with pytest.raises(ConfigError, match=says):
    decode_speed.Settings(workdir="w", **{field: value})


@pytest.mark.parametrize("where, says", [
    ("missing/out.json", "no directory .*missing to write it in"),
    (".", "is a directory; name the file to write"),
])
def test_bench_decode_refuses_a_json_out_it_cannot_write_before_running(tmp_path, where, says):
  """The record is written after the whole benchmark: a path it cannot be written to is one
  `error:` line before anything runs (the workdir is not even looked at)."""
  json_out = tmp_path / where
  with pytest.raises(ConfigError, match=f"--json_out={json_out}: {says}"):
    decode_speed.Settings(workdir="w", json_out=str(json_out))
  done = subprocess.run([sys.executable, "-m", "experiments.bench_decode",
                         f"--workdir={tmp_path / 'no_such_run'}", f"--json_out={json_out}"],
                        cwd=REPO, capture_output=True, text=True, check=False)
  assert done.returncode == 2, done.stderr
  lines = done.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: --json_out=") and says.split()[-1] in \
      lines[0], lines
  assert decode_speed.Settings(workdir="w", json_out=str(tmp_path / "out.json")).json_out


@pytest.mark.parametrize("decoder", ["none", "bahdanau", "luong"])
def test_output_work_is_the_traced_encoder_once_and_k_decoder_steps_per_token(decoder):
  """bench_decode's matmul work along the outputs against the dot_generals of the traced model:
  per example its encoder over the source once, and K rows of its decoding step for each token of
  its output. Within 2%, as the train step's count (the analytic count leaves out the bridge to
  the decoder's first state and counts the additive score's per-pair add, which is no matmul);
  padding rows count nothing."""
  from types import SimpleNamespace
  from attn.models import cost
  from attn.models.seq2seq import build_model
  from tests.model_configs import model_config
  mc = model_config(src_vocab=23, tgt_vocab=19, emb_dim=8, enc_hidden=12, dec_hidden=10,
                    d_attn=9, dropout=0.0, decoder=decoder)
  model = build_model(mc)
  run = SimpleNamespace(mc=mc, model=model)
  batch = {"example_id": np.array([0, 1, -1]), "src_lengths": np.array([3, 6, 2])}
  outputs = SimpleNamespace(lengths=np.array([9, 5, 7]))
  for K in (1, 3):
    traced = 0
    for ts, tt in ((3, 9), (6, 5)):
      src, lengths = jnp.full((1, ts), 5, jnp.int32), jnp.array([ts], jnp.int32)
      traced += cost.jaxpr_flops(model.initial_decode_state, src, lengths)
      state = model.initial_decode_state(src, lengths)
      traced += K * tt * cost.jaxpr_flops(model.step_fn(), state, jnp.array([5], jnp.int32))
    assert decode_speed.output_work(run, [(batch, outputs)], K) == pytest.approx(traced, rel=0.02)
  # a model that is not its architecture's own (the captioner's) is not counted
  assert decode_speed.output_work(SimpleNamespace(mc=mc, model=object()), [], 1) is None


def test_work_figures_are_the_rate_its_share_of_the_ceiling_and_the_time_at_it():
  figures = decode_speed.work_figures(int(300e9), 3.0, 200.0)
  assert figures == pytest.approx({"matmul_gflop": 300.0, "matmul_gflop_per_s": 100.0,
                                   "percent_of_ceiling": 50.0, "decode_s_at_ceiling": 1.5})
  assert decode_speed.work_figures(int(300e9), 3.0, None)["percent_of_ceiling"] is None
  assert set(decode_speed.work_figures(None, 3.0, 200.0).values()) == {None}
