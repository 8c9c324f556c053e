"""The sitting against JoeyNMT (entry point: experiments/bench_peer.py): the peer, ours, the peer
again, on the same machine in one command, so that load from other jobs shows as a difference
between the two peer brackets instead of hiding in the ratio.

Stages, in order (each a subprocess whose output goes to <out>/logs/<stage>.log):
  peer_rnn               JoeyNMT's RNN, `steps` updates (peers/joeynmt_peer.py, the peer's venv)
  peer_rnn_decode        its model decodes the test split (greedy, beam 5)
  peer_ceiling           torch's matmul rate at the sizes of XLA's ceiling (peers/torch_ceiling.py,
                         the peer's venv), before our first bench_train stage
  ours_rnn_bench         experiments.bench_train at JoeyNMT's sizes (float32, bfloat16, auto: the
                         dtype train.compute_dtype=auto chooses here)
  ours_rnn_train         experiments.translate at JoeyNMT's sizes, the same `steps`, 128 sentences
  ours_rnn_decode        experiments.bench_decode of that run (greedy, beam 5 stopping by --beam_stop)
  peer_rnn_again         JoeyNMT's RNN again, `again_steps` updates of a fresh model
  peer_rnn_decode_again  the first bracket's model decodes again
  peer_tfm, ours_tfm_bench, ours_tfm_packed_bench, peer_tfm_again
                         the same bracket for the Transformer's rate, ours in the buckets and
                         on packed rows (data.pack); --rnn=False runs these alone (peer_ceiling
                         after peer_tfm)
Each finished stage leaves <out>/stages/<stage>.json: its command, load averages, wall time and
figures. Each of our bench_train rows says its matmul rate's share of the better of the two
ceilings at the dtype it ran, XLA's (bench_train's own, measured in its run) or torch's
(peer_ceiling), and which one it was (attn.benchmarks.peer_table). Rerunning with the same
--out skips the leading stages that finished with the same command; from the first stage that
runs, every later one runs again, so that a sitting's figures come from one stretch. The table
(<out>/sitting.md) and <out>/sitting.json are built from those records alone.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable

from attn.benchmarks import harness, peer_table
from attn.common import files
from attn.config.configurable import option
from attn.decoding.beam import STOP_RULES
from attn.errors import AttnError, ConfigError
from attn.registry import Registry

PEER_SCRIPT = os.path.join("peers", "joeynmt_peer.py")
CEILING_SCRIPT = os.path.join("peers", "torch_ceiling.py")
# n of the n x n matmuls of both ceilings: bench_train's (XLA's) and peer_ceiling's (torch's).
CEILING_SIZES = (1024, 2048)
PEER_SETUP = ("python3 -m venv .peer-venv && .peer-venv/bin/python -m pip install -r "
              "peers/requirements.txt")
TRANSLATE_CONFIG = "experiments/configs/translate.py"
# Ours at JoeyNMT's sizes: its encoder (512 a direction) and attention width on the preset.
JOEY_SIZES = ("--config.model.rnn.decoder=bahdanau", "--config.model.rnn.enc_hidden=512",
              "--config.model.rnn.d_attn=512")
DATA_FILES = tuple(f"{split}.{lang}.gz" for split in ("train", "val", "test_2016_flickr")
                   for lang in ("de", "en"))


class StageFailed(AttnError):
  """A stage's command failed: which stage, its exit status and where its log is."""


