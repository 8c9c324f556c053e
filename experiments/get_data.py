r"""Downloads a published dataset into the layout its data preset reads.

    python -m experiments.get_data multi30k --dir=data    # data/multi30k/train.de.gz, ... (22 files)
    python -m experiments.get_data aeslc --dir=data       # data/aeslc/master.zip, train/dev/test.jsonl.gz
    python -m experiments.translate --config=experiments/configs/translate.py:multi30k \
        --config.data.dir=data/multi30k --workdir=workdirs/m30k

NAME is one of attn/data/downloads_catalog.py's datasets (each file pinned by size and SHA-256).
Files already there and verified are not downloaded again; an interrupted download resumes; a
file that does not match its pin is refused with one `error:` line (exit 2) naming it, and a
download that does not match is deleted. `--base_url=URL` fetches URL/<file name> instead (a
mirror). With --dir=D, `ATTN_SHARED_DATA=D` also points every preset there.
"""

from __future__ import annotations

import dataclasses
import functools

from absl import flags

from attn.config.configurable import option
from attn.errors import DataError
from attn.launching import cli


@dataclasses.dataclass(frozen=True)
class GetDataSettings:
  """The flags of `python -m experiments.get_data NAME`."""
  dir: str | None = option(None, "Where the data goes: the files land in DIR/NAME.")
  base_url: str | None = option(
      None, "Fetch URL/<file name> instead of the published address (a mirror).")
  files: tuple[str, ...] = option(
      (), "Only these files of the dataset (default: all; the JSON lines AESLC's preset reads "
          "are written only when all are fetched).")


def _listing(releases) -> str:
  return "; ".join(f"{name} ({r.title}; licence: {r.licence})" for name, r in releases.items())


def main(argv):
  from attn.data import downloads, downloads_catalog  # pylint: disable=import-outside-toplevel
  releases = downloads_catalog.RELEASES
  names = argv[1:]
  if len(names) != 1:
    raise DataError(f"give one dataset NAME (python -m experiments.get_data NAME --dir=DIR); "
                    f"known: {_listing(releases)}")
  settings = cli.settings_from_flags(GetDataSettings)
  release = releases.get(names[0])
  release.select(settings.files)  # an unknown file name fails before anything is written
  progress = functools.partial(print, flush=True)
  progress(f"{release.name}: {release.title}; licence: {release.licence}")
  directory = downloads.fetch(release, settings.dir, base_url=settings.base_url,
                              names=settings.files, progress=progress)
  print(f"done: the data presets read it with --config.data.dir={directory}")


if __name__ == "__main__":
  cli.define_settings_flags(GetDataSettings)
  flags.mark_flags_as_required(["dir"])
  cli.run(main)
