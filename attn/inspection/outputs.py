"""Where the look-inside tools write: the run's own directory by default, else --out. Checked
before any work, so a run that cannot be written to (an archived run, a colleague's) costs one
line, not a computation and then a traceback."""

from __future__ import annotations

import os

from attn.errors import ConfigError


def cannot_write(directory: str) -> str:
  """Why files cannot be written into `directory` ('' when they can): it, or where it does not
  exist yet its nearest existing parent (it will be created), must be a directory this process
  may write to (os.access: the effective user's permissions and a read-only filesystem)."""
  path = os.path.abspath(directory)
  while not os.path.exists(path) and os.path.dirname(path) != path:
    path = os.path.dirname(path)
  if not os.path.isdir(path):
    return f"{path} is not a directory"
  if not os.access(path, os.W_OK | os.X_OK):
    return f"{path} is not writable"
  return ""


def output_dir(out: str | None, workdir: str, what: str, flag: str | None = None) -> str:
  """The directory `what` goes to: `out` (from --out), else the run directory `workdir`.
  ConfigError (one line) when it cannot be written to; for the run directory, saying to pass
  --out. flag: the --out value as given, for the message (default `out`)."""
  why = cannot_write(out or workdir)
  if why and out is None:
    raise ConfigError(f"cannot write {what} into the run directory ({why}; an archived run, or "
                      "someone else's?): pass --out=DIR to write them elsewhere")
  if why:
    raise ConfigError(f"--out={flag or out}: {why}")
  return out or workdir