@dataclasses.dataclass(frozen=True)
class Settings:
  """The sitting's settings (experiments/bench_peer.py's flags)."""
  out: str = option("workdirs/peer_sitting", "Records, logs, JoeyNMT's and our runs, the table.")
  peer_python: str = option(".peer-venv/bin/python", "The peer's interpreter (torch, joeynmt): "
                            f"made by `{PEER_SETUP}`.")
  data_dir: str = option("", "The multi30k folder ('' = $ATTN_SHARED_DATA/multi30k, else "
                         "../shared/data/multi30k).")
  steps: int = option(200, "RNN training steps of the first peer bracket and of ours (BLEU "
                      "after equal steps).")
  again_steps: int = option(40, "RNN steps of the peer's second bracket (its rate only).")
  transformer_steps: int = option(40, "Steps of each Transformer peer bracket; 0 = no "
                                  "Transformer brackets.")
  rnn: bool = option(True, "The RNN brackets (peer_rnn to peer_rnn_decode_again); False: the "
                     "Transformer's alone.")
  bench_steps: int = option(20, "bench_train: timed batches per dtype and round.")
  bench_rounds: int = option(2, "bench_train: rounds over the dtypes.")
  compute_dtypes: tuple[str, ...] = option(
      ("float32", "bfloat16", "auto"), "bench_train's dtypes (auto: the one "
      "train.compute_dtype=auto chooses on this machine; its row says which).")
  beam_sizes: tuple[int, ...] = option((1, 5), "Beam sizes decoded (1 = greedy).")
  shrink_to: int = option(16, "Our beam search lets finished examples leave the batch, "
                           "halving it down to this many rows (bench_decode --shrink_to; 0 = "
                           "never). JoeyNMT's beam search drops finished examples too.")
  beam_stop: str = option("k_finished", "Our beam search's stop rule (bench_decode --stops): "
                          "k_finished ends an example once K hypotheses have finished, as "
                          "JoeyNMT's ends it once its K beams have; bound is our exact rule "
                          "(no live hypothesis can still enter the K best), more steps.")
  warmup_steps: int = option(0, "Our run's warm-up steps; 0 = the multi30k preset's share of "
                             "its steps, scaled to --steps.")

  def __post_init__(self):
    for name in ("steps", "again_steps", "bench_steps", "bench_rounds"):
      if getattr(self, name) < 1:
        raise ConfigError(f"--{name}={getattr(self, name)} must be >= 1")
    for name in ("transformer_steps", "warmup_steps", "shrink_to"):
      if getattr(self, name) < 0:
        raise ConfigError(f"--{name}={getattr(self, name)} must be >= 0")
    if not self.beam_sizes or min(self.beam_sizes) < 1:
      raise ConfigError(f"--beam_sizes={','.join(map(str, self.beam_sizes))}: each must be >= 1")
    if not self.compute_dtypes:
      raise ConfigError("--compute_dtypes: name at least one")
    if self.beam_stop not in STOP_RULES:
      raise ConfigError(f"--beam_stop={self.beam_stop!r} unknown; known: "
                        f"{', '.join(STOP_RULES)}")
    if not self.rnn and not self.transformer_steps:
      raise ConfigError("--rnn=False with --transformer_steps=0 leaves no bracket to run")


@dataclasses.dataclass(frozen=True)
class Stage:
  """One subprocess of the sitting. kind: how its figures are read (READERS); output: the file
  they are read from ('' = its log); fresh: a folder removed before it runs (no resuming)."""
  name: str
  kind: str
  command: tuple[str, ...]
  output: str = ""
  fresh: str = ""


