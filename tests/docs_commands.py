r"""The shell commands in README.md, experiments/README.md and docs/*.md, collected and checked
without running them.

What counts as a command (tests/test_docs.py pins that each one is valid):
- in a fenced block tagged `sh`, `bash`, `shell`, `console` or untagged: every invocation, in
  command position (a line's start, or after `;`, `&&`, `||`, `|`, `&`, `(`, `do`, `then`), of
  the project's entry points: `python -m experiments.X ...`, `python launch.py ...`,
  `python -m pytest ...` and `make ...`. Backslash continuations are joined and `#` comments
  dropped; `VAR=value` prefixes and the wrappers `taskset -c N`, `srun`, `timeout N`, `env`,
  `time` are skipped; any `python`, `python3` or `.../bin/python` is Python; a quoted argument
  that itself holds such an invocation (gcloud's `--command='...'`) is searched too. Other
  programs (cp, gcloud, sbatch, pip, ...) are not the project's and are not checked;
- in running text, an inline code span (which may wrap over lines) that starts with one of
  those invocations, e.g. `python -m experiments.variant_costs`.
A fenced command holding `...` or a `<placeholder>` is a template, not a command: it is refused
(write the command out); an inline span holding one refers to a command shown elsewhere, and only
its module (or make target) is checked. Shell variables are replaced by the values in SHELL_VARIABLES; an unknown one
is refused. `--help`/`--helpfull` are dropped (what is left is validated).

How each is checked (validate(), in one subprocess: the experiments define flags on absl's
global FLAGS, so each module's flags are removed again before the next one's are defined):
- `python -m experiments.X flags`: the module's code runs as `__main__` with absl's `app.run`
  and `attn.launching.cli.run` replaced by a no-op, so its flags are defined and main is not
  run; the flags are parsed as the command would parse them (an unknown flag, a bad value, a
  missing required flag, `--config=FILE:PRESET` with a missing file or preset, a
  `--config.a.b=v` naming no field or with a value that does not parse), then, where the module
  has `validate_config`, the config is checked as the run would check it before writing
  anything. No data and no accelerator are needed.
- `python launch.py flags`: the same flags with `--dry_run` (every combination's config is built
  and checked; nothing is run or written).
- `make TARGET [VAR=value]`: `make -n` of it succeeds (the target exists).
- `python -m pytest [args] PATHS`: every test path exists.

Also collected here, for tests/test_docs.py: the tests the docs cite (`cited_tests`, resolved
against the test files' ast by `test_names`) and the `attn.…`/`kernels.…` names in their inline
code (`cited_names`, resolved by importing them: `unresolved`, run as
`python tests/docs_commands.py --names IN.json OUT.json`).
"""

import ast
import contextlib
import dataclasses
import io
import json
import os
import re
import runpy
import shlex
import sys
import warnings

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHELL_BLOCKS = {"", "sh", "bash", "shell", "console"}
SHELL_VARIABLES = {"i": "0", "OUT": "/tmp/attn_docs_out", "HOME": "/tmp", "USER": "user",
                   "TPU": "attn-v4-32", "ZONE": "us-central2-b"}
WRAPPERS = {"taskset": 2, "srun": 0, "timeout": 1, "env": 0, "time": 0, "exec": 0, "nohup": 0}
SEPARATORS = {";", "&&", "||", "|", "&", "(", ")", "do", "then", "else", "done", "fi", "{", "}"}
HELP = {"--help", "--helpfull", "--helpshort", "-h"}


@dataclasses.dataclass(frozen=True)
class Command:
  """One collected invocation. kind: module | launch | make | pytest; target: the module, the
  make target or ''; args: the arguments after it."""
  where: str  # file:line
  text: str  # the command as written (joined onto one line)
  kind: str
  target: str
  args: tuple[str, ...]
  problem: str = ""  # set when the text itself cannot be a command (a template, a variable)
  template: bool = False  # an inline reference with `...`: only the module or target is checked


def _is_python(word):
  return re.fullmatch(r"(?:.*/)?python(?:3(?:\.\d+)?)?", word) is not None


def _substitute(arg):
  """arg with $VAR / ${VAR} replaced from SHELL_VARIABLES; KeyError names an unknown one."""
  def repl(m):
    name = m.group(1) or m.group(2)
    if name not in SHELL_VARIABLES:
      raise KeyError(name)
    return SHELL_VARIABLES[name]
  return re.sub(r"\$\{(\w+)\}|\$(\w+)", repl, arg)


