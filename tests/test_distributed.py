"""Data parallel training over several devices and processes (attn.training.distributed), run for
real: `python -m experiments.translate` in subprocesses with 4 CPU devices
(--xla_force_host_platform_device_count), 1 device, and two processes joined by jax.distributed
over 127.0.0.1. The same seed and global batch must give the same loss curve (to float32
round-off: only the order of the sums differs), checkpoints must restore across device counts,
and a two-process run must write its metrics and results once.

Every scenario runs once (the `runs` fixture) and is checked by its own test. The runs share a
persistent compilation cache, run side by side where independent and compile without backend
optimization: the module takes 55-70 s on this 2-core machine (shared with other jobs).
"""

import json
import os
import socket
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attn.errors import ConfigError
from attn.training import distributed

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Constant learning rate after one warm-up step, so a 3-step run resumed to 6 steps follows the
# 6-step run exactly (a cosine schedule would depend on train.steps); one bucket, small eval and
# test splits, dropout on (its masks must not depend on the sharding).
ARGS = ["--config=experiments/configs/translate.py:smoke", "--config.train.log_every=1",
        "--config.train.eval_every=100", "--config.train.checkpoint_every=3",
        "--config.train.schedule=constant", "--config.train.warmup_steps=1",
        "--config.train.eval_decode_sentences=8", "--config.data.num_buckets=1",
        "--config.data.eval_size=16", "--config.data.test_size=16", "--config.model.dropout=0.1"]
RTOL = 1e-5


