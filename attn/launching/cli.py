"""What every experiment entry point shares: settings as flags, flag parsing, logging set-up and
one-line errors for user mistakes.

    @dataclasses.dataclass(frozen=True)
    class BenchSettings:                       # the one home of each default and its help
      steps: int = configurable.option(100, "timed steps")

    def main(argv):
      settings = cli.settings_from_flags(BenchSettings)

    if __name__ == "__main__":
      cli.define_settings_flags(BenchSettings)   # --steps=100
      cli.run(main)

Training experiments take `--config=FILE:PRESET --config.KEY=VALUE` (ml_collections, built from
the same dataclasses by attn.config.configurable); the other entry points take one flag per field
of their settings dataclass.

A user mistake ends the run with one `error: ...` line on stderr and exit status 2: a bad flag or
config override (a misspelled field gets ml_collections' suggestion), an unknown preset, a
missing config file, or an `attn.errors.AttnError` raised by the library (a config value, a data
file, a workdir). Ctrl-C exits with status 130 (the training loop saves a checkpoint first), at
once: `exit_now` does not tear the interpreter down under native threads still running. Any
other exception is a bug and keeps its traceback.

Every entry point keeps the programs XLA compiles in the persistent compilation cache
(attn.common.compile_cache: ~/.cache/attn/xla, ATTN_COMPILE_CACHE=off to turn it off), so a
resumed run or the next run with the same shapes loads them instead of compiling again.
"""

import dataclasses
import logging
import os
import re
import sys

from absl import app, flags

from attn.common import compile_cache
from attn.config import configurable
from attn.errors import AttnError, ConfigError

USAGE_ERROR = 2
INTERRUPTED = 130  # 128 + SIGINT, what shells report for Ctrl-C


def last_line(text: str) -> str:
  """The exception line of an embedded traceback (config-file errors arrive as flag errors
  whose message holds the whole traceback), without its `module.Class: ` prefix."""
  lines = [l.strip() for l in str(text).splitlines() if l.strip()]
  if not any(l.startswith("Traceback") for l in lines):
    return " ".join(lines)
  last = lines[-1]
  head, sep, rest = last.partition(": ")
  return rest if sep and " " not in head else last


def fail(message: str):
  print(f"error: {message}", file=sys.stderr)
  sys.exit(USAGE_ERROR)


def describe_flag_error(e: BaseException, argv) -> str:
  """One line for an exception raised while parsing `--config=FILE:PRESET --config.KEY=VALUE`
  flags (ml_collections raises a different type for each kind of mistake)."""
  if isinstance(e, flags.Error):  # a bad value or flag; config-file errors embed a traceback
    return last_line(e)
  if isinstance(e, OSError):  # a config file that cannot be read
    return "config file: " + str(e).strip().splitlines()[-1].strip()
  if isinstance(e, (AttributeError, KeyError)):  # an override of a field the config lacks
    text = str(e).replace("\\n", "\n").replace("\\'", "'")
    field = re.search(r"'(\w+)'", text)
    field = field.group(1) if field else text.strip("'\"")
    hint = re.search(r"Did you mean[^\n]*\?", text)
    keys = [a.split("=", 1)[0][len("--config."):] for a in argv if a.startswith("--config.")]
    key = next((k for k in keys if field in k.split(".")), field)
    moved = configurable.MOVED.get(key)
    return (f"--config.{key}: the config has no such field"
            + (f"; it moved to {moved}" if moved else f" ({hint.group(0)})" if hint else ""))
  return str(e)


def parse_flags(argv):
  """absl flag parsing with user mistakes reported as one line (see the module docstring)."""
  try:
    rest = flags.FLAGS(argv)
    if "config" in flags.FLAGS and flags.FLAGS.config is not None:
      # A config file that failed to load becomes a placeholder raising on first use: use it now.
      flags.FLAGS.config.keys()  # pylint: disable=pointless-statement
    return rest
  except (flags.Error, AttributeError, KeyError, OSError) as e:
    fail(describe_flag_error(e, argv))
  except AttnError as e:
    fail(str(e))


def _drop_orbax_save_errors(record: logging.LogRecord) -> bool:
  """A failed save is reported once, as the run's one error line (attn.training.checkpoints);
  orbax's worker threads, and asyncio for orbax's abandoned write tasks, would each print their
  own traceback of it first."""
  if record.levelno < logging.ERROR:
    return True
  return not (f"{os.sep}orbax{os.sep}" in record.pathname or "orbax" in record.getMessage())


def _quiet_closed_loop_callbacks():
  """After a failed checkpoint write, tensorstore still completes the write's other chunks and
  calls back into orbax's event loop, which is closed by then; each callback's RuntimeError
  would print a traceback after the one error line. Those, and only those, are dropped."""
  default = sys.unraisablehook  # tensorstore reports callback errors as unraisable

  def hook(unraisable):
    if (unraisable.exc_type is RuntimeError
        and str(unraisable.exc_value) == "Event loop is closed"):
      return
    default(unraisable)

  sys.unraisablehook = hook


