"""The layering the README and docs/architectures.md draw: attn/'s root holds the primitives only
and they never import the rest of attn, the shared layers name no application (attn/apps/<name>/),
kernels import nothing from attn, and the kernel benchmark runs with jax alone."""

import ast
import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
APPLICATION = ("attn.apps", "attn.models", "attn.data", "attn.training", "attn.decoding",
               "attn.evaluation",
               "attn.inspection", "attn.config", "attn.launching", "attn.benchmarks", "attn.common")
# The primitives: scores, normalizers, scopes, masks and what composes them; the error types.
PRIMITIVES = {"__init__", "banded", "core", "errors", "linear", "masks", "multihead",
              "normalizers", "precision", "registry", "scopes", "scores"}


def test_the_package_root_holds_the_primitives_only():
  root = os.path.join(REPO, "attn")
  modules = {n[:-3] for n in os.listdir(root) if n.endswith(".py")}
  assert modules == PRIMITIVES, sorted(modules ^ PRIMITIVES)
  packages = {n for n in os.listdir(root)
              if os.path.isfile(os.path.join(root, n, "__init__.py"))}
  assert {f"attn.{p}" for p in packages} == set(APPLICATION), sorted(packages)


def _imported_after(statement):
  code = (f"import sys; before = set(sys.modules); {statement}; "
          "print(' '.join(sorted(set(sys.modules) - before)))")
  out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                       check=True).stdout
  return out.split()


def test_the_primitives_do_not_import_the_application():
  loaded = _imported_after("import attn; attn.attend; attn.multihead")
  assert "attn.core" in loaded
  assert not [m for m in loaded if m.startswith(APPLICATION)], loaded


def test_kernels_and_their_benchmark_import_nothing_of_attn_but_plotting():
  loaded = _imported_after("import kernels")
  assert not [m for m in loaded if m == "attn" or m.startswith("attn.")], loaded
  loaded = _imported_after("import attn.benchmarks.kernels")
  allowed = ("attn.benchmarks", "attn.benchmarks.kernels",  # the benchmark itself
             "attn.benchmarks.kernel_impls", "attn.benchmarks.harness",
             "attn.config", "attn.config.configurable",  # settings dataclasses (no jax)
             "attn.common", "attn.common.files", "attn.common.tables",  # writer, tables
             "attn.inspection", "attn.inspection.plots")  # matplotlib only
  heavy = [m for m in loaded if m not in allowed
           and m.startswith(APPLICATION + ("tensorflow_datasets", "grain", "flax"))]
  assert not heavy, heavy  # the GPU machine has jax but no data libraries


def test_no_kernel_source_imports_attn():
  package = "kernels"
  for name in os.listdir(os.path.join(REPO, package)):
    if not name.endswith(".py"):
      continue
    tree = ast.parse(open(os.path.join(REPO, package, name)).read())
    for node in ast.walk(tree):
      if isinstance(node, ast.ImportFrom):
        assert not (node.module or "").startswith("attn"), f"{package}/{name} imports {node.module}"
      elif isinstance(node, ast.Import):
        assert not any(a.name.startswith("attn") for a in node.names), f"{package}/{name}"


def test_the_library_imports_no_entry_point_or_preset():
  """attn/ is the library; experiments/ (entry points, presets) and launch.py sit above it."""
  for root, _, names in os.walk(os.path.join(REPO, "attn")):
    for name in (n for n in names if n.endswith(".py")):
      path = os.path.join(root, name)
      for node in ast.walk(ast.parse(open(path).read())):
        modules = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                   else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
        bad = [m for m in modules if m.split(".")[0] in ("experiments", "launch")]
        assert not bad, f"{os.path.relpath(path, REPO)} imports {bad}"


# The shared layers: what every application uses. They find an application through the
# registry (attn.apps.APPS, attn.apps.registry) and never import one.
SHARED = ("attn.training", "attn.launching", "attn.inspection", "attn.models", "attn.data",
          "attn.decoding", "attn.evaluation", "attn.benchmarks", "attn.common", "attn.config")
# Modules outside attn/training that still step an optimizer of their own: the primitives'
# associative-recall study and the primitives demo. The list may only shrink.
OWN_STEPS = {"attn/benchmarks/recall.py", "experiments/demo.py"}


def _imports(path):
  for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
    if isinstance(node, ast.ImportFrom):
      yield node.module or "", [a.name for a in node.names]
    elif isinstance(node, ast.Import):
      for a in node.names:
        yield a.name, []


def _modules(*tops):
  for top in tops:
    for root, _, names in os.walk(os.path.join(REPO, *top.split("."))):
      for name in sorted(n for n in names if n.endswith(".py")):
        yield os.path.relpath(os.path.join(root, name), REPO)


def test_the_shared_layers_name_no_application():
  apps = sorted(n for n in os.listdir(os.path.join(REPO, "attn", "apps"))
                if os.path.isfile(os.path.join(REPO, "attn", "apps", n, "__init__.py")))
  from attn.apps import APPS  # pylint: disable=import-outside-toplevel
  assert apps and apps == sorted(APPS.names()), (apps, APPS.names())  # one package each
  bad = []
  for path in _modules(*SHARED):
    for module, names in _imports(os.path.join(REPO, path)):
      named = [module] + [f"{module}.{n}" for n in names]
      if any(m.startswith(f"attn.apps.{a}") for m in named for a in apps):
        bad.append(f"{path} imports {module}")
  assert not bad, bad


def test_no_inspection_module_trains():
  bad = [p for p in _modules("attn.inspection") if "optax" in open(os.path.join(REPO, p)).read()]
  assert not bad, bad


def test_optimizers_are_stepped_in_attn_training_only():
  stepping = set()
  for path in _modules("attn", "experiments"):
    text = open(os.path.join(REPO, path), encoding="utf-8").read()
    if re.search(r"\b(optimizer|opt)\.update\(|optax\.apply_updates\(", text):
      stepping.add(path.replace(os.sep, "/"))
  outside = {p for p in stepping if not p.startswith("attn/training/")}
  assert outside == OWN_STEPS, (sorted(outside - OWN_STEPS), sorted(OWN_STEPS - outside))
  assert "attn/training/loop.py" in stepping
