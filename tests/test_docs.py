"""The docs cannot drift from the code: every command in README.md, experiments/README.md and
docs/*.md is valid (what counts as a command and how each is checked: tests/docs_commands.py), the
README's preset list and the layout map (docs/layout.md) name everything there is, every test
and every `attn.…`/`kernels.…` name the docs cite exists, every make target and entry point is
documented, their links land on existing files and sections, and LICENSE and CITATION.cff agree
with setup.cfg.

No command is run: flags and configs are parsed in one subprocess (~10 s), the cited names are
imported in another (~5 s), test files are read with ast, `make -n` is a dry run.
"""

import ast
import configparser
import dataclasses
import json
import os
import re
import subprocess
import sys

import pytest

import docs_commands
from docs_commands import REPO, Command, collect, commands_in_shell

COMMANDS = docs_commands.collect_all()
PYTEST_VALUE_OPTIONS = {"-m", "-k", "-p", "-n", "-o", "-c", "--dist", "--maxfail", "--rootdir"}

# Commands that must fail, checked in the same subprocess: the validator is not a rubber stamp.
BAD = {
    "unknown preset": ("module", "experiments.translate",
                       ["--config=experiments/configs/translate.py:no_such_preset", "--workdir=w"]),
    "unknown field": ("module", "experiments.translate",
                      ["--config=experiments/configs/translate.py:demo",
                       "--config.model.rnn.decodr=bahdanau", "--workdir=w"]),
    "bad value": ("module", "experiments.translate",
                  ["--config=experiments/configs/translate.py:demo", "--config.train.steps=many",
                   "--workdir=w"]),
    "bad variant": ("module", "experiments.translate",
                    ["--config=experiments/configs/translate.py:demo",
                     "--config.model.rnn.decoder=bahdanoo", "--workdir=w"]),
    "unknown flag": ("module", "experiments.demo", ["--stepz=3"]),
    "missing module": ("module", "experiments.no_such_module", []),
    "launch sweep": ("launch", "", ["--experiment=translate", "--workdir=w",
                                    "--config=experiments/configs/translate.py:demo",
                                    "--sweep=model.rnn.decoder=none,bahdanoo"]),
    "unknown experiment": ("launch", "", ["--experiment=transalte", "--workdir=w"]),
}
BAD_MESSAGES = {"unknown preset": "no_such_preset", "unknown field": "decodr",
                "bad value": "steps", "bad variant": "bahdanoo", "unknown flag": "stepz",
                "missing module": "experiments.no_such_module", "launch sweep": "bahdanoo",
                "unknown experiment": "transalte"}


