"""The shared utilities (attn.common): atomic writes leave the old file or the new one and no
stray temporary file; the table formatter's cells; the jit cache compiles once per key."""

import json
import os
import stat

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attn.common import files, jitting, tables


def test_atomic_writes_replace_whole_files_readable_by_others(tmp_path):
  path = str(tmp_path / "results.json")
  files.write_json(path, {"bleu": 0.5})
  files.write_json(path, {"bleu": 0.75})
  assert json.load(open(path)) == {"bleu": 0.75}
  assert stat.S_IMODE(os.stat(path).st_mode) & 0o044  # not mkstemp's 0600
  assert os.listdir(tmp_path) == ["results.json"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
  path = str(tmp_path / "weights.npz")
  files.write_text(path, "old")
  with pytest.raises(RuntimeError):
    with files.atomic_path(path, suffix=".npz") as tmp:
      np.savez(tmp, w=np.ones(3))
      raise RuntimeError("killed mid-save")
  assert open(path).read() == "old" and os.listdir(tmp_path) == ["weights.npz"]
  with files.atomic_path(path, suffix=".npz") as tmp:
    np.savez(tmp, w=np.arange(3))
  np.testing.assert_array_equal(np.load(path)["w"], np.arange(3))


def test_markdown_table_formats_cells_and_refuses_ragged_rows():
  text = tables.markdown_table(["run", "params", "bleu", "ok"], [["a", 12345, 0.25, True],
                                                                 ["b", None, 1.0, False]])
  assert text.splitlines() == ["| run | params | bleu | ok |", "|---|---|---|---|",
                               "| a | 12,345 | 0.250 | True |", "| b |  | 1.000 | False |"]
  with pytest.raises(ValueError, match="2 cells under a header of 3"):
    tables.markdown_table(["a", "b", "c"], [[1, 2]])


def test_the_jit_cache_returns_one_function_per_key():
  def scale(x, *, k):
    return x * k

  f = jitting.jitted(scale, k=2.0)
  assert jitting.jitted(scale, k=2.0) is f and jitting.jitted(scale, k=3.0) is not f
  np.testing.assert_allclose(f(jnp.ones(2)), [2.0, 2.0])


def test_cpu_options_are_the_ones_this_jaxlib_knows_and_only_on_the_cpu(monkeypatch):
  assert jitting.cpu_options(jitting.XLA_REDUCTIONS) == jitting.XLA_REDUCTIONS
  assert jitting.cpu_options({"xla_cpu_no_such_option_anywhere": True}) is None
  f = jax.jit(lambda x: jnp.sum(x * x, axis=-1),
              compiler_options=jitting.cpu_options(jitting.XLA_REDUCTIONS))
  x = np.arange(12.0, dtype=np.float32).reshape(3, 4)
  np.testing.assert_allclose(f(x), (x.astype(np.float64) ** 2).sum(-1), rtol=1e-6)
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  assert jitting.cpu_options(jitting.XLA_REDUCTIONS) is None