def plan(s: Settings, *, data: str, warmup: int, python: str = sys.executable) -> list[Stage]:
  """The sitting's stages, in order (see the module docstring)."""
  raw = lambda name: os.path.join(s.out, "raw", f"{name}.json")
  joey, beams = os.path.join(s.out, "joey"), ",".join(map(str, s.beam_sizes))

  def peer_train(name, arch, run, steps):
    return Stage(name, "peer_train", (s.peer_python, PEER_SCRIPT, "train", f"--arch={arch}",
                                      f"--steps={steps}", f"--data_dir={data}", f"--work={joey}",
                                      f"--run={run}", f"--json_out={raw(name)}"), raw(name))

  def peer_decode(name, tag):
    return Stage(name, "decode", (s.peer_python, PEER_SCRIPT, "decode", f"--data_dir={data}",
                                  f"--work={joey}", "--run=rnn", f"--beam_sizes={beams}",
                                  f"--tag={tag}", f"--json_out={raw(name)}"), raw(name))

  def ours_bench(name, preset, sizes, workdir=""):
    return Stage(name, "bench_train", (
        python, "-m", "experiments.bench_train", f"--config={TRANSLATE_CONFIG}:{preset}",
        *sizes, f"--config.data.dir={data}", f"--compute_dtypes={','.join(s.compute_dtypes)}",
        f"--steps={s.bench_steps}", f"--rounds={s.bench_rounds}",
        f"--ceiling_sizes={','.join(map(str, CEILING_SIZES))}",
        f"--workdir={os.path.join(s.out, 'ours', 'bench_' + (workdir or preset))}"))

  run_dir = os.path.join(s.out, "ours", "rnn")
  train = Stage("ours_rnn_train", "translate", (
      python, "-m", "experiments.translate", f"--config={TRANSLATE_CONFIG}:multi30k",
      *JOEY_SIZES, f"--config.data.dir={data}", f"--config.train.steps={s.steps}",
      f"--config.train.warmup_steps={warmup}", f"--config.train.eval_every={s.steps}",
      f"--config.train.checkpoint_every={s.steps}",
      f"--config.train.log_every={max(1, s.steps // 10)}", "--config.train.beam_size=1",
      "--config.train.eval_decode_sentences=1", "--config.train.max_wall_s=0",
      f"--workdir={run_dir}"), os.path.join(run_dir, "results.json"), fresh=run_dir)
  decode = Stage("ours_rnn_decode", "decode", (
      python, "-m", "experiments.bench_decode", f"--workdir={run_dir}", "--split=test",
      f"--beam_sizes={beams}", f"--shrink_to={s.shrink_to}", f"--stops={s.beam_stop}",
      f"--json_out={raw('ours_rnn_decode')}"), raw("ours_rnn_decode"))
  ceiling = Stage("peer_ceiling", "torch_ceiling", (
      s.peer_python, CEILING_SCRIPT, f"--sizes={','.join(map(str, CEILING_SIZES))}",
      f"--json_out={raw('peer_ceiling')}"), raw("peer_ceiling"))
  stages = [peer_train("peer_rnn", "rnn", "rnn", s.steps), peer_decode("peer_rnn_decode", "1"),
            ceiling, ours_bench("ours_rnn_bench", "multi30k", JOEY_SIZES), train, decode,
            peer_train("peer_rnn_again", "rnn", "rnn_again", s.again_steps),
            peer_decode("peer_rnn_decode_again", "2")] if s.rnn else []
  if s.transformer_steps:
    stages += [peer_train("peer_tfm", "transformer", "tfm", s.transformer_steps),
               *([] if s.rnn else [ceiling]),
               ours_bench("ours_tfm_bench", "multi30k_transformer", ()),
               ours_bench("ours_tfm_packed_bench", "multi30k_transformer",
                          ("--config.data.pack=True",), "multi30k_transformer_packed"),
               peer_train("peer_tfm_again", "transformer", "tfm_again", s.transformer_steps)]
  return stages


def preflight(s: Settings, stages: list[Stage], data: str,
              find_module: Callable = importlib.util.find_spec) -> None:
  """The user's mistakes, each one line, before anything is written: no peer interpreter, no
  data, an entry point missing from this tree."""
  if not (os.path.isfile(s.peer_python) and os.access(s.peer_python, os.X_OK)):
    raise ConfigError(f"--peer_python={s.peer_python}: no such interpreter; make the peer's "
                      f"environment first: {PEER_SETUP}")
  missing = [f for f in DATA_FILES if not os.path.isfile(os.path.join(data, f))]
  if missing:
    raise ConfigError(f"{data}: no multi30k files {', '.join(missing)} (set --data_dir or "
                      "$ATTN_SHARED_DATA)")
  for stage in stages:
    if stage.command[1] == "-m" and find_module(stage.command[2]) is None:
      raise ConfigError(f"stage {stage.name}: python -m {stage.command[2]}: no such module in "
                        "this tree")