def _classify(words, where, text, inline):
  """The Command of one simple command's words, or None when it is not one of ours."""
  i = 0
  while i < len(words) and re.fullmatch(r"[A-Za-z_]\w*=.*", words[i]):
    i += 1  # VAR=value prefixes
  while i < len(words) and words[i] in WRAPPERS:
    i += 1 + WRAPPERS[words[i]]
  words = words[i:]
  if not words:
    return None
  if words[0] == "make":
    kind, target, args = "make", "", words[1:]
    targets = [w for w in args if not w.startswith("-") and "=" not in w]
    target = targets[0] if targets else ""
  elif _is_python(words[0]) and words[1:2] == ["-m"] and len(words) > 2:
    module = words[2]
    if module.startswith("experiments."):
      kind, target, args = "module", module, words[3:]
    elif module == "pytest":
      kind, target, args = "pytest", "", words[3:]
    else:
      return None  # venv, pip, ...: not ours
  elif _is_python(words[0]) and words[1:2] and os.path.basename(words[1]) == "launch.py":
    kind, target, args = "launch", "", words[2:]
  else:
    return None
  problem, template = "", any("..." in w for w in words) or re.search(r"<[^>]*>", " ".join(words))
  if template:
    args = []
    if not inline:
      problem = "a template (`...` or `<placeholder>`), not a command: write the command out"
  try:
    args = [_substitute(a) for a in args if a not in HELP]
  except KeyError as e:
    problem = f"unknown shell variable ${e.args[0]} (known: {', '.join(SHELL_VARIABLES)})"
  return Command(where, text, kind, target, tuple(args), problem, bool(template))


def _simple_commands(tokens):
  """Splits shlex tokens (punctuation split off) at the shell's separators."""
  current = []
  for tok in tokens:
    if tok in SEPARATORS or re.fullmatch(r"[;&|()]+", tok):
      if current:
        yield current
      current = []
    else:
      current.append(tok)
  if current:
    yield current


def commands_in_shell(text, where, inline=False):
  """The Commands of shell text (one logical line or a whole --command='...' argument)."""
  lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|()")
  lexer.whitespace_split = True
  lexer.commenters = "#"
  try:
    tokens = list(lexer)
  except ValueError:
    return []  # unbalanced quotes: the caller joins more lines first
  found = []
  for words in _simple_commands(tokens):
    cmd = _classify(words, where, text.strip(), inline)
    if cmd is not None:
      found.append(cmd)
    for w in words:  # an argument holding a command line of its own
      if " " in w and re.search(r"python\S* -m experiments\.|launch\.py", w):
        found.extend(commands_in_shell(w, where, inline))
  return found


def _logical_lines(lines, first):
  """(line number, text) of a block's lines with continuations and open quotes joined."""
  buf, start = "", None
  for n, line in enumerate(lines, first):
    if start is None:
      start = n
    if line.rstrip().endswith("\\"):
      buf += line.rstrip()[:-1] + " "
      continue
    buf += line
    try:
      shlex.split(buf, comments=True)
    except ValueError:  # a quote still open: the argument goes on
      buf += "\n"
      continue
    yield start, buf
    buf, start = "", None
  if buf.strip():
    yield start, buf


INLINE_START = re.compile(r"(?:[A-Za-z_]\w*=\S*\s+)*(?:python\S*\s+-m\s+(?:experiments\.|pytest)|"
                          r"python\S*\s+launch\.py|make\s)")


def collect(path):
  """Every Command in one markdown file."""
  rel = os.path.relpath(path, REPO)
  with open(path, encoding="utf-8") as f:
    lines = f.read().split("\n")
  found, block, fence, prose = [], None, None, []
  for n, line in enumerate(lines, 1):
    m = re.match(r"^\s*(```+|~~~+)\s*([\w+-]*)", line)
    if block is None and m:
      fence, block, tag = m.group(1), [], m.group(2).lower()
      block_start = n + 1
      found.extend(_inline(prose, rel))
      prose = []
      continue
    if block is not None:
      if line.strip().startswith(fence):
        if tag in SHELL_BLOCKS:
          for start, text in _logical_lines(block, block_start):
            found.extend(commands_in_shell(text, f"{rel}:{start}"))
        block = None
      else:
        block.append(line)
      continue
    prose.append((n, line))
  found.extend(_inline(prose, rel))
  return found


def _inline(prose, rel):
  """Commands in the inline code spans of running text (a span may wrap over lines)."""
  if not prose:
    return []
  text = "\n".join(line for _, line in prose)
  starts = [0]
  for _, line in prose:
    starts.append(starts[-1] + len(line) + 1)
  found = []
  for m in re.finditer(r"(?<!`)`([^`]+)`(?!`)", text):
    span = " ".join(m.group(1).split())
    if INLINE_START.match(span):
      line_no = prose[max(i for i, s in enumerate(starts) if s <= m.start())][0]
      found.extend(commands_in_shell(span, f"{rel}:{line_no}", inline=True))
  return found