def define_distributed_flags():
  """Flags of a run over several processes (jax.distributed); read by `start_distributed`."""
  flags.DEFINE_enum("distributed", "none", ["none", "auto"],
                    "auto: start jax.distributed from the cluster's environment (Slurm, Cloud TPU "
                    "pod); none: one process, unless the explicit flags below are given.")
  flags.DEFINE_string("coordinator_address", None,
                      "host:port of process 0, for a run over several processes without a "
                      "cluster manager (e.g. 127.0.0.1:12355 for local processes).")
  flags.DEFINE_integer("num_processes", None, "Processes in the run (with --coordinator_address).")
  flags.DEFINE_integer("process_id", None, "This process's index in [0, --num_processes).")


def start_distributed() -> bool:
  """jax.distributed from the flags of `define_distributed_flags`, before any JAX computation;
  processes other than 0 then log warnings only. Returns whether it started."""
  from attn.training import distributed  # pylint: disable=import-outside-toplevel
  f = flags.FLAGS
  started = distributed.initialize(f.distributed, coordinator_address=f.coordinator_address,
                                   num_processes=f.num_processes, process_id=f.process_id)
  if started and not distributed.is_primary():
    logging.getLogger("attn").setLevel(logging.WARNING)  # process 0 reports the progress
  return started


def run(main):
  """`absl.app.run(main)` with the project's conventions (see the module docstring)."""

  def guarded(argv):
    # Library code logs through stdlib loggers (attn.*), which absl's handler prints; orbax logs
    # through absl's own logger at INFO on every save, so that one is kept to warnings.
    absl_logger = logging.getLogger("absl")
    absl_logger.setLevel(logging.WARNING)
    absl_logger.addFilter(_drop_orbax_save_errors)
    logging.getLogger("asyncio").addFilter(_drop_orbax_save_errors)
    # JAX says at INFO which backends it could not start (no libtpu, no GPU) on every run.
    logging.getLogger("jax").setLevel(logging.WARNING)
    _quiet_closed_loop_callbacks()
    compile_cache.enable()  # before main compiles anything
    try:
      return main(argv)
    except AttnError as e:
      fail(str(e))
    except KeyboardInterrupt:
      print("interrupted", file=sys.stderr)
      exit_now(INTERRUPTED)

  app.run(guarded, flags_parser=parse_flags)


def exit_now(status: int):
  """Ends the process with `status` without the interpreter's teardown. After Ctrl-C the run has
  saved what it keeps and closed its checkpointer, but native threads (XLA's compiler and
  dispatch pools, tensorstore's, grain's readers) may still be running: tearing Python down under
  them can end a Ctrl-C'd run killed by the signal (status -2) instead of exiting 130, or in a
  segmentation fault (139). Log handlers and the standard streams are flushed
  first, so every line printed before still arrives."""
  logging.shutdown()
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (OSError, ValueError):  # a closed pipe: nothing more can be shown anyway
      pass
  os._exit(status)  # pylint: disable=protected-access


def _calling_module(depth: int = 2) -> str:
  """The name absl files a flag under for the module `depth` frames up (the main module by its
  path, as absl does)."""
  name = sys._getframe(depth).f_globals.get("__name__", "")  # pylint: disable=protected-access
  return sys.argv[0] if name == "__main__" else name


def define_training_flags(default_config: str) -> None:
  """A training experiment's flags: `--config=FILE:PRESET` (locked: a misspelled field fails
  with a suggestion) defaulting to `default_config`, the required `--workdir` and the
  distributed flags. They belong to the calling module (its --help; launch.py reads the
  experiment's own --config default from it)."""
  from ml_collections import config_flags  # pylint: disable=import-outside-toplevel
  module = _calling_module()
  config_flags.DEFINE_config_file("config", default_config, "Experiment config (path.py:preset).",
                                  lock_config=True)
  flags.FLAGS.register_flag_by_module(module, flags.FLAGS["config"])
  flags.DEFINE_string("workdir", None, "Output directory (resumes if it holds a checkpoint).",
                      module_name=module)
  flags.mark_flags_as_required(["workdir"])
  define_distributed_flags()


def training_entry_point(task: str):
  """(validate_config, main) of the training experiment of `task`: validate_config(config) makes
  the checks train_and_evaluate makes before touching a workdir (launch.py runs them on every
  combination of a sweep before starting any); main trains, evaluates and reports."""

  def validate_config(config):
    from attn import training  # pylint: disable=import-outside-toplevel
    training.validate_config(config, task=task)

  def main(argv):
    del argv
    train_and_report(flags.FLAGS.config, flags.FLAGS.workdir, task=task)

  return validate_config, main