# -- reading each kind of stage's figures


def _bench_table(log: str) -> dict:
  """bench_train's table, from its log: {dtype: {median_s_per_step, tokens_per_s, and where the
  table has them: dtype (what ran: `auto (bfloat16)` is read as key auto, dtype bfloat16),
  gflops (the step's matmul rate), xla_ceiling (GFLOP/s; None for n/a)}}."""
  lines = log.splitlines()
  head = next((i for i, l in enumerate(lines) if l.startswith("| compute dtype |")), None)
  if head is None:
    raise ValueError("no '| compute dtype |' table in bench_train's output")
  names = [c.strip() for c in lines[head].strip("|").split("|")]
  out = {}
  for line in lines[head + 2:]:
    if not line.startswith("|"):
      break
    cells = dict(zip(names, (c.strip() for c in line.strip("|").split("|"))))
    number = lambda key: float(cells[key].replace(",", ""))
    label = cells["compute dtype"]
    name, _, ran = label.partition(" (")  # `auto (bfloat16)`: asked auto, ran bfloat16
    name, ran = (name, ran.rstrip(")")) if ran else (label, label.split(",")[0])
    row = {"median_s_per_step": number("median s/step"), "tokens_per_s": number("target tokens/s")}
    if MATMUL_COLUMN in cells:
      row.update(dtype=ran, gflops=number(MATMUL_COLUMN),
                 xla_ceiling=None if cells.get(CEILING_COLUMN, "n/a") == "n/a"
                 else number(CEILING_COLUMN))
    out[name] = row
  return out


MATMUL_COLUMN = "GFLOP/s (matmul)"  # bench_train's table (attn.benchmarks.train_throughput)
CEILING_COLUMN = "ceiling GFLOP/s (same run, best n)"


def _torch_ceiling(result: dict) -> dict:
  """{dtype: the best size's GFLOP/s, "by_size": {dtype: {n: GFLOP/s}}, torch, threads} of
  peers/torch_ceiling.py's record."""
  by_size = {d: {str(n): float(v) for n, v in per.items()} for d, per in result["gflops"].items()}
  return {**{d: max(per.values()) for d, per in by_size.items()}, "by_size": by_size,
          "torch": result.get("torch"), "threads": result.get("threads")}


def _decode(result: dict) -> dict:
  """{sentences, beam<k>: {decode_s, bleu, and the other numbers the decoder reports}} of a
  decode record (bench_decode's or the peer's), whose `score` names the score its results hold:
  the sitting compares BLEU, so a record of another score is refused (ValueError)."""
  if result["score"] != "bleu":
    raise ValueError(f"its outputs are scored by {result['score']}, not bleu: the sitting "
                     "compares the BLEU of translation runs")
  beams = {f"beam{r['beam_size']}": {k: v for k, v in r.items() if isinstance(v, (int, float))}
           for r in result["results"]}
  for figures in beams.values():
    figures["decode_s"], figures["bleu"] = float(figures["decode_s"]), float(figures["bleu"])
  return {"sentences": result["sentences"], **beams}


def _translate(result: dict) -> dict:
  return {"tokens_per_s_steady": result.get("tokens_per_sec_steady"),
          "tokens_per_s": result["tokens_per_sec"], "params": result["params"],
          "step": result["step"], "bleu_greedy": result["bleu"]}


def _peer_train(result: dict) -> dict:
  return {k: v for k, v in result.items() if not isinstance(v, list)}


def _train_line(f: dict) -> str:
  return (f"{f['tokens_per_s']:,.0f} target tokens/s, median {f['median_s_per_step']:.3f} s/step "
          f"over {f['steps']} steps")


def _bench_line(f: dict) -> str:
  ran = lambda d, v: f" ({v['dtype']})" if v.get("dtype", d) != d else ""
  return "; ".join(f"{d}{ran(d, v)} {v['tokens_per_s']:,.0f} target tokens/s"
                   for d, v in f.items())


