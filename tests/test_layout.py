"""The layering the README and docs/architectures.md draw: attn/'s root holds the primitives only
and they never import the rest of attn, no package imports a layer above it (LAYERS), no layer
below the applications (attn/apps/) imports them, no modules import each other in a circle,
kernels import nothing from attn, and the kernel benchmark runs with jax alone."""

import ast
import collections
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
              "normalizers", "precision", "registry", "scopes", "scores", "topk_sparse"}


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
             "attn.common.plots", "attn.common.joiner",  # matplotlib only
             "attn.common.cpu")  # /proc/cpuinfo
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


# Modules outside attn/training that still step an optimizer of their own: the primitives'
# associative-recall study and the primitives demo. The list may only shrink.
OWN_STEPS = {"attn/benchmarks/recall.py", "experiments/demo.py"}


def _modules(*tops):
  for top in tops:
    for root, _, names in os.walk(os.path.join(REPO, *top.split("."))):
      for name in sorted(n for n in names if n.endswith(".py")):
        yield os.path.relpath(os.path.join(root, name), REPO)


def test_every_application_folder_is_a_registered_application():
  folders = sorted(n for n in os.listdir(os.path.join(REPO, "attn", "apps"))
                   if os.path.isfile(os.path.join(REPO, "attn", "apps", n, "__init__.py")))
  from attn.apps import APPS  # pylint: disable=import-outside-toplevel
  assert folders and folders == sorted(APPS.names()), (folders, APPS.names())  # one package each


def _module_files():
  """{dotted module name: path} of the project's modules: attn/, kernels/, experiments/ and
  launch.py (a package is its __init__.py)."""
  files = {"launch": os.path.join(REPO, "launch.py")}
  for path in _modules("attn", "kernels", "experiments"):
    parts = path[:-len(".py")].split(os.sep)
    if parts[-1] == "__init__":
      parts.pop()
    files[".".join(parts)] = os.path.join(REPO, path)
  return files


def _imported_names(module, path):
  """The dotted names the module imports, at top level or inside a function: `import a.b` gives
  a.b; `from a import b` gives a and a.b (b may be a module); relative imports are resolved;
  `importlib.import_module("a.b")` with a literal name gives a.b."""
  package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
  for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
    if isinstance(node, ast.Import):
      yield from (a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        up = package.split(".")[:len(package.split(".")) - node.level + 1]
        base = ".".join(up + ([base] if base else []))
      yield base
      yield from (f"{base}.{a.name}" for a in node.names)
    elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
          and isinstance(node.args[0].value, str)
          and ast.unparse(node.func) in ("importlib.import_module", "import_module",
                                         "__import__")):
      yield node.args[0].value


def _import_graph():
  """{module: the project modules whose code importing it runs}: each module it names and the
  packages above that one (their __init__ runs first), but not its own packages (they are
  already being imported when it runs)."""
  files = _module_files()
  graph = {}
  for module, path in files.items():
    deps = set()
    for name in _imported_names(module, path):
      parts = name.split(".")
      for n in (".".join(parts[:i]) for i in range(1, len(parts) + 1)):
        if n in files and n != module and not module.startswith(n + "."):
          deps.add(n)
    graph[module] = deps
  return graph


def _is_application(name):
  return name == "attn.apps" or name.startswith("attn.apps.")


def test_no_layer_below_the_applications_imports_them():
  """attn.apps sits above the rest of attn/: the shared layers read the registry of
  applications (attn.common.applications) and never import attn.apps, at top level or inside
  a function; the entry points and the tests import it to register the built-in ones."""
  bad = []
  for module, path in _module_files().items():
    if not (module == "attn" or module.startswith("attn.")) or _is_application(module):
      continue
    named = sorted({n for n in _imported_names(module, path) if _is_application(n)})
    if named:
      bad.append(f"{os.path.relpath(path, REPO)} imports {', '.join(named)}")
  assert not bad, bad


def test_the_shared_layers_without_the_applications_name_the_import_that_registers_them():
  """A shared-layer function reading an empty registry (nothing imported attn.apps) fails
  naming the import, rather than finding no application."""
  code = ("from attn import training\n"
          "try:\n  training.get_task('translate')\nexcept RuntimeError as e:\n  print(e)")
  out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                       check=True).stdout
  assert "no application is registered: import attn.apps" in out, out


def _reachable(graph, start):
  """The modules `start` imports, directly or through others."""
  seen, todo = set(), [start]
  while todo:
    for child in graph[todo.pop()]:
      if child not in seen:
        seen.add(child)
        todo.append(child)
  return seen


def _circles(graph):
  """One circle per group of modules that import each other (a strongly connected component):
  the shortest way from its first module back to it, the first module repeated last."""
  reach = {m: _reachable(graph, m) for m in graph}
  circles, done = [], set()
  for start in sorted(m for m in graph if m in reach[m]):
    if start in done:
      continue
    group = {m for m in reach[start] if start in reach[m]}
    done |= group
    came_from, queue = {}, collections.deque([start])
    while start not in graph[queue[0]]:  # breadth first: the first node that leads back
      node = queue.popleft()
      for child in sorted(graph[node] & group):
        if child not in came_from and child != start:
          came_from[child] = node
          queue.append(child)
    path = [queue[0]]
    while path[-1] != start:
      path.append(came_from[path[-1]])
    circles.append(path[::-1] + [start])
  return circles


def test_circles_are_found_and_named():
  graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
  assert _circles(graph) == [["a", "b", "c", "a"], ["e", "e"]]


def test_no_import_circle():
  """No module of attn/, kernels/, experiments/ or launch.py imports, through any chain of
  imports (inside functions too), a module that imports it back."""
  circles = [" -> ".join(c) for c in _circles(_import_graph())]
  assert not circles, circles


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
  assert "attn/training/step.py" in stepping  # the loop's own step (train_step)


# The layers of docs/architectures.md, lowest first: a package imports only from its own rank and
# below (and the primitives at attn/'s root). Packages on one rank may import each other.
LAYERS = (("attn.common", "attn.config"), ("attn.data", "attn.models"),
          ("attn.decoding", "attn.evaluation"), ("attn.training",), ("attn.launching",),
          ("attn.inspection", "attn.benchmarks"), ("attn.apps",))


def _layer(module):
  """The rank of `module`'s package in LAYERS, or None for the primitives (attn's root)."""
  for rank, packages in enumerate(LAYERS):
    if any(module == p or module.startswith(p + ".") for p in packages):
      return rank
  return None


def test_no_package_imports_a_layer_above_it():
  """At top level or inside a function: e.g. training and launching draw their figures with
  attn.common.plots, never through attn.inspection (the look-inside tools, which read finished
  runs through training and launching)."""
  assert {p for packages in LAYERS for p in packages} == set(APPLICATION)
  bad = []
  for module, path in _module_files().items():
    rank = _layer(module)
    if rank is None:
      continue
    for name in sorted(set(_imported_names(module, path))):
      other = _layer(name)
      if other is not None and other > rank:
        bad.append(f"{os.path.relpath(path, REPO)} imports {name} ({LAYERS[other]} is above "
                   f"{LAYERS[rank]})")
  assert not bad, "\n".join(bad)