def train_and_report(config, workdir: str, task: str) -> None:
  """What a training experiment's main does: joins the cluster (from the distributed flags),
  trains and evaluates `task` in `workdir` (resuming), and prints the results table once."""
  started = start_distributed()  # before any JAX computation
  from attn import training  # pylint: disable=import-outside-toplevel  (after flag parsing)
  results = training.train_and_evaluate(config, workdir, task=task)
  if training.distributed.is_primary():
    print(training.results_table([results]))
  if started:
    training.distributed.shutdown()


def serve(make_server, port: int, path: str = "") -> None:
  """Serves on 127.0.0.1 until Ctrl-C (the way to stop serving, not an interruption of work):
  `make_server()` builds the http.server; a port that cannot be bound is one `error:` line."""
  try:
    server = make_server()
  except OSError as e:
    fail(f"--port={port}: cannot serve on 127.0.0.1 ({e.strerror or e})")
  host, bound = server.server_address[:2]
  try:
    print(f"serving http://{host}:{bound}/{path} (Ctrl-C stops)", flush=True)
    server.serve_forever()
  except KeyboardInterrupt:
    print("stopped")
  finally:
    server.server_close()


def _flag_fields(cls):
  """(flag name, field, section) for each settable field of `cls`; a nested section's fields
  become flags of their own name (names must not clash across sections)."""
  out = []
  for f in configurable.settable_fields(cls):
    if configurable.is_section(f.default):
      out += [(name, sub, f.name) for name, sub, _ in _flag_fields(type(f.default))]
    else:
      out.append((f.name, f, None))
  names = [n for n, _, _ in out]
  clash = sorted({n for n in names if names.count(n) > 1})
  if clash:
    raise ValueError(f"{cls.__name__}: fields {clash} appear in several sections")
  return out


def _scalar_type(f) -> type:
  """The type of a scalar field: its default's, or for a None default the annotation's
  (`int | None`: int); str when neither says."""
  if f.default is not None:
    return type(f.default)
  text = str(f.type).replace(" ", "")
  return next((t for t in (bool, int, float) if f"{t.__name__}|" in text
               or f"|{t.__name__}" in text or f"Optional[{t.__name__}]" in text), str)


_DEFINE = {bool: flags.DEFINE_bool, int: flags.DEFINE_integer, float: flags.DEFINE_float,
           str: flags.DEFINE_string}


def define_settings_flags(cls, *, skip=(), flag_values=flags.FLAGS) -> None:
  """One absl flag per settable field of the settings dataclass `cls` (nested sections
  flattened), named as the field, with the field's default and help; `skip` names fields the entry
  point defines itself. Tuples become comma-separated list flags; a field whose default is None
  takes its flag type from its annotation (`int | None = None`: an integer flag, unset). The
  flags belong to the calling module, so its --help lists them."""
  module = _calling_module()
  for name, f, _ in _flag_fields(cls):
    if name in skip:
      continue
    default, help_ = f.default, f.metadata.get("help", "")
    if isinstance(default, tuple):
      flags.DEFINE_list(name, [_as_text(v) for v in default], help_, flag_values=flag_values,
                        module_name=module)
      continue
    kind = _scalar_type(f)
    if kind not in _DEFINE:
      raise TypeError(f"{cls.__name__}.{name}: no flag type for {kind.__name__}")
    _DEFINE[kind](name, default, help_, flag_values=flag_values, module_name=module)


def _as_text(v) -> str:
  """A list flag's default element as typed on a command line (booleans lower-case)."""
  return str(v).lower() if isinstance(v, bool) else str(v)


def _element_type(f) -> type:
  """The element type of a tuple field, from its annotation (`tuple[float, ...]`) or default."""
  text = str(f.type)
  for t in (int, float, bool):
    if f"[{t.__name__}," in text.replace(" ", ""):
      return t
  return type(f.default[0]) if f.default else str


_TRUTH = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def _parse(kind: type, text):
  """A list flag's element as `kind`; ValueError if it is not one (bool: true/false, 1/0)."""
  if kind is bool:
    if str(text).lower() not in _TRUTH:
      raise ValueError(text)
    return _TRUTH[str(text).lower()]
  return kind(text)


def settings_from_flags(cls, *, flag_values=flags.FLAGS, **given):
  """`cls` built from the flags of `define_settings_flags(cls)`, then `given` (values the entry
  point derives itself). A list element of the wrong type is a ConfigError naming the flag; the
  dataclass's own validation does the rest."""
  values, sections = {}, {}
  for name, f, section in _flag_fields(cls):
    if name in given or name not in flag_values:
      continue
    value = flag_values[name].value
    if isinstance(f.default, tuple):
      kind = _element_type(f)
      try:
        value = tuple(_parse(kind, v) for v in value)
      except ValueError:
        raise ConfigError(f"--{name}: {','.join(map(str, value))} are not all {kind.__name__} "
                          "values") from None
    (sections.setdefault(section, {}) if section else values)[name] = value
  for section, fields in sections.items():
    default = next(f.default for f in dataclasses.fields(cls) if f.name == section)
    values[section] = dataclasses.replace(default, **fields)
  return cls(**values, **given)
