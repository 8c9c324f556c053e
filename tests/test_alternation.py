"""Commands timed in alternation across checkouts (attn.benchmarks.alternation and
experiments.bench_alternate): the order of the runs, each in its checkout with a fresh
{workdir} and the added environment, CPU seconds of the command's own processes, failures that
name the command and keep what was measured, and the summary's arithmetic."""

import json
import os
import subprocess
import sys

import pytest

from attn.benchmarks import alternation
from attn.errors import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _checkouts(tmp_path, *names):
  out = {}
  for n in names:
    (tmp_path / n).mkdir()
    out[n] = str(tmp_path / n)
  return out


def test_rounds_run_every_command_in_every_checkout_in_order(tmp_path):
  log = tmp_path / "log"
  checkouts = _checkouts(tmp_path, "old", "new")
  write = f"python -c \"import os; open({str(log)!r}, 'a').write('{{}} ' + os.getcwd() + '\\n')\""
  commands = {"a": write.replace("{}", "a"), "b": write.replace("{}", "b")}
  record = tmp_path / "timings.jsonl"
  timings = alternation.alternate(commands, checkouts, 2, record_path=str(record),
                                  say=lambda *a, **k: None)
  want = [(c, k) for _ in range(2) for c in ("a", "b") for k in ("old", "new")]
  assert [(t.command, t.checkout) for t in timings] == want
  assert [t.round for t in timings] == [1] * 4 + [2] * 4
  assert log.read_text().split("\n")[:-1] == [f"{c} {checkouts[k]}" for c, k in want]
  rows = [json.loads(line) for line in record.read_text().splitlines()]
  assert [(r["command"], r["checkout"], r["round"]) for r in rows] == [
      (t.command, t.checkout, t.round) for t in timings]


def test_workdir_is_fresh_and_removed_and_env_is_added(tmp_path):
  log = tmp_path / "log"
  checkouts = _checkouts(tmp_path, "one")
  command = (f"test -d {{workdir}} && test -z \"$(ls {{workdir}})\" "
             f"&& echo {{workdir}} $MARK >> {log}")
  alternation.alternate({"c": command}, checkouts, 2, env={"MARK": "seen"},
                        say=lambda *a, **k: None)
  lines = log.read_text().split("\n")[:-1]
  dirs = [line.split()[0] for line in lines]
  assert [line.split()[1] for line in lines] == ["seen", "seen"]
  assert len(set(dirs)) == 2 and not any(os.path.exists(d) for d in dirs)


def test_wall_and_cpu_seconds_are_the_commands_own(tmp_path):
  checkouts = _checkouts(tmp_path, "one")
  busy = "python -c \"import time\nwhile time.process_time() < 0.3: pass\""
  idle = "python -c \"import time; time.sleep(0.3)\""
  timings = alternation.alternate({"busy": busy, "idle": idle}, checkouts, 1,
                                  say=lambda *a, **k: None)
  by = {t.command: t for t in timings}
  assert by["busy"].cpu_s >= 0.3 and by["busy"].wall_s >= 0.3
  assert by["idle"].wall_s >= 0.3 and by["idle"].cpu_s < by["busy"].cpu_s


def test_a_failing_command_names_itself_and_keeps_the_runs_before_it(tmp_path):
  checkouts = _checkouts(tmp_path, "good", "bad")
  (tmp_path / "bad" / "broken").write_text("")
  command = "test ! -e broken || (echo the tail of its output; exit 3)"
  record = tmp_path / "timings.jsonl"
  with pytest.raises(alternation.CommandFailed,
                     match=r"command 'c' in checkout 'bad' .* round 1: exit status 3(.|\n)*"
                           r"the tail of its output"):
    alternation.alternate({"c": command}, checkouts, 2, record_path=str(record),
                          say=lambda *a, **k: None)
  assert [json.loads(line)["checkout"] for line in record.read_text().splitlines()] == ["good"]


@pytest.mark.parametrize("text, match", [
    ("{", "is not JSON"), ("[]", "must map names"), ('{"a": 1}', "must map names"),
    ('{"a": ""}', "must map names"), ("{}", "must map names")])
def test_named_strings_refuse_what_is_not_an_object_of_strings(text, match):
  with pytest.raises(ConfigError, match=rf"--commands {match}"):
    alternation.named_strings(text, "commands")


def test_a_missing_checkout_or_no_rounds_is_refused_before_anything_runs(tmp_path):
  log = tmp_path / "log"
  with pytest.raises(ConfigError, match=r"checkout 'gone': .* is not a directory"):
    alternation.alternate({"c": f"echo ran >> {log}"},
                          {**_checkouts(tmp_path, "here"), "gone": str(tmp_path / "gone")}, 1)
  with pytest.raises(ConfigError, match="--rounds must be >= 1"):
    alternation.alternate({"c": f"echo ran >> {log}"}, _checkouts(tmp_path, "one"), 0)
  assert not log.exists()


def test_summary_means_medians_ranges_and_the_ratio_to_the_first_checkout():
  t = lambda c, k, w, cpu: alternation.Timing(c, k, 1, w, cpu, 0.0)
  table = alternation.summary([t("f", "old", 10.0, 12.0), t("f", "new", 12.0, 15.0),
                               t("f", "old", 12.0, 14.0), t("f", "new", 15.0, 17.0),
                               t("f", "old", 11.0, 13.0), t("f", "new", 13.0, 16.0)])
  rows = [r.split("|")[1:-1] for r in table.splitlines()[2:]]
  assert [[c.strip() for c in r] for r in rows] == [
      ["f", "old", "3", "11.00", "11.00", "10.00–12.00", "13.00",
       "1.00x"],
      ["f", "new", "3", "13.33", "13.00", "12.00–15.00", "16.00", "1.21x"]]


def test_the_experiment_writes_its_table_and_refuses_a_bad_flag(tmp_path):
  checkouts = _checkouts(tmp_path, "a", "b")
  out = tmp_path / "out"
  run = lambda *flags: subprocess.run(
      [sys.executable, "-m", "experiments.bench_alternate", *flags], cwd=REPO,
      capture_output=True, text=True, timeout=300)
  done = run('--commands={"noop": "true"}', f"--checkouts={json.dumps(checkouts)}",
             "--rounds=2", f"--out={out}")
  assert done.returncode == 0, done.stderr
  summary = (out / "summary.md").read_text()
  assert "| noop | a | 2 |" in summary and "| noop | b | 2 |" in summary
  assert len((out / "timings.jsonl").read_text().splitlines()) == 4
  bad = run("--commands=noop", f"--out={out}")
  assert bad.returncode == 2 and "--commands is not JSON" in bad.stderr