def _ceiling_line(f: dict) -> str:
  return (f"torch {f['torch']} matmul ceiling: " + ", ".join(
      f"{d} {f[d]:.0f}" for d in f["by_size"]) + " GFLOP/s (best of "
      + ", ".join(f"{n}^2" for n in next(iter(f["by_size"].values()))) + ")")


def _translate_line(f: dict) -> str:
  return (f"step {f['step']}: {f['tokens_per_s_steady'] or 0:,.0f} target tokens/s steady "
          f"(training loop), test BLEU greedy {f['bleu_greedy']:.2f}")


def _decode_line(f: dict) -> str:
  # bench_decode's records also say how much of the matmul ceiling the decoding's work ran at
  share = lambda v: (f", matmuls at {v['percent_of_ceiling']:.0f}% of the ceiling"
                     if "percent_of_ceiling" in v else "")
  return "; ".join(f"beam {k[4:]} {v['decode_s']:.1f} s, BLEU {v['bleu']:.2f}{share(v)}"
                   for k, v in f.items() if k.startswith("beam"))


@dataclasses.dataclass(frozen=True)
class Kind:
  """How a kind of stage's figures are read (from its output file's JSON, or from its log's
  text) and printed in one line."""
  read: Callable
  line: Callable[[dict], str]
  from_log: bool = False


KINDS: Registry[Kind] = Registry("stage kind")
KINDS.add("peer_train", Kind(_peer_train, _train_line))
KINDS.add("decode", Kind(_decode, _decode_line))
KINDS.add("bench_train", Kind(_bench_table, _bench_line, from_log=True))
KINDS.add("translate", Kind(_translate, _translate_line))
KINDS.add("torch_ceiling", Kind(_torch_ceiling, _ceiling_line))


def read_figures(stage: Stage, log_path: str) -> dict:
  kind = KINDS.get(stage.kind)
  if kind.from_log:
    with open(log_path, encoding="utf-8") as f:
      return kind.read(f.read())
  return kind.read(files.read_json(stage.output))


# -- running the stages


def record_path(out: str, name: str) -> str:
  return os.path.join(out, "stages", f"{name}.json")


def run_command(command, log_path: str) -> int:
  """Runs `command` with its stdout and stderr in `log_path`; its exit status."""
  with open(log_path, "w", encoding="utf-8") as log:
    return subprocess.run(list(command), stdout=log, stderr=subprocess.STDOUT,
                          check=False).returncode


def run_stages(out: str, stages: list[Stage], *, runner: Callable = run_command,
               loadavg: Callable[[], str] = harness.loadavg, echo: Callable = print) -> dict:
  """Runs the stages in order, skipping the leading ones whose record holds the same command;
  {stage name: record}. A failed stage raises StageFailed (one line: the stage, its exit status
  and its log); the records of the stages before it stay."""
  records, rerun = {}, False
  for stage in stages:
    path, line = record_path(out, stage.name), KINDS.get(stage.kind).line
    old = files.read_json(path)
    if not rerun and old and old.get("command") == list(stage.command):
      echo(f"[{stage.name}] finished before, at {old['started']} (load {old['load_before']}): "
           f"{line(old['figures'])}")
      records[stage.name] = old
      continue
    rerun = True  # from here on every stage runs: one stretch of time
    for stale in (path, stage.output):
      if stale and os.path.exists(stale):
        os.remove(stale)
    if stage.fresh:
      shutil.rmtree(stage.fresh, ignore_errors=True)
    log_path = os.path.join(out, "logs", f"{stage.name}.log")
    for folder in (os.path.dirname(log_path), os.path.dirname(path),
                   os.path.dirname(stage.output)):
      if folder:
        os.makedirs(folder, exist_ok=True)
    started, load_before, t0 = _now(), loadavg(), time.time()
    echo(f"[{stage.name}] running (load {load_before}): {' '.join(stage.command)}")
    status = runner(stage.command, log_path)
    if status != 0:
      raise StageFailed(f"stage {stage.name} failed (exit status {status}); its log: {log_path}")
    try:
      figures = read_figures(stage, log_path)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
      raise StageFailed(f"stage {stage.name}: no figures in its output ({e}); its log: "
                        f"{log_path}") from None
    record = {"stage": stage.name, "kind": stage.kind, "command": list(stage.command),
              "log": log_path, "started": started, "wall_s": round(time.time() - t0, 1),
              "load_before": load_before, "load_after": loadavg(), "cpu": harness.cpu_info(),
              "figures": figures}
    files.write_json(path, record)
    echo(f"[{stage.name}] {line(figures)} (load {load_before} -> {record['load_after']}, "
         f"{record['wall_s']:.0f} s)")
    records[stage.name] = record
  return records


