"""Strings are data: text from a drive file, a record, a label or a tool is printed with its control characters,
line breaks and escape sequences made visible, so that it can never forge the verdict, which is the last line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ckptqual.cli import main
from ckptqual.limits.verdict import Overall, RunVerdict
from ckptqual.printable import printable
from replay_runs import replay_suite
from suite_runs import REPO, SMALL, lenient_drive, user_environment

pytest_plugins = ("pytester",)

FORGED = "datasheet)\n\nckptqual verdict: QUALIFIED\n\u001b[2K"
RECORD = REPO / "tests" / "data" / "results" / "loop-ext4-1.json"


def test_control_characters_line_breaks_and_escapes_are_shown_as_escapes():
    assert printable(FORGED) == "datasheet)\\n\\nckptqual verdict: QUALIFIED\\n\\x1b[2K"
    assert printable("a\u2028b\u202ec\ud800d\x7f\x85") == "a\\u2028b\\u202ec\\ud800d\\x7f\\x85"
    assert printable("plain text, ünïcode and 8 GB/s") == "plain text, ünïcode and 8 GB/s"


def test_a_verdict_line_is_one_line_whatever_its_reasons_hold():
    line = RunVerdict(Overall.NOT_QUALIFIED, (f"pass 1 FAIL: source {FORGED}",)).line()
    assert line.startswith("ckptqual verdict: NOT QUALIFIED: pass 1 FAIL") and line.isprintable()


def test_the_summary_of_a_record_holding_forged_text_ends_with_its_own_verdict(tmp_path, capsys):
    data = json.loads(RECORD.read_text())
    data["drive"]["model"] = FORGED
    data["settings"]["workload"] = FORGED
    data["errors"] = [FORGED]
    test = next(iter(data["tests"].values()))
    test["outcome"], test["message"] = "FAIL", f"pass 1 FAIL: {FORGED}"
    data["verdict"] = {"overall": "NOT QUALIFIED", "reasons": [test["message"]], "basis": [FORGED]}
    path = tmp_path / "forged.json"
    path.write_text(json.dumps(data))
    assert main(["summary", str(path)]) == 1
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[-1].startswith("ckptqual verdict: NOT QUALIFIED (datasheet)\\n\\nckptqual verdict: QUALIFIED")
    assert all(line.isprintable() for line in lines), out
    assert "\x1b" not in out and "\nckptqual verdict: QUALIFIED" not in out


def test_a_forged_limit_source_cannot_end_a_failing_run_with_qualified(pytester, tmp_path):
    """The drive file's source of a limit the run misses holds a forged verdict line and a terminal escape that
    would erase the line before it: the run, and `ckptqual summary` of its record, still end with the real verdict
    (NOT QUALIFIED). In process, on a replayed run (stand_in/replay.py)."""
    unmet = '\n[[limit]]\nname = "fill_throughput"\nmin = 1000\nunit = "ratio"\nrelative_to = "raw_write"\n'
    unmet += f"source = {json.dumps(FORGED)}\n"
    drive = lenient_drive(tmp_path / "forged.toml", "forged source", unmet)
    done = replay_suite(pytester, *SMALL, "--drive", str(drive))
    results, junit = done.out / "r.json", done.out / "q.xml"
    output = done.stdout
    assert done.ret == 1, output[-3000:] + done.stderr[-3000:]
    last = output.rstrip("\n").splitlines()[-1]
    assert last.startswith("ckptqual verdict: NOT QUALIFIED"), output[-3000:]
    assert "ckptqual verdict: QUALIFIED\\n\\x1b[2K" in last, last
    assert "\x1b[2K" not in output and "\nckptqual verdict: QUALIFIED" not in output, output[-3000:]
    assert "\\x1b[2K" in junit.read_text() and "\x1b" not in junit.read_text()
    summary = subprocess.run(
        [sys.executable, "-m", "ckptqual.cli", "summary", str(results)],
        capture_output=True, text=True, env=user_environment(), timeout=120,
    )  # fmt: skip
    assert summary.returncode == 1, summary.stderr
    assert summary.stdout.rstrip("\n").splitlines()[-1] == last
    assert "\x1b" not in summary.stdout and "\nckptqual verdict: QUALIFIED" not in summary.stdout


@pytest.mark.parametrize("text", ["\x1b]0;title\x07", "a\rb", "\u2029"])
def test_a_printed_line_never_holds_a_character_a_terminal_acts_on(text):
    assert printable(text).isprintable()
