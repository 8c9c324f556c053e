"""A full disk for a child Python process: RLIMIT_FSIZE, set inside the child (a fork hook in a
multithreaded parent must be avoided), with SIGXFSZ ignored so an oversized write fails with
EFBIG (`File too large`), as ENOSPC would, instead of killing the process."""


def prelude(max_file_bytes: int) -> str:
  """Python statements to run first in the child: no file may grow past `max_file_bytes`."""
  return ("import resource, signal; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
          f"resource.setrlimit(resource.RLIMIT_FSIZE, ({max_file_bytes}, {max_file_bytes}))\n")
