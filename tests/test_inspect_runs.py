"""The look-inside tools on real finished runs that are not the translation demo: a tiny
pointer-generator summarization run (diagnose refuses it in one line; inspect names its own
experiment), read-only run directories (--out, refused before any work without it), tokens
with the word tokenizer's joiner in plots, and the metric names launch.py knows against what
runs really record."""

import json
import os
import shutil
import subprocess
import sys
import warnings

import pytest

from attn import training
from attn.data.tokenize import JOINER, word_tokenize
from attn.errors import DataError
from attn.common import plots
from attn.inspection import diagnosis_report, viewer
from attn.launching import entry_points
import test_summarize

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Runs `python -m MODULE ARGS...`. As root, chmod does not stop writes (root's os.access says
# yes to any mode), so there the tool's pre-check is shown the directory as any other user would
# see it: os.access answers from the mode bits. The writes themselves stay real.
AS_USER = """
import os, runpy, sys
if os.geteuid() == 0:
  real = os.access
  def access(path, mode, **kw):
    if mode & os.W_OK and not os.stat(path).st_mode & 0o222:
      return False
    return real(path, mode, **kw)
  os.access = access
sys.argv = sys.argv[1:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


def run_tool(module, *args):
  return subprocess.run([sys.executable, "-c", AS_USER, module, *args], cwd=REPO,
                        capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def pointer_run(tmp_path_factory):
  """A finished pointer-generator summarization run (4 steps on the copy task of
  tests/test_summarize.py, greedy decoding: one decoder to compile; what it learned does not
  matter here). ~25 s, shared by three tests: the only real run of its kind in this file."""
  root = tmp_path_factory.mktemp("pointer")
  test_summarize._code_task(root / "data", n_train=60, n_dev=8)  # pylint: disable=protected-access
  config = test_summarize._config(root / "data", True, steps=4, eval_every=4,  # pylint: disable=protected-access
                                  checkpoint_every=4, log_every=4, eval_decode_sentences=8,
                                  beam_size=1)
  workdir = str(root / "run")
  training.train_and_evaluate(config, workdir, task="summarize")
  return workdir


def _snapshot(directory):
  """{relative path: (size, mtime)} of everything under `directory`."""
  out = {}
  for root, _, names in os.walk(directory):
    for n in names:
      st = os.stat(os.path.join(root, n))
      out[os.path.relpath(os.path.join(root, n), directory)] = (st.st_size, st.st_mtime_ns)
  return out


def _read_only_copy(src, dst):
  shutil.copytree(src, dst)
  for root, dirs, names in os.walk(dst):
    for n in dirs + names:
      os.chmod(os.path.join(root, n), 0o555 if n in dirs else 0o444)
  os.chmod(dst, 0o555)
  return str(dst)


def test_diagnose_refuses_a_pointer_generator_in_one_line(pointer_run):
  # Before: a ValueError traceback from the decoder (no src_ext), after loading the run.
  before = _snapshot(pointer_run)
  p = run_tool("experiments.diagnose", f"--workdir={pointer_run}", "--max_examples=2")
  lines = p.stderr.strip().splitlines()
  assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-3000:]
  assert lines[-1] == (
      f"error: {pointer_run}: a pointer-generator run (model.rnn.pointer=True) cannot be "
      "diagnosed: its output also copies the attention weights (p_gen mixes them in), and the "
      "diagnosis explains the vocabulary distribution alone; `python -m experiments.inspect` "
      "shows its attention")
  assert _snapshot(pointer_run) == before  # nothing written


def test_inspect_names_the_runs_own_experiment(pointer_run, smoke_bahdanau_workdir, tmp_path):
  # Before: "rerun experiments.translate" for every run, a summarization run included.
  for src, module in ((pointer_run, "experiments.summarize"),
                      (smoke_bahdanau_workdir, "experiments.translate")):
    run = tmp_path / module
    shutil.copytree(src, run, ignore=shutil.ignore_patterns("data_cache", "checkpoints", "best"))
    os.remove(run / "attention.npz")
    with pytest.raises(DataError) as e:
      viewer.load_run(str(run))
    assert str(e.value) == (f"{run}: no attention.npz (the run has not finished evaluating): "
                            f"run `python -m {module} --workdir={run} --config=...` with the "
                            "run's config to finish it")
    os.remove(run / "results.json")  # then the scores of its first evaluation say it
    assert entry_points.experiment_of(str(run)) == module.split(".")[1]


def test_the_known_metrics_cover_what_runs_record(pointer_run, smoke_bahdanau_workdir):
  for workdir, name in ((pointer_run, "summarize"), (smoke_bahdanau_workdir, "translate")):
    with open(os.path.join(workdir, "results.json")) as f:
      res = json.load(f)
    numeric = {k for k, v in res.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    known = set(entry_points.EXPERIMENTS.get(name).known_metrics)
    assert numeric <= known, numeric - known
    assert set(entry_points.metrics(name)) <= set(res)  # the default columns are all filled


@pytest.mark.parametrize("tool", ["experiments.inspect", "experiments.diagnose"])
def test_a_read_only_run_is_refused_before_any_work_and_written_elsewhere_with_out(
    tool, smoke_bahdanau_workdir, tmp_path):
  # Before: an OSError traceback at the end (diagnose after computing everything); no --out.
  run = _read_only_copy(smoke_bahdanau_workdir, tmp_path / "archived")
  before = _snapshot(run)
  # diagnose with --out runs for real (~20 s): the end-to-end proof that loading and diagnosing
  # a read-only run writes nothing into it
  args = [f"--workdir={run}"] + (["--max_examples=2", "--interventions=uniform"]
                                 if tool.endswith("diagnose") else [])
  p = run_tool(tool, *args)
  lines = p.stderr.strip().splitlines()
  assert p.returncode == 2 and len(lines) == 1, p.stderr[-3000:]
  what = "inspect.html" if tool.endswith("inspect") else "diagnose.json and its plots"
  assert lines[0] == (f"error: cannot write {what} into the run directory ({run} is not "
                      "writable; an archived run, or someone else's?): pass --out=DIR to write "
                      "them elsewhere")
  # (one line: loading the run would have logged its data splits first)
  out = tmp_path / "mine" / "diag"
  p = run_tool(tool, *args, f"--out={out}" if tool.endswith("diagnose") else f"--out={out}.html")
  assert p.returncode == 0, p.stderr[-3000:]
  if tool.endswith("diagnose"):
    written = {"diagnose.json", *diagnosis_report.PLOTS}
    assert set(os.listdir(out)) == written
  else:
    assert os.path.getsize(f"{out}.html") > 1000
  assert _snapshot(run) == before  # the run directory is untouched
  p = run_tool(tool, *args, f"--out={run}/sub")
  assert p.returncode == 2
  assert p.stderr.strip() == f"error: --out={run}/sub: {run} is not writable"


def test_heatmap_labels_show_tokens_without_the_joiner(tmp_path, monkeypatch):
  # Before: matplotlib warned "Glyph 65517 missing from font(s)" (twice per plot) and drew boxes.
  src = word_tokenize("Don't go, Mary: it's (very) late.") + ["</s>"]
  tgt = word_tokenize("it's late!") + ["</s>"]
  assert any(JOINER in t for t in src + tgt)
  plt = plots.pyplot()
  figures = []
  monkeypatch.setattr(plt, "close", figures.append)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    plots.heatmap([[1.0 / len(src)] * len(src)] * len(tgt), src, tgt, str(tmp_path / "a.png"))
  assert not [w for w in caught if "missing from" in str(w.message)], [str(w.message) for w in caught]
  ax = figures[0].axes[0]
  xs = [t.get_text() for t in ax.get_xticklabels()]
  ys = [t.get_text() for t in ax.get_yticklabels()]
  assert xs == ["Don", "'", "t", "go", ",", "Mary", ":", "it", "'", "s", "(", "very", ")", "late",
                ".", "</s>"]
  assert ys == ["it", "'", "s", "late", "!", "</s>"]
  assert (tmp_path / "a.png").stat().st_size > 1000
