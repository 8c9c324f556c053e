"""The project's error types: user mistakes, reported by the entry points as one line.

Anything that is not an `AttnError` is a bug and keeps its traceback. Both kinds also subclass
ValueError, so library callers that catch ValueError keep working.
"""


class AttnError(Exception):
  """A mistake the user can fix (a config value, a file, a workdir): `str(err)` says what and where."""


class ConfigError(AttnError, ValueError):
  """A bad config value or an unknown config field."""


class DataError(AttnError, ValueError):
  """Bad input data or data config: one line that says what and where, meant to end the run early."""