def doc_paths():
  """README.md, experiments/README.md and docs/*.md: the files whose commands and links are
  checked (each command in a clean argv, so their order does not matter)."""
  docs = os.path.join(REPO, "docs")
  return ([os.path.join(REPO, "README.md"), os.path.join(REPO, "experiments", "README.md")]
          + [os.path.join(docs, f) for f in sorted(os.listdir(docs)) if f.endswith(".md")])


def collect_all():
  """The Commands of doc_paths(), in file order."""
  return [c for p in doc_paths() for c in collect(p)]


# ---------------------------------------------------------------------------------------------
# Names the docs cite: tests (`tests/test_x.py::test_y`) and dotted names (`attn.a.b`).


def citing_paths():
  """doc_paths() and the markdown under docs/'s subfolders but docs/journal/ (dated sittings,
  which name what existed on their day: tests/test_docs.py says why they are exempt)."""
  docs = os.path.join(REPO, "docs")
  nested = []
  for dirpath, dirnames, filenames in os.walk(docs):
    dirnames[:] = sorted(d for d in dirnames if d != "journal")
    if dirpath != docs:
      nested.extend(os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".md"))
  return doc_paths() + nested


# `tests/test_x.py::name`, `tests/test_x.py::Class::method`, a parametrized id `[...]` after it;
# a table cell may leave out the `tests/`.
TEST_CITATION = re.compile(r"(?<![\w/.])((?:tests/)?test_\w+\.py)::(\w+(?:::\w+)?)")


def cited_tests(path):
  """[(line, 'tests/FILE.py', 'name' or 'Class::method')] cited in one markdown file."""
  found = []
  with open(path, encoding="utf-8") as f:
    for n, line in enumerate(f, 1):
      for m in TEST_CITATION.finditer(line):
        file = m.group(1) if m.group(1).startswith("tests/") else "tests/" + m.group(1)
        found.append((n, file, m.group(2)))
  return found


def test_names(path):
  """The test names a test file defines, read with ast (nothing imported): top-level functions
  and classes, and `Class::method`; None when there is no such file."""
  if not os.path.isfile(path):
    return None
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read())
  names = set()
  for node in tree.body:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      names.add(node.name)
    if isinstance(node, ast.ClassDef):
      names.update(f"{node.name}::{m.name}" for m in node.body
                   if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)))
  return names


DOTTED = re.compile(r"(?<![\w./-])((?:attn|kernels)(?:\.[A-Za-z_]\w*)+)")


def cited_names(path):
  """[(line, dotted name)] of `attn.…` and `kernels.…` names in one markdown file's inline code
  spans (fenced blocks are left out: a shell block's commands are checked as commands, and a
  python block may sketch code to write, e.g. a new application's `attn.apps.name.task`)."""
  with open(path, encoding="utf-8") as f:
    lines = f.read().split("\n")
  found, prose, block, fence = [], [], None, None
  for n, line in enumerate(lines, 1):
    m = re.match(r"^\s*(```+|~~~+)", line)
    if block is None and m:
      fence, block = m.group(1), []
      continue
    if block is not None:
      if line.strip().startswith(fence):
        block = None
      continue
    prose.append((n, line))
  text = "\n".join(line for _, line in prose)
  starts = [0]
  for _, line in prose:
    starts.append(starts[-1] + len(line) + 1)
  for m in re.finditer(r"(?<!`)`([^`]+)`(?!`)", text):
    line_no = prose[max(i for i, s in enumerate(starts) if s <= m.start())][0]
    found.extend((line_no, d.group(1)) for d in DOTTED.finditer(m.group(1)))
  return found


def unresolved(names):
  """The dotted names (of cited_names) that are neither a module nor an attribute of one, in
  this process: the longest importable prefix, then attributes (a dataclass field without a
  default counts)."""
  import importlib  # pylint: disable=import-outside-toplevel
  import attn.apps  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  bad = []
  for name in names:
    parts, obj = name.split("."), None
    for i in range(len(parts), 0, -1):
      try:
        obj = importlib.import_module(".".join(parts[:i]))
        break
      except ModuleNotFoundError as e:
        if not (e.name and ".".join(parts[:i]).startswith(e.name)):
          raise  # the module exists but imports something missing: a real error
    rest = parts[i:] if obj is not None else parts
    for attr in rest:
      fields = getattr(obj, "__dataclass_fields__", {})
      if obj is None or not (hasattr(obj, attr) or attr in fields):
        bad.append(name)
        break
      obj = getattr(obj, attr, None)
  return bad