@pytest.fixture(scope="module")
def validation(tmp_path_factory):
  """{command index or BAD name: error} from one subprocess over every module/launch command."""
  todo = [dataclasses.asdict(c) for c in COMMANDS]
  names = list(BAD)
  for name in names:
    kind, target, args = BAD[name]
    todo.append(dataclasses.asdict(Command(name, name, kind, target, tuple(args))))
  work = tmp_path_factory.mktemp("docs_commands")
  source, out = work / "in.json", work / "out.json"
  source.write_text(json.dumps([c if c["kind"] in ("module", "launch") and not c["problem"]
                                else dict(c, kind="skip") for c in todo]))
  proc = subprocess.run([sys.executable, os.path.join(REPO, "tests", "docs_commands.py"),
                         str(source), str(out)], cwd=REPO, capture_output=True, text=True,
                        timeout=600, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert proc.returncode == 0 and out.exists(), proc.stderr[-3000:]
  errors = {int(k): v for k, v in json.loads(out.read_text()).items()}
  return {(names[i - len(COMMANDS)] if i >= len(COMMANDS) else i): e for i, e in errors.items()}


def test_the_docs_hold_commands_of_every_kind():
  kinds = {c.kind for c in COMMANDS}
  assert kinds == {"module", "launch", "make", "pytest"}, kinds
  assert len(COMMANDS) > 40


@pytest.mark.parametrize("index", range(len(COMMANDS)),
                         ids=[f"{c.where}:{c.target or c.kind}" for c in COMMANDS])
def test_every_command_in_the_docs_is_valid(index, validation):
  cmd = COMMANDS[index]
  assert not cmd.problem, f"{cmd.where}: {cmd.problem}\n  {cmd.text}"
  if cmd.kind == "make":
    proc = subprocess.run(["make", "-n", "-C", REPO, *cmd.args], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, f"{cmd.where}: make -n {' '.join(cmd.args)}: {proc.stderr}"
  elif cmd.kind == "pytest":
    paths, skip = [], False
    for a in cmd.args:  # positional arguments, not the values of -m, -k, -p, -n, ...
      if not skip and not a.startswith("-"):
        paths.append(a)
      skip = a in PYTEST_VALUE_OPTIONS
    assert paths and all(os.path.exists(os.path.join(REPO, p.split("::")[0])) for p in paths), (
        f"{cmd.where}: {cmd.text}: no such test path")
  else:
    assert index not in validation, f"{cmd.where}: {validation[index]}\n  {cmd.text}"


@pytest.mark.parametrize("name", list(BAD))
def test_a_bad_command_is_reported_with_its_mistake(name, validation):
  assert name in validation, f"{name}: {BAD[name]} was accepted"
  assert BAD_MESSAGES[name] in validation[name], validation[name]


def test_the_collector_reads_blocks_inline_spans_and_nested_commands(tmp_path):
  doc = tmp_path / "doc.md"
  doc.write_text("\n".join([
      "Run `python -m experiments.demo\n--steps=3` or `make demo`; `python -m experiments.inspect"
      " ...` refers to one.",
      "```bash",
      "# a comment: python -m experiments.not_a_command",
      "XLA_FLAGS=--x=1 python -m experiments.translate --config=a.py:b \\",
      "    --workdir=w   # trailing comment",
      "for i in 0 1; do taskset -c 1 .venv/bin/python launch.py --workdir=w$i & done; wait",
      "gcloud ssh --command='",
      "    cd ~/attn && python3 -m experiments.focus --port=0'",
      "cp -r a b && python -m pip install x",
      "python -m experiments.summarize <the same flags>",
      "```",
      "```python",
      "python -m experiments.ignored_in_python_blocks",
      "```",
  ]))
  got = [(c.where.split(":")[1], c.kind, c.target, c.args, bool(c.problem), c.template)
         for c in collect(str(doc))]
  assert got == [
      ("1", "module", "experiments.demo", ("--steps=3",), False, False),
      ("2", "make", "demo", ("demo",), False, False),
      ("2", "module", "experiments.inspect", (), False, True),
      ("5", "module", "experiments.translate", ("--config=a.py:b", "--workdir=w"), False, False),
      ("7", "launch", "", ("--workdir=w0",), False, False),
      ("8", "module", "experiments.focus", ("--port=0",), False, False),
      ("11", "module", "experiments.summarize", (), True, True),
  ]
  assert commands_in_shell("python -m experiments.x --n=$NOPE", "f:1")[0].problem.startswith(
      "unknown shell variable $NOPE")


def _readme():
  with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
    return f.read()


def _config_presets():
  """{'experiments/configs/X.py': its presets} for every config file there (PRESETS or
  _PRESETS, the table get_config(preset) reads)."""
  import importlib  # pylint: disable=import-outside-toplevel
  files = {}
  for name in sorted(os.listdir(os.path.join(REPO, "experiments", "configs"))):
    if name.endswith(".py") and name != "__init__.py":
      module = importlib.import_module(f"experiments.configs.{name[:-3]}")
      presets = getattr(module, "PRESETS", getattr(module, "_PRESETS", None))
      assert isinstance(presets, dict), f"experiments/configs/{name} has no PRESETS table"
      files[f"experiments/configs/{name}"] = presets
  return files


def test_the_readme_lists_every_preset_of_every_config_file():
  files = _config_presets()
  assert len(files) >= 5, files  # translate, summarize, caption, recommend, data
  listed = {}
  for line in _readme().splitlines():
    m = re.match(r"\| `(experiments/configs/\w+\.py)` \|(.*)\|\s*$", line)
    if m:
      listed[m.group(1)] = set(re.findall(r"`(\w+)`", m.group(2)))
  for path, presets in files.items():
    assert path in listed, f"README's preset table has no row for {path}"
    want = {p for p in presets if p}
    assert listed[path] == want, (f"{path}: missing from the README {sorted(want - listed[path])}, "
                                  f"not presets {sorted(listed[path] - want)}")


def _layout_sections():
  """{section header (e.g. `attn/training/`, `attn/` for the root): its text} of the layout map,
  the first code block of docs/layout.md (the README links to it)."""
  with open(os.path.join(REPO, "docs", "layout.md"), encoding="utf-8") as f:
    block = f.read().split("```", 2)[1]
  sections, header = {}, None
  for line in block.splitlines():
    if line and not line[0].isspace():
      header = line.split()[0]
      sections[header] = line[len(header):]
    elif header:
      sections[header] += " " + line.strip()
  return sections


def test_the_layout_map_names_every_module_of_attn_and_experiments():
  sections = _layout_sections()
  missing = []
  for top in ("attn", "experiments"):
    for dirpath, dirnames, filenames in os.walk(os.path.join(REPO, top)):
      dirnames[:] = [d for d in dirnames if d not in ("__pycache__", "configs", "web")]
      rel = os.path.relpath(dirpath, REPO).replace(os.sep, "/") + "/"
      text = sections.get(rel)
      for name in sorted(f for f in filenames if f.endswith(".py") and f != "__init__.py"):
        if text is None or not re.search(rf"(?<![\w/]){re.escape(name)}", text):
          missing.append(rel + name)
  assert not missing, f"docs/layout.md's map does not name {missing}"


def test_links_from_the_readme_and_docs_land_on_existing_files_and_sections():
  def anchors(path):
    with open(path, encoding="utf-8") as f:
      heads = re.findall(r"^#+ (.+)$", f.read(), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}

  bad = []
  for path in docs_commands.doc_paths():
    with open(path, encoding="utf-8") as f:
      text = f.read()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
      if re.match(r"https?:", target):
        continue
      file, _, anchor = target.partition("#")
      dest = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
      if not os.path.exists(dest) or (anchor and anchor not in anchors(dest)):
        bad.append(f"{os.path.relpath(path, REPO)}: {target}")
  assert not bad, bad


def test_license_matches_setup_cfg_and_citation_cff_has_the_required_keys():
  yaml = pytest.importorskip("yaml")
  cfg = configparser.ConfigParser()
  cfg.read(os.path.join(REPO, "setup.cfg"))
  meta = cfg["metadata"]
  with open(os.path.join(REPO, "LICENSE"), encoding="utf-8") as f:
    license_text = f.read()
  spdx = {"Apache-2.0": "Apache License\n                           Version 2.0, January 2004"}
  assert meta["license"] in spdx, f"setup.cfg's license {meta['license']} has no known text"
  assert spdx[meta["license"]] in license_text
  with open(os.path.join(REPO, "CITATION.cff"), encoding="utf-8") as f:
    cff = yaml.safe_load(f)
  for key in ("cff-version", "message", "title", "authors", "license", "version",
              "date-released"):
    assert key in cff, f"CITATION.cff has no {key}"
  assert cff["cff-version"] == "1.2.0"
  assert cff["license"] == meta["license"] and str(cff["version"]) == meta["version"]
  assert cff["authors"] and all("name" in a or "family-names" in a for a in cff["authors"])
  assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", str(cff["date-released"]))


def test_the_bfloat16_sentence_the_additive_scores_projections_stay_float32():
  """docs/experiments.md ("Faster per core"): with compute_dtype=bfloat16 the layers' matmuls take bfloat16 operands, while the
  additive score's W q and U k (the Bahdanau preset's attention) stay float32 x float32."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from flax import nnx
  from model_configs import model_config
  from attn.models import cost
  from attn.models.seq2seq import build_model
  cfg = model_config(src_vocab=23, tgt_vocab=19, emb_dim=8, enc_hidden=12, dec_hidden=10,
                     d_attn=9, dropout=0.0, decoder="bahdanau", score="additive")
  model = build_model(cfg, seed=0, compute_dtype="bfloat16")
  rng = np.random.default_rng(0)
  batch = {"src": jnp.asarray(rng.integers(3, 23, (2, 5)), jnp.int32),
           "src_lengths": jnp.asarray([5, 3], jnp.int32),
           "tgt": jnp.asarray(rng.integers(3, 19, (2, 4)), jnp.int32),
           "tgt_lengths": jnp.asarray([4, 2], jnp.int32)}
  graphdef, state = nnx.split(model)
  logits = lambda state, b: nnx.merge(graphdef, state)(b)[0]
  dots = cost.jaxpr_matmuls(jax.make_jaxpr(logits)(state, batch))
  f32, bf16 = jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)
  D, He, A = cfg.rnn.dec_hidden, cfg.rnn.enc_out_dim, cfg.rnn.d_attn
  score = [m for m in dots if m.rhs.shape in ((D, A), (He, A))]  # W: [D, A], U: [He, A]
  assert {m.rhs.shape for m in score} == {(D, A), (He, A)}, score
  assert all((m.lhs.dtype, m.rhs.dtype) == (f32, f32) for m in score), score
  assert any((m.lhs.dtype, m.rhs.dtype) == (bf16, bf16) for m in dots)  # the layers' matmuls


# ---------------------------------------------------------------------------------------------
# What the docs cite exists. docs/journal/ is exempt: its entries are dated sittings that name the
# tests, modules and functions of their day (a rename later must not rewrite what was run then);
# what the docs say now is in README.md, experiments/README.md and docs/*.md.


def test_the_citation_collectors_read_tests_and_the_names_in_inline_code(tmp_path):
  doc = tmp_path / "doc.md"
  doc.write_text("\n".join([
      "| row | `tests/test_a.py::test_b` and test_c.py::TestD::test_e[cpu-1] |",
      "See `attn.training.seq2seq_task.check_sections`, `kernels.attention(q, k, v)` and",
      "`attn.VARIANTS[\"score\"].names()`; not `experiments/attn.py` nor attn.loose.",
      "```bash",
      "python -c 'import attn.in_shell'",
      "```",
      "```python",
      "ctx, w = attn.attend(None, q, k, v)",
      "```",
  ]))
  assert docs_commands.cited_tests(str(doc)) == [
      (1, "tests/test_a.py", "test_b"), (1, "tests/test_c.py", "TestD::test_e")]
  assert docs_commands.cited_names(str(doc)) == [
      (2, "attn.training.seq2seq_task.check_sections"), (2, "kernels.attention"),
      (3, "attn.VARIANTS")]


def test_every_test_the_docs_cite_is_defined_in_its_file():
  """`tests/FILE.py::NAME` (or `Class::method`; a parametrized id stripped) in README.md,
  experiments/README.md and docs/ (but docs/journal/, see above) names a test that FILE defines,
  read with ast."""
  bad, count = [], 0
  for path in docs_commands.citing_paths():
    for line, file, name in docs_commands.cited_tests(path):
      count += 1
      names = docs_commands.test_names(os.path.join(REPO, file))
      if names is None or name not in names:
        where = f"{os.path.relpath(path, REPO)}:{line}"
        bad.append(f"{where}: {file}::{name} " + ("(no such file)" if names is None else
                                                   f"is not defined in {file}"))
  assert count > 100, count
  assert not bad, "\n".join(bad)


@pytest.fixture(scope="module")
def unresolved_names(tmp_path_factory):
  """{dotted name: where the docs cite it} for the cited names that do not resolve, found by
  importing them in one subprocess."""
  cited = {}
  for path in docs_commands.citing_paths():
    for line, name in docs_commands.cited_names(path):
      cited.setdefault(name, f"{os.path.relpath(path, REPO)}:{line}")
  work = tmp_path_factory.mktemp("docs_names")
  source, out = work / "in.json", work / "out.json"
  source.write_text(json.dumps(sorted(cited) + ["attn.no_such_module", "attn.attend.no_attr"]))
  proc = subprocess.run([sys.executable, os.path.join(REPO, "tests", "docs_commands.py"),
                         "--names", str(source), str(out)], cwd=REPO, capture_output=True,
                        text=True, timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert proc.returncode == 0 and out.exists(), proc.stderr[-3000:]
  return cited, json.loads(out.read_text())


def test_every_dotted_name_the_docs_cite_resolves(unresolved_names):
  """Each `attn.…`/`kernels.…` name in an inline code span of README.md, experiments/README.md
  and docs/ (not docs/journal/) is a module or an attribute of one."""
  cited, bad = unresolved_names
  assert len(cited) > 40, cited
  assert {"attn.no_such_module", "attn.attend.no_attr"} <= set(bad)  # the resolver can say no
  assert not (set(bad) & set(cited)), [f"{cited[n]}: `{n}` does not resolve"
                                       for n in bad if n in cited]


def _makefile_rules():
  """{target: (prerequisites, recipe lines)} of the Makefile's rules, and the .PHONY names."""
  with open(os.path.join(REPO, "Makefile"), encoding="utf-8") as f:
    lines = f.read().split("\n")
  rules, phony, current = {}, set(), None
  for line in lines:
    if line.startswith("\t") and current is not None:
      rules[current][1].append(line.strip())
      continue
    current = None
    m = re.match(r"^([^\s:#=][^:=]*?)\s*:(?![=:])\s*(.*)$", line)
    if m:
      if m.group(1) == ".PHONY":
        phony.update(m.group(2).split())
        continue
      for target in m.group(1).split():
        rules[target] = (m.group(2).split(), [])
      current = m.group(1).split()[-1]
  return rules, phony


def _mentions(pattern, paths):
  for path in paths:
    with open(path, encoding="utf-8") as f:
      if re.search(pattern, f.read()):
        return True
  return False


def test_every_make_target_and_entry_point_is_documented():
  """Each Makefile target (its .PHONY list and its rules but the files it builds) is shown as
  `make TARGET` or named `TARGET` in the docs; each experiments/*.py module as
  `experiments.NAME` or `NAME.py` outside the layout map (docs/layout.md, checked on its own)."""
  rules, phony = _makefile_rules()
  targets = sorted(phony | {t for t in rules if re.fullmatch(r"[\w-]+", t)})
  assert {"setup", "run", "test", "clean", "gpu-check"} <= set(targets), targets
  docs = docs_commands.doc_paths()
  missing = [f"make {t}" for t in targets
             if not _mentions(rf"make\s+(?:[A-Z_]+=\S+\s+)*{re.escape(t)}(?![\w-])|`{re.escape(t)}`",
                              docs)]
  prose = [p for p in docs if os.path.basename(p) != "layout.md"]
  for name in sorted(os.listdir(os.path.join(REPO, "experiments"))):
    module = name[:-3]
    if name.endswith(".py") and name != "__init__.py" and not _mentions(
        rf"experiments\.{module}\b|`{re.escape(name)}`", prose):
      missing.append(f"experiments/{name}")
  assert not missing, f"not documented in README.md, experiments/README.md or docs/: {missing}"


def test_make_targets_run_the_venvs_python_after_setup():
  """A recipe runs the project's python as $(BIN)/python (the venv `make setup` installs into)
  and depends on setup ($(STAMP)); bare `python` is whatever is on PATH, without jax after
  `make run`. $(PY) only creates the venvs."""
  rules, _ = _makefile_rules()
  bad = []
  for target, (prereqs, recipe) in rules.items():
    for line in recipe:
      for cmd in re.split(r"&&|\|\||;|\|", line.lstrip("@-")):
        word = (cmd.split() or [""])[0]
        if re.fullmatch(r"(?:.*/)?python3?", word) and word not in (
            "$(BIN)/python", ".peer-venv/bin/python"):
          bad.append(f"{target}: runs {word!r}, not $(BIN)/python")
        if word == "$(BIN)/python" and target not in ("$(BIN)/python", "$(STAMP)") and (
            "$(STAMP)" not in prereqs):
          bad.append(f"{target}: runs $(BIN)/python without depending on $(STAMP) (setup)")
  assert not bad, bad
  dry = subprocess.run(["make", "-n", "-C", REPO, "gpu-check"], capture_output=True, text=True,
                       timeout=60, check=True).stdout
  assert ".venv/bin/python -m experiments.gpu_check" in dry, dry


def test_the_docs_quote_launchs_list_of_experiments(validation):
  """The quoted refusal of an unknown --experiment is the one launch.py prints now (its list of
  launchable applications grows as applications are registered)."""
  real = validation["unknown experiment"].strip().splitlines()[-1].split(": ", 1)[1]
  assert real.startswith("--experiment=transalte: not an experiment launch.py runs"), real
  quoted = []
  for path in docs_commands.doc_paths():
    with open(path, encoding="utf-8") as f:
      quoted += re.findall(r"error: (--experiment=transalte: [^`]*)", f.read())
  assert quoted and all(q == real for q in quoted), (quoted, real)


def test_the_tpu_tiles_in_benchmarks_md_are_the_tpu_targets():
  """docs/benchmarks.md's per-kernel table gives each kernel's tiles on the "tpu" target as
  kernels/targets/tpu.py's BLOCKS has them (read with ast)."""
  with open(os.path.join(REPO, "kernels", "targets", "tpu.py"), encoding="utf-8") as f:
    tree = ast.parse(f.read())
  blocks = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                and [ast.unparse(t) for t in node.targets] == ["BLOCKS"])
  tiles = {ast.literal_eval(k): {kw.arg: ast.literal_eval(kw.value) for kw in v.keywords}
           for k, v in zip(blocks.keys, blocks.values)}
  with open(os.path.join(REPO, "docs", "benchmarks.md"), encoding="utf-8") as f:
    rows = {m.group(1): m.group(2) for m in re.finditer(
        r"^\| \w[\w-]* \(`kernels\.(\w+)`\) \|(.*)$", f.read(), flags=re.M)}
  kernel_of = {"attention": "flash_attention", "additive_attention": "additive_attention"}
  assert set(kernel_of) <= set(rows), sorted(rows)
  for name, row in rows.items():
    b = tiles[kernel_of[name]]
    m = re.search(r'the "tpu" target\'s \((\d+)/(\d+), backward (\d+)/(\d+)'
                  r'(?:, block_d = (\d+))?', row)
    assert m, f"benchmarks.md's {name} row gives no tiles of the tpu target"
    got = [int(g) for g in m.groups() if g is not None]
    want = [b["block_q"], b["block_k"], b["block_q_bwd"], b["block_k_bwd"]] + (
        [b["block_d"]] if "block_d" in b else [])
    assert got == want, f"{name}: docs/benchmarks.md says {got}, kernels/targets/tpu.py {want}"