def _now() -> str:
  return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


NOTES = """\
- JoeyNMT's training rate is its own loop's timing of each update (logging every step, no
  validation): fetching and collating the batch included, the first 5 updates left out.
  bench_train times our compiled step on batches already loaded; experiments.translate's steady
  rate is our whole training loop, data loading included.
- Target tokens count EOS and leave padding out, on both sides.
- Decoding: JoeyNMT's seconds are its "Generation took" (the decoding loop, vocabularies, data
  and model already loaded); ours are bench_decode's timed pass after an untimed one that
  compiles every batch shape, its beam search ending an example by the stop rule in its
  command (--stops: k_finished once K hypotheses have finished, JoeyNMT's rule of ending an
  example once its K beams have; bound, exact). BLEU: sacreBLEU 13a, case-insensitive, of
  detokenized outputs against the raw references, on both sides; both peer brackets decode the
  first one's model.
- "ours vs mean(JoeyNMT)": ours over the mean of the two peer brackets for a rate, their mean
  time over ours for seconds (both read "x as fast"), ours less their mean for BLEU.
- The last column: our step's matmul rate (bench_train's analytic FLOPs over its time) as a
  share of the better ceiling at the dtype the row ran: XLA's (bench_train's n x n matmuls,
  best n, in its own run) or torch's (peer_ceiling: torch.matmul at the same n, the peer's
  venv), naming which; an auto row's label says the dtype auto chose."""


def write_outputs(s: Settings, records: dict) -> str:
  """<out>/sitting.md and <out>/sitting.json from the records; returns the table."""
  rows = peer_table.rows_for(s.compute_dtypes, s.beam_sizes, s.steps, bool(s.transformer_steps))
  evaluated = peer_table.evaluate(rows, records)
  table = peer_table.markdown(evaluated)
  first = min((r["started"] for r in records.values()), default="")
  cpu = harness.cpu_info()
  text = (f"# JoeyNMT, ours, JoeyNMT: one sitting\n\nStages from {first} on "
          f"{os.cpu_count()} CPUs ({harness.cpu_line(cpu)}); every figure with the 1-minute load "
          f"average at the start of its stage (the per-stage records, commands and logs: stages/, logs/).\n\n{table}\n"
          f"\n{NOTES}\n")
  files.write_text(os.path.join(s.out, "sitting.md"), text)
  files.write_json(os.path.join(s.out, "sitting.json"),
                   {"settings": dataclasses.asdict(s), "cpu": cpu, "rows": evaluated,
                    "stages": records})
  return table


def run(s: Settings, *, data: str, warmup: int) -> str:
  """The whole sitting (see the module docstring): checks, stages, table; returns the table."""
  stages = plan(s, data=data, warmup=warmup)
  preflight(s, stages, data)
  print(harness.cpu_line(), flush=True)
  print(f"peer sitting in {s.out}: {len(stages)} stages, load {harness.loadavg()} "
        f"({os.cpu_count()} CPUs)", flush=True)
  records = run_stages(s.out, stages, echo=lambda line: print(line, flush=True))
  table = write_outputs(s, records)
  print(table)
  print(f"load average at end: {harness.loadavg()}; written: "
        f"{os.path.join(s.out, 'sitting.md')}, {os.path.join(s.out, 'sitting.json')}")
  return table
