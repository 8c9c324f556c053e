"""What the CPU says of itself: the first processor's block of /proc/cpuinfo, read for the
benchmarks' headers (attn.benchmarks.harness) and the compute-dtype cache's key
(attn.training.dtype_choice)."""

from __future__ import annotations


def cpuinfo_fields(text: str | None = None) -> dict[str, str] | None:
  """{field: value} of the first processor's block of /proc/cpuinfo (or of `text`, that file's
  text; every processor's block agrees on the model and flags), first occurrence of each field;
  None where the file cannot be read (not Linux)."""
  if text is None:
    text = _proc_cpuinfo()
    if text is None:
      return None
  fields = {}
  for line in text.splitlines():
    key, _, value = line.partition(":")
    fields.setdefault(key.strip(), value.strip())
  return fields


def _proc_cpuinfo() -> str | None:
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      return f.read()
  except OSError:
    return None
