"""The run's working directory: created and checked once, locked against a second run, and bound
to the model its checkpoints hold.

- `prepare(workdir)`: creates it; a path that is a file or cannot be written is a WorkdirError.
- `lock(workdir)`: an exclusive `flock` on `<workdir>/.lock` for the whole run. A second run on
  the same workdir fails at once naming the holder's PID; the kernel drops the lock when its
  process dies, so a `kill -9`ed run never leaves it stuck. A run over several processes
  (jax.distributed) is one run: process 0 alone takes the lock and tells the others whether it
  got it, so a busy workdir stops every process. (One lock per process would not work: on one
  machine the second process of the same run would find the first one's lock; on a shared
  filesystem across hosts flock may not reach the other hosts at all.)
- `claim(workdir, application)`: a workdir holds the runs of one application (attn/apps/<name>/), named
  in `application.json` before anything else is written; any entry point given the workdir of
  another application refuses it before writing anything (it would overwrite that run's
  model.json, or fail later on its checkpoints).
- `check_model(workdir, model_config)`: a workdir whose checkpoints were written for another
  model refuses to resume with this one, naming the differing fields; `record_model` writes the
  record (model.json) that later runs compare against.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import os

from attn.common import applications
from attn.errors import AttnError
from attn.models.config import migrate_model_section
from attn.common.files import read_json, write_json

LOCK_FILE = ".lock"
MODEL_RECORD = "model.json"
APPLICATION_RECORD = "application.json"


class WorkdirError(AttnError):
  """The workdir cannot be used: not a directory, not writable, in use, or another model's."""


def prepare(workdir: str) -> str:
  """Creates `workdir` (and parents) and checks it is a writable directory; returns its path."""
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise WorkdirError(f"workdir {workdir} exists and is not a directory")
  try:
    os.makedirs(workdir, exist_ok=True)
  except OSError as e:
    raise WorkdirError(f"cannot create workdir {workdir}: {e.strerror or e}") from None
  probe = os.path.join(workdir, f".write_test.{os.getpid()}")  # one per process: hosts share it
  try:
    with open(probe, "w") as f:
      f.write("ok")
    os.unlink(probe)
  except OSError as e:
    raise WorkdirError(f"workdir {workdir} is not writable: {e.strerror or e}") from None
  return workdir


def recorded_application(workdir: str) -> str | None:
  """The application whose run `workdir` holds: its application.json, else (a run written before
  that record) the one its finished results name (attn.common.applications: results.json's or
  metrics.jsonl's scores, or an application's own results file); None for a new workdir.
  WorkdirError for an application.json that does not name one (`_application_record`)."""
  held = _application_record(os.path.join(workdir, APPLICATION_RECORD))
  if held is not None:
    return held
  return applications.app_of_records(workdir) or applications.app_of_workdir(workdir)


def _application_record(path: str) -> str | None:
  """The application application.json at `path` names; None when there is no such file.

  A record that is there but unreadable, not JSON, or not an object naming the application is a
  WorkdirError (one line naming the file and what is wrong): guessing would either overwrite
  another application's run or refuse this one's for a reason the user cannot see. (write_json
  replaces it atomically, so a run killed mid-write never leaves it cut short.)"""
  try:
    with open(path, encoding="utf-8") as f:
      text = f.read()
  except FileNotFoundError:
    return None
  except (OSError, UnicodeDecodeError) as e:
    raise WorkdirError(f"{path} cannot be read: {getattr(e, 'strerror', None) or e}") from None
  expected = 'an object naming the application, {"application": "<name>"}'
  try:
    record = json.loads(text)
  except ValueError as e:
    raise WorkdirError(f"{path} is not valid JSON ({e}); it should hold {expected}: fix it, or "
                       "delete it if the workdir holds no run") from None
  if not isinstance(record, dict):
    kind = {list: "list", str: "string", bool: "boolean", type(None): "null"}.get(
        type(record), "number")
    raise WorkdirError(f"{path} holds a JSON {kind}, not {expected}: fix it, or delete it if "
                       "the workdir holds no run")
  name = record.get("application")
  if not isinstance(name, str) or not name:
    raise WorkdirError(f"{path} has no application name (application={name!r}); it should hold "
                       f"{expected}: fix it, or delete it if the workdir holds no run")
  return name


