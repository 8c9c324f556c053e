"""The datasets `python -m experiments.get_data NAME --dir=DIR` fetches, each a `downloads.Release`
registered under NAME; its files go to DIR/NAME, the directory its data preset reads
(experiments/configs/data.py). A new dataset is one more `RELEASES.add` here.

- multi30k: the raw files of Multi30k task 1 (github.com/multi30k/dataset, data/task1/raw), pinned
  to commit a3d2e0d: train, val, test_2016_flickr, test_2017_flickr, test_2017_mscoco,
  test_2018_flickr in each published language (en, de, fr; cs for train, val, test_2016_flickr
  and test_2018_flickr), gzip text, one sentence a line.
- aeslc: the AESLC repository's zip (github.com/ryanzhumich/AESLC, master.zip; the pin is the one
  TensorFlow Datasets registers for the same URL), written as train/dev/test.jsonl.gz with the
  dev/test annotations (attn/data/aeslc.py).
"""

from __future__ import annotations

import os

from attn.data import aeslc
from attn.data.downloads import FileSpec, Release
from attn.errors import DataError
from attn.registry import Registry

RELEASES = Registry("dataset", error=DataError)

_MULTI30K_COMMIT = "a3d2e0d26b56f3846f66a952536ffed4e401d05a"
_MULTI30K_FILES = (
    ("train.de.gz", 637044, "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6"),
    ("train.en.gz", 568929, "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f"),
    ("train.fr.gz", 604242, "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c"),
    ("train.cs.gz", 593827, "a65adb8b32e3bc664f21ecba7a6e7f6950fd1f405e135f7c312faabdb6255077"),
    ("val.de.gz", 24681, "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a"),
    ("val.en.gz", 21650, "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28"),
    ("val.fr.gz", 23001, "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9"),
    ("val.cs.gz", 22096, "b63226e05c4bd5dd6a42897d74b86a1b9d2c31498252c572b1ea7f7996927fcc"),
    ("test_2016_flickr.de.gz", 22890,
     "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8"),
    ("test_2016_flickr.en.gz", 21077,
     "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9"),
    ("test_2016_flickr.fr.gz", 22310,
     "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90"),
    ("test_2016_flickr.cs.gz", 22572,
     "200a4a74cc9560f051924abb9803be008d1908d77f747e9141aeb86dfd2797f1"),
    ("test_2017_flickr.de.gz", 21471,
     "a2c89666db00c495cd8513b9d708d5a3acc205d7de312ef2bf5fb7ebc1540aee"),
    ("test_2017_flickr.en.gz", 19138,
     "76a444ee25172e72695cddb13ae4a3bda59430617be88e0bb46b60504f054074"),
    ("test_2017_flickr.fr.gz", 20434,
     "3ba671ceb2299f3304ffafefea7a833d08632fbaf0ba18546f8a2ec2391af496"),
    ("test_2017_mscoco.de.gz", 10230,
     "799e4854c25d601cb6cb6be29eabe5667734c61ace2f495e03e429031a0bc338"),
    ("test_2017_mscoco.en.gz", 8844,
     "aab300bfb4427697987e02cd0aacd44bfe8aa50456231b6474c08038bbed2b58"),
    ("test_2017_mscoco.fr.gz", 9751,
     "754f3072ba9f124569ba5258b32730fc1d214bbf8e0c6dfb2b74401676220db0"),
    ("test_2018_flickr.de.gz", 26461,
     "ddd0130c7d97482dc5197a02141dae8dd79f20f03586c480d675c09a32daf608"),
    ("test_2018_flickr.en.gz", 23514,
     "ef4f4844037d4c5dea75c9a8ed5fd78905967a26f67c255e230cc9780032654d"),
    ("test_2018_flickr.fr.gz", 25321,
     "fb2b83fcceb937a4f7e3e93c1c51c22aba92f1e342391e6b5ba392b16a920501"),
    ("test_2018_flickr.cs.gz", 25181,
     "7d0a9db904f94c554a8c58049a9f3a5357c27f46cc3d710d70cb0b4a2585b8c2"),
)

RELEASES.add("multi30k", Release(
    name="multi30k",
    title="Multi30k task 1 (Elliott et al. 2016), raw text, en/de/fr/cs",
    base_url=("https://raw.githubusercontent.com/multi30k/dataset/"
              f"{_MULTI30K_COMMIT}/data/task1/raw/"),
    files=tuple(FileSpec(*f) for f in _MULTI30K_FILES),
    licence=("no licence file; the repository's README: partly derived from Flickr30K, for "
             "non-commercial research and educational use")))

RELEASES.add("aeslc", Release(
    name="aeslc",
    title="AESLC email -> subject line (Zhang & Tetreault 2019), with dev/test annotations",
    base_url="https://github.com/ryanzhumich/AESLC/archive/",
    files=(FileSpec(aeslc.ZIP_NAME, 11643743,
                    "b5ea2ffb837c5cfb9b033d62b3940a8a2330a9eb69bd2a39a9f55db6a23a40a4"),),
    licence="CC BY-NC-SA 4.0 (non-commercial), the repository's LICENSE.md",
    provides=tuple(aeslc.jsonl_name(s) for s in aeslc.SPLITS),
    prepare=aeslc.write_jsonl))


def missing_file_hint(directory: str, stem: str) -> str:
  """The get_data command that writes `<stem>[.gz]` (a file a data preset reads), as a clause
  for a missing-file error; "" when no registered dataset provides it."""
  providers = [r for _, r in RELEASES.items()
               if stem in r.provided() or stem + ".gz" in r.provided()]
  base = os.path.basename(os.path.normpath(directory))
  chosen = next((r for r in providers if r.name == base), providers[0] if providers else None)
  if chosen is None:
    return ""
  parent = os.path.dirname(os.path.normpath(directory)) or "."
  target = os.path.join(parent, chosen.name)
  return (f"; `python -m experiments.get_data {chosen.name} --dir={parent}` downloads the "
          f"published files to {target}" + ("" if chosen.name == base else
                                             f" (then set data.dir={target})"))