def _env(devices: int, cache: str | None = None) -> dict:
  # Backend optimization off: a third less compile time, and what is tested (shardings,
  # resharding restores, processes) does not depend on it; every run uses the same flags.
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=f"--xla_force_host_platform_device_count={devices} "
                       "--xla_backend_optimization_level=0")
  if cache:  # the runs compile the same programs: compile each once
    env.update(JAX_COMPILATION_CACHE_DIR=cache, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
               JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
  return env


def _start(workdir, devices, steps, cache, *extra):
  cmd = [sys.executable, "-m", "experiments.translate", *ARGS, f"--workdir={workdir}",
         f"--config.train.steps={steps}", *extra]
  return subprocess.Popen(cmd, cwd=REPO, env=_env(devices, cache), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)


def _finish(p, timeout=400):
  out, err = p.communicate(timeout=timeout)
  assert p.returncode == 0, err[-4000:]
  return out, err


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _rows(workdir, split="train"):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [r for r in map(json.loads, f) if r["split"] == split]


def _curve(workdir, key="loss"):
  """{step: value} of the train rows; asserts that no step is written twice."""
  rows = _rows(workdir)
  steps = [r["step"] for r in rows]
  assert len(steps) == len(set(steps)), f"duplicated steps in {workdir}: {steps}"
  return {r["step"]: r[key] for r in rows}


def _eval_at(workdir, step):
  return next(r for r in _rows(workdir, "eval") if r["step"] == step)


def _same_curve(got, want, steps):
  for key in ("loss", "grad_norm", "param_norm"):
    g, w = _curve(got, key), _curve(want, key)
    assert set(steps) <= set(g), (key, sorted(g))
    np.testing.assert_allclose([g[s] for s in steps], [w[s] for s in steps], rtol=RTOL,
                               err_msg=f"{key}: {got} vs {want}")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """Every scenario, run once:
  a: 1 device, 6 steps (the reference);
  b: 4 devices as data 2 x model 2 (the vocabulary matrices split), 3 steps, then resumed on 1
     device to 6;
  d: 1 device, 3 steps, then resumed on 4 devices (all on the data axis) to 6;
  e: two processes x 2 devices, 6 steps.
  """
  root = tmp_path_factory.mktemp("dist")
  cache = str(root / "jax_cache")
  w = {k: str(root / k) for k in "abde"}
  port = _free_port()
  two = [_start(w["e"], 2, 6, cache, f"--coordinator_address=127.0.0.1:{port}",
                "--num_processes=2", f"--process_id={i}") for i in range(2)]
  # All at once where nothing depends on another run (the CPU is the limit, not the order); the
  # first wave fills the 1-device compilation cache that the resumed runs then hit.
  first = [_start(w["a"], 1, 6, cache),
           _start(w["b"], 4, 3, cache, "--config.train.mesh_shape=2,2")]
  for p in first:
    _finish(p)
  for p in [_start(w["b"], 1, 6, cache), _start(w["d"], 1, 3, cache)]:
    _finish(p)
  _finish(_start(w["d"], 4, 6, cache))
  return {**w, "e_out": [_finish(p) for p in two]}


# slow: real multi-device and multi-process runs (~60 s); the batch split, filler rows and mesh checks below pin their parts fast
@pytest.mark.slow
def test_four_devices_follow_the_one_device_loss_curve(runs):
  # b's steps 1-3 ran on a 2 x 2 mesh from the initialization, d's steps 4-6 on 4 data devices
  # after 3 steps on 1 (a resumed workdir's metrics keep the rows of the steps before it).
  _same_curve(runs["b"], runs["a"], range(1, 4))
  _same_curve(runs["d"], runs["a"], range(4, 7))


# slow: real multi-device and multi-process runs (~60 s); the batch split, filler rows and mesh checks below pin their parts fast
@pytest.mark.slow
def test_a_checkpoint_saved_on_four_devices_resumes_on_one(runs):
  _same_curve(runs["b"], runs["a"], range(1, 7))
  with open(os.path.join(runs["b"], "results.json")) as f:
    res = json.load(f)
  assert res["step"] == 6


# slow: real multi-device and multi-process runs (~60 s); the batch split, filler rows and mesh checks below pin their parts fast
@pytest.mark.slow
def test_a_checkpoint_saved_on_one_device_resumes_on_four(runs):
  _same_curve(runs["d"], runs["a"], range(1, 7))
  with open(os.path.join(runs["a"], "results.json")) as f, open(
      os.path.join(runs["d"], "results.json")) as g:
    a, d = json.load(f), json.load(g)
  assert d["step"] == 6 and d["params"] == a["params"]
  assert _eval_at(runs["d"], 6)["nll"] == pytest.approx(_eval_at(runs["a"], 6)["nll"], rel=RTOL)


# slow: real multi-device and multi-process runs (~60 s); the batch split, filler rows and mesh checks below pin their parts fast
@pytest.mark.slow
def test_two_processes_follow_the_one_process_curve_and_write_once(runs):
  _same_curve(runs["e"], runs["a"], range(1, 7))  # _curve also refuses duplicated steps
  assert [r["step"] for r in _rows(runs["e"], "eval")] == [6]
  (out0, err0), (out1, err1) = runs["e_out"]
  assert "| decoder |" in out0 and "| decoder |" not in out1  # the results table: process 0
  assert "step 6/6" in err0 and "step 6/6" not in err1  # progress: process 0 (others warn only)
  with open(os.path.join(runs["e"], "results.json")) as f, open(
      os.path.join(runs["a"], "results.json")) as g:
    e, a = json.load(f), json.load(g)
  assert e["step"] == 6 and e["best_eval"]["nll"] == pytest.approx(a["best_eval"]["nll"],
                                                                    rel=RTOL)
  assert e["bleu"] == pytest.approx(a["bleu"], abs=1e-6)  # the same decoded test split
  with open(os.path.join(runs["e"], "predictions.txt")) as f, open(
      os.path.join(runs["a"], "predictions.txt")) as g:
    assert len(f.read().splitlines()) == len(g.read().splitlines()) == 16
  assert not [n for n in os.listdir(runs["e"]) if n.startswith(".write_test")]


# ------------------------------------------------------------------------------ user mistakes

def test_a_bad_mesh_is_one_line_before_the_workdir_is_touched(tmp_path):
  cases = {"--config.train.mesh_shape=3": "asks for 3x1 = 3 devices, but 4 are present",
           "--config.train.mesh_shape=2x2": "must be one or two positive integers"}
  procs = {o: subprocess.Popen(
      [sys.executable, "-m", "experiments.translate", *ARGS, f"--workdir={tmp_path / str(i)}", o],
      cwd=REPO, env=_env(4), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
      for i, o in enumerate(cases)}
  for i, (override, p) in enumerate(procs.items()):
    _, err = p.communicate(timeout=120)
    errors = [l for l in err.splitlines() if l.startswith("error:")]
    assert p.returncode == 2 and len(errors) == 1 and "Traceback" not in err, err[-3000:]
    assert cases[override] in errors[0] and "train.mesh_shape=" in errors[0]
    assert not (tmp_path / str(i)).exists()


# ------------------------------------------------------------------------------ the pieces

def test_mesh_shape_parsing_and_the_device_count_check():
  assert distributed.parse_mesh_shape("") == ()
  assert distributed.parse_mesh_shape(" 4 ") == (4,)
  assert distributed.parse_mesh_shape("2,2") == (2, 2)
  for bad in ("a", "2.5", "1,2,3", "-1", "0", "2,"):
    with pytest.raises(ConfigError, match="train.mesh_shape"):
      distributed.parse_mesh_shape(bad)
  mesh = distributed.make_mesh("")
  assert dict(mesh.shape) == {"data": jax.device_count(), "model": 1}
  with pytest.raises(ConfigError, match=f"but {jax.device_count()} are present"):
    distributed.make_mesh(str(jax.device_count() + 1))


def test_a_batch_size_that_does_not_split_over_the_data_axis_is_refused():
  with pytest.raises(ConfigError, match=r"data.batch_size=6 does not divide over the 4 devices"):
    distributed.check_batch_rows(6, 0, 4, "")
  distributed.check_batch_rows(8, 0, 4, "")
  distributed.check_batch_rows(6, 300, 4, "")  # per-bucket sizes: completed with filler rows


def test_each_process_reads_its_blocks_of_the_global_batch_padded_with_filler_rows():
  rows = np.arange(10, 16)  # a global batch of 6 rows over a data axis of 4: padded to 8
  whole = distributed.RowShard(4, (0, 1, 2, 3))
  np.testing.assert_array_equal(whole.select(rows), [10, 11, 12, 13, 14, 15, -1, -1])
  np.testing.assert_array_equal(distributed.RowShard(4, (2, 3)).select(rows), [14, 15, -1, -1])
  np.testing.assert_array_equal(distributed.RowShard(2, (1,)).select(rows), [13, 14, 15])
  packed = np.array([[1, 2], [3, -1], [4, 5]])  # packed rows (data.pack): their examples
  np.testing.assert_array_equal(distributed.RowShard(4, (1, 3)).select(packed),
                                [[3, -1], [-1, -1]])
  local = {"src": np.arange(8)[:, None] * np.ones((1, 3), np.int32)}
  mesh = distributed.make_mesh("")
  out = distributed.global_batch(local, mesh, distributed.row_shard(mesh))
  np.testing.assert_array_equal(np.asarray(out["src"]), local["src"])


def test_filler_rows_change_neither_the_loss_nor_the_gradient():
  """What lets batches of tokens_per_batch sizes be completed to a multiple of the data axis."""
  from attn.models import ModelConfig
  from attn.training import task as task_lib
  from experiments.configs import translate as translate_config
  task = task_lib.get_task("translate")
  mc = ModelConfig.from_config(translate_config.get_config("smoke").model, src_vocab=20,
                               tgt_vocab=20)
  model = task.build_model(mc, seed=0)
  rng = np.random.default_rng(0)
  batch = {"src": rng.integers(3, 20, (3, 7)).astype(np.int32),
           "src_lengths": np.array([7, 5, 3], np.int32),
           "tgt": rng.integers(3, 20, (3, 6)).astype(np.int32),
           "tgt_lengths": np.array([6, 4, 2], np.int32)}
  padded = {k: np.concatenate([v, np.zeros((2,) + v.shape[1:], v.dtype)]) for k, v in batch.items()}

  graphdef, state = nnx.split(model)

  def mean_loss(m, b):
    total, ntok, _ = task.loss(m, b)
    return total / ntok

  @jax.jit
  def loss_and_grad(state, b):  # as the train step: jit over the split state
    return nnx.value_and_grad(mean_loss)(nnx.merge(graphdef, state), b)
  (l1, g1), (l2, g2) = loss_and_grad(state, batch), loss_and_grad(state, padded)
  assert float(l1) == pytest.approx(float(l2), rel=1e-6)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-8)
    assert jnp.isfinite(b).all()


def test_vocabulary_matrices_split_over_the_model_axis_when_it_divides():
  mesh = jax.make_mesh((1, 1), distributed.AXES,
                       axis_types=(jax.sharding.AxisType.Auto,) * 2)
  spec = lambda path, shape, m: distributed._leaf_spec(  # pylint: disable=protected-access
      path, shape, type("M", (), {"shape": {"data": 1, "model": m}})())
  P = jax.sharding.PartitionSpec
  assert spec("0/decoder/embed/embedding/value", (40, 16), 2) == P("model", None)
  assert spec("1/opt_state/0/mu/decoder/out/kernel/value", (16, 40), 4) == P(None, "model")
  assert spec("0/decoder/out/bias/value", (41,), 2) == P()  # 41 does not divide
  assert spec("0/decoder/readout/kernel/value", (64, 16), 2) == P()
  assert spec("0/decoder/embed/embedding/value", (40, 16), 1) == P()
  assert distributed.state_shardings({"w": np.zeros(3)}, mesh)["w"].spec == P()


# ------------------------------------------------------------------------------ --distributed=auto

_JOIN = """
import sys
from absl import flags
from attn.launching import cli
import jax
from jax.experimental import multihost_utils
cli.define_distributed_flags()
flags.FLAGS(sys.argv)
started = cli.start_distributed()
x = jax.numpy.ones(()) * (jax.process_index() + 1)
total = multihost_utils.process_allgather(x).sum()
print(started, jax.process_index(), jax.process_count(), float(total), flush=True)
jax.distributed.shutdown()
"""


def _slurm_port() -> int:
  """A free port in the range JAX's Slurm detection derives from the job id (61440-65535)."""
  for port in range(61440 + os.getpid() % 2048, 65536):
    with socket.socket() as s:
      try:
        s.bind(("127.0.0.1", port))
      except OSError:
        continue
      return port
  raise RuntimeError("no free port in 61440-65535")


def test_auto_joins_the_processes_a_slurm_job_describes():
  """`--distributed=auto` as `srun` would start it: two tasks whose only settings are Slurm's
  environment variables (job id, node list, task count and ids) join one jax.distributed run
  through JAX's Slurm detection. Slurm itself has never run it (docs/scale.md says so)."""
  port = _slurm_port()
  procs = []
  for rank in range(2):
    env = {k: v for k, v in _env(1).items() if not k.startswith(("SLURM_", "OMPI_", "TPU_"))}
    env.update(SLURM_JOB_ID=str(port - 61440), SLURM_STEP_NODELIST="localhost",
               SLURM_NTASKS="2", SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank),
               SLURM_STEP_NUM_NODES="1")
    procs.append(subprocess.Popen(
        [sys.executable, "-c", _JOIN, "join", "--distributed=auto"], cwd=REPO, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
  outs = [p.communicate(timeout=180) for p in procs]
  for p, (out, err) in zip(procs, outs):
    assert p.returncode == 0, err[-3000:]
  # each task knows its rank, both see two processes, and a collective spans them (1 + 2)
  assert sorted(out.splitlines()[-1].split() for out, _ in outs) == [["True", "0", "2", "3.0"],
                                                    ["True", "1", "2", "3.0"]]


def test_auto_outside_a_cluster_is_one_line_naming_the_explicit_flags():
  env = {k: v for k, v in _env(1).items() if not k.startswith(("SLURM_", "OMPI_", "TPU_"))}
  p = subprocess.run([sys.executable, "-c", _JOIN, "join", "--distributed=auto"], cwd=REPO,
                     env=env, capture_output=True, text=True, timeout=180)
  assert p.returncode != 0
  assert "--coordinator_address" in p.stderr and "Slurm or TPU-pod" in p.stderr