def claim(workdir: str, application: str) -> None:
  """Binds `workdir` to `application` (writes application.json when it has none); WorkdirError
  when it holds a run of another application. Call before anything else is written."""
  from attn.training import distributed  # pylint: disable=import-outside-toplevel
  held = recorded_application(workdir) if os.path.isdir(workdir) else None
  if held is not None and held != application:
    raise WorkdirError(f"workdir {workdir} holds a {held} run; a {application} run would "
                       f"overwrite its files: use another --workdir (or run {held} there)")
  if held is None and distributed.is_primary():
    write_json(os.path.join(workdir, APPLICATION_RECORD), {"application": application})


@contextlib.contextmanager
def lock(workdir: str):
  """Holds the workdir's run lock for the duration of the block (see the module docstring)."""
  from attn.training import distributed  # pylint: disable=import-outside-toplevel
  if not distributed.is_primary():
    if not distributed.agree(False):  # process 0's outcome
      raise WorkdirError(f"workdir {workdir} is in use by another run (process 0 of this run "
                         "could not lock it)")
    yield
    return
  with contextlib.ExitStack() as held:
    try:
      held.enter_context(_flock(workdir))
    except BaseException:
      distributed.agree(False)
      raise
    distributed.agree(True)
    yield


@contextlib.contextmanager
def _flock(workdir: str):
  path = os.path.join(workdir, LOCK_FILE)
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      if e.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
        raise
      with open(path) as f:
        holder = f.read().strip() or "unknown"
      raise WorkdirError(f"workdir {workdir} is in use by another run (process {holder}); wait "
                         f"for it to finish or use another --workdir") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    yield
  finally:
    os.close(fd)  # closing drops the flock


def _record_path(workdir):
  return os.path.join(workdir, MODEL_RECORD)


def has_checkpoints(workdir: str) -> bool:
  """True when `checkpoints/` or `best/` holds a committed step."""
  for sub in ("checkpoints", "best"):
    d = os.path.join(workdir, sub)
    if os.path.isdir(d) and any(n.isdigit() for n in os.listdir(d)):
      return True
  return False


def _recorded_model(workdir):
  """The model the workdir's checkpoints hold: model.json, else (older workdirs) config.json's
  `model` section; in today's layout (a record written before each architecture had its own
  section is migrated: attn.models.config.migrate_model_section); None when there is neither."""
  for path, pick in ((_record_path(workdir), lambda d: d),
                     (os.path.join(workdir, "config.json"), lambda d: d.get("model"))):
    record = read_json(path)
    if isinstance(record, dict):
      found = pick(record)
      return None if found is None else migrate_model_section(found)
  return None


def _flat(record: dict, prefix: str = "") -> dict:
  """{"rnn": {"cell": "gru"}} -> {"rnn.cell": "gru"}: every setting under its dotted path."""
  out = {}
  for k, v in record.items():
    out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
  return out


def check_model(workdir: str, model_config) -> dict:
  """Refuses a workdir whose checkpoints were written for another model (see the module doc).

  A field the model config lists in `SWITCH_ON_WHEN_RESUMING` (dotted paths, e.g. rnn.coverage,
  trained on for a last phase) may go from False to True. Returns, by path, each such field that
  is on now with its value before the switch (False), for restoring checkpoints written before
  it; also when the record already says True, since a record written by older code may claim a
  switch no checkpoint was trained with ({} if none is on)."""
  if not has_checkpoints(workdir):
    return {}
  recorded = _recorded_model(workdir)
  if recorded is None:
    return {}
  recorded, current = _flat(recorded), _flat(model_record(model_config))
  allowed = getattr(model_config, "SWITCH_ON_WHEN_RESUMING", ())
  switched = {k: False for k in allowed
              if recorded.get(k) in (False, True) and current.get(k) is True}
  differ = sorted(k for k in set(recorded) & set(current)
                  if recorded[k] != current[k] and k not in switched)
  if differ:
    shown = ", ".join(f"model.{k}={recorded[k]!r} there, {current[k]!r} here" for k in differ)
    raise WorkdirError(f"workdir {workdir} holds checkpoints of another model ({shown}); resume "
                       f"with its settings or use another --workdir")
  return switched


def model_record(model_config) -> dict:
  """The settings of a model config as model.json records them: its `record()`, or for a
  dataclass without one, every field."""
  if hasattr(model_config, "record"):
    return model_config.record()
  return dataclasses.asdict(model_config)


def record_model(workdir: str, model_config) -> None:
  """model.json: the settings of the model the checkpoints hold (`model_record`)."""
  write_json(_record_path(workdir), model_record(model_config))