def _no_run(main, *args, **kwargs):
  """absl.app.run / cli.run replaced while a module is defined: main is not run."""
  del main, args, kwargs


def _new_flags(before):
  from absl import flags  # pylint: disable=import-outside-toplevel
  for name in [n for n in list(flags.FLAGS) if n not in before]:
    with contextlib.suppress(AttributeError):
      delattr(flags.FLAGS, name)


def _check_module(module, commands):
  """{index: error} for the commands of one experiments module (see the module docstring). Each
  command defines the module's flags afresh in a clean argv (its own), so that nothing one
  command set (sys.argv, a parsed --config, an override flag) is seen by the next: a default
  --config is loaded as a user without --config would load it."""
  from absl import app, flags  # pylint: disable=import-outside-toplevel
  from attn.launching import cli  # pylint: disable=import-outside-toplevel
  errors = {}
  before, saved_argv = set(flags.FLAGS), sys.argv
  real = app.run, cli.run
  app.run, cli.run = _no_run, _no_run
  try:
    for i, cmd in commands:
      if cmd["template"]:  # a reference to a command written out elsewhere: the import checks it
        argv = [module]
      else:
        argv = [module] + list(cmd["args"])
      sys.argv = list(argv)  # ml_collections reads the --config.* overrides from sys.argv
      try:
        with contextlib.redirect_stdout(io.StringIO()):
          namespace = runpy.run_module(module, run_name="__main__", alter_sys=True)
      except ImportError as e:
        errors[i] = f"python -m {module}: the module cannot be imported ({e})"
        continue
      except Exception as e:  # pylint: disable=broad-except
        errors[i] = f"python -m {module}: defining its flags failed: {type(e).__name__}: {e}"
        continue
      finally:
        sys.argv = list(argv)
      if cmd["template"]:
        _new_flags(before)
        continue
      stderr = io.StringIO()
      try:
        flags.FLAGS.unparse_flags()
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
          cli.parse_flags(argv)
          if "validate_config" in namespace:
            namespace["validate_config"](flags.FLAGS.config)
          elif "config" in flags.FLAGS and flags.FLAGS["config"].present == 0:
            flags.FLAGS.config  # pylint: disable=pointless-statement  (loads the default file)
      except SystemExit as e:
        errors[i] = stderr.getvalue().strip() or f"exit status {e.code}"
      except Exception as e:  # pylint: disable=broad-except
        errors[i] = f"{type(e).__name__}: {e}"
      finally:
        _new_flags(before)
  finally:
    app.run, cli.run = real
    sys.argv = saved_argv
    _new_flags(before)
  return errors


def _check_launch(cmd):
  """An error line, or None: launch.py's flags plus --dry_run (nothing runs or is written)."""
  from absl import flags  # pylint: disable=import-outside-toplevel
  import launch  # pylint: disable=import-outside-toplevel
  from attn.launching import sweeps  # pylint: disable=import-outside-toplevel
  argv = ["launch.py"] + list(cmd["args"]) + ["--dry_run"]
  before, stderr = set(flags.FLAGS), io.StringIO()
  try:
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
      opts = launch.parse_flags(argv)
      status = sweeps.launch(opts, argv)
    return None if status == 0 else (stderr.getvalue().strip() or f"exit status {status}")
  except SystemExit as e:
    return stderr.getvalue().strip() or f"exit status {e.code}"
  except Exception as e:  # pylint: disable=broad-except
    return f"{type(e).__name__}: {e}"
  finally:
    _new_flags(before)


def validate(commands):
  """{index: error} for a list of Command dicts of kinds module and launch (in this process)."""
  warnings.filterwarnings("ignore", message=".*found in sys.modules after import of package")
  errors, by_module = {}, {}
  for i, cmd in enumerate(commands):
    if cmd["kind"] == "module":
      by_module.setdefault(cmd["target"], []).append((i, cmd))
    elif cmd["kind"] == "launch" and not cmd["template"]:
      error = _check_launch(cmd)
      if error:
        errors[i] = error
  for module, cmds in by_module.items():
    errors.update(_check_module(module, cmds))
  return errors


if __name__ == "__main__":
  # python tests/docs_commands.py [--names] IN.json OUT.json, from the repository root
  sys.path.insert(0, REPO)
  names_only = sys.argv[1] == "--names"
  source, out = sys.argv[1 + names_only:3 + names_only]
  with open(source) as f:
    todo = json.load(f)
  result = unresolved(todo) if names_only else validate(todo)
  with open(out, "w") as f:
    json.dump(result if names_only else {str(k): v for k, v in result.items()}, f)
