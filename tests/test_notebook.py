"""docs/notebooks/attention_tour.ipynb runs top to bottom (smoke preset) and shows its figures."""

import json
import os
import sys

import pytest

nbformat = pytest.importorskip("nbformat",
                               reason="nbformat is not installed (pip install -e .[test])")
nbclient = pytest.importorskip("nbclient",
                               reason="nbclient is not installed (pip install -e .[test])")
pytest.importorskip("ipykernel", reason="ipykernel is not installed: the notebook test needs a "
                    "Jupyter kernel (pip install -e .[test])")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(REPO, "docs", "notebooks", "attention_tour.ipynb")
KERNEL = "attn-test-python"


def _kernelspec(directory):
  """A kernelspec running ipykernel on this interpreter (not whatever `python3` Jupyter finds)."""
  spec = os.path.join(directory, "kernels", KERNEL)
  os.makedirs(spec)
  with open(os.path.join(spec, "kernel.json"), "w") as f:
    json.dump({"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
               "display_name": "attn tests", "language": "python"}, f)
  return directory


def test_the_attention_tour_runs_and_shows_its_figures(tmp_path, monkeypatch,
                                                      smoke_bahdanau_workdir):
  # The kernel inherits this environment: the smoke preset, the repository on the path, and the
  # session's finished smoke run to reuse (the notebook's own training is train_and_evaluate,
  # tested elsewhere; reusing the run saves a training).
  monkeypatch.setenv("ATTN_TOUR_PRESET", "smoke")
  monkeypatch.setenv("ATTN_TOUR_WORKDIR", smoke_bahdanau_workdir)
  monkeypatch.setenv("JUPYTER_PATH", _kernelspec(str(tmp_path / "jupyter")))
  monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
      [REPO] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
  monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
  work = tmp_path / "work"
  work.mkdir()
  nb = nbformat.read(NOTEBOOK, as_version=4)
  client = nbclient.NotebookClient(nb, timeout=300, kernel_name=KERNEL, allow_errors=False,
                                   resources={"metadata": {"path": str(work)}})
  client.execute()  # raises CellExecutionError naming the cell on the first error

  outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
  assert not [o for o in outputs if o.output_type == "error"]
  images = [o for o in outputs if o.output_type == "display_data" and "image/png" in o.data]
  # heatmaps, temperatures, the three diagnosis plots, the off-by-one example
  assert len(images) >= 6, len(images)
  text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
  assert "| permute |" in text and "Kendall tau" in text and "shifted" in text
  assert "reusing the finished run" in text
  workdir = smoke_bahdanau_workdir
  for name in ("results.json", "attention.npz", "diagnose.json"):
    assert os.path.exists(os.path.join(workdir, name)), name
