"""Signals to a running qualification, as a user or a batch system sends them: a second one while the first is still
stopping the run changes nothing. Read as a CI gate reads it: the exit code, the JUnit XML and the results JSON."""

import signal
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from expected_basis import head
from suite_runs import PAIR, LiveSuite, junit_cases, results

# Two ranks, 11 MB checkpoints (the signals reach the controller; eight ranks are not the point); 20 checkpoints a
# pass, so that pass 2 is still writing when the signal arrives however busy the host.
FILL = [*PAIR, "--checkpoints-per-pass", "20"]


@pytest.mark.parametrize("second", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT-twice", "SIGINT-then-SIGTERM"])
def test_a_second_signal_while_the_first_stops_the_run_is_ignored(tmp_path, second):
    target = tmp_path / "target"
    target.mkdir()
    reports = ["--junitxml", str(tmp_path / "q.xml"), "--results", str(tmp_path / "r.json")]
    suite = LiveSuite(tmp_path / "run.log", *FILL, "--target", str(target), *reports)
    suite.wait_for("ckptqual: pass 2 checkpoint 2/20")  # pass 2 removes a checkpoint before each one it writes
    suite.process.send_signal(signal.SIGINT)
    time.sleep(0.2)  # a user's second Ctrl-C, or the batch system's SIGTERM, while the run is stopping
    suite.process.send_signal(second)
    assert suite.finish() == 2, suite.output()[-3000:]  # pytest's "interrupted", as with one signal
    output = suite.output()
    assert "Traceback" not in output, output[-3000:]
    verdict = results(tmp_path / "r.json")["verdict"]
    interrupted = "the run was interrupted by SIGINT (Ctrl-C) during "
    last = output.rstrip().splitlines()[-1]
    assert last.startswith(head(verdict)) and interrupted in last, last
    assert all(case.get("name") for case in ElementTree.parse(tmp_path / "q.xml").iter("testcase"))
    cases = junit_cases(tmp_path / "q.xml")
    first = cases["test_fill_pass[1]"]  # judged before the signal: a busy host may make it INVALID, never FAIL
    assert first["outcome"] == "passed" or "INVALID" in first["message"], first
    assert cases["test_fill_pass[2]"]["outcome"] == "error"
    assert "pass 2 INTERRUPTED: the run was interrupted by SIGINT (Ctrl-C)" in cases["test_fill_pass[2]"]["message"]
    data = results(tmp_path / "r.json")
    assert data["verdict"]["overall"] in ("INCOMPLETE", "INVALID")  # a busy host's INVALID figure outranks it
    assert cases["verdict"]["outcome"] == "failure" and data["verdict"]["overall"] in cases["verdict"]["message"]
    assert any(reason.startswith(interrupted) for reason in data["verdict"]["reasons"]), data["verdict"]["reasons"]
    assert data["checkpoints"] and data["cleanup"]["removed"] is True
    assert list(target.iterdir()) == []


def test_a_hang_up_during_a_checkpoint_stops_the_run_like_sigterm(tmp_path):
    """SIGHUP (the terminal or SSH session closed) during pass 2: exit 2, INCOMPLETE as the last line, the JUnit XML
    and the results with their verdict, and the target left as it was (no lock, marker or run directory)."""
    target = tmp_path / "target"
    target.mkdir()
    reports = ["--junitxml", str(tmp_path / "q.xml"), "--results", str(tmp_path / "r.json")]
    suite = LiveSuite(tmp_path / "run.log", *FILL, "--target", str(target), *reports)
    suite.wait_for("ckptqual: pass 2 checkpoint 2/20")
    suite.process.send_signal(signal.SIGHUP)
    assert suite.finish() == 2, suite.output()[-3000:]
    output = suite.output()
    assert "Traceback" not in output, output[-3000:]
    data = results(tmp_path / "r.json")
    interrupted = "the run was interrupted by SIGHUP during "
    assert data["verdict"]["overall"] in ("INCOMPLETE", "INVALID")  # a busy host's INVALID figure outranks it
    assert any(reason.startswith(interrupted) for reason in data["verdict"]["reasons"]), data["verdict"]["reasons"]
    last = output.rstrip().splitlines()[-1]
    assert last.startswith(head(data["verdict"])) and interrupted in last, last
    cases = junit_cases(tmp_path / "q.xml")
    assert cases["verdict"]["outcome"] == "failure" and data["verdict"]["overall"] in cases["verdict"]["message"]
    assert data["cleanup"]["removed"] is True
    assert list(target.iterdir()) == []


SWEEP = ["--sweep-block-sizes", "1M", "--sweep-threads", "1,2", "--sweep-file-bytes", "32M", "--transfer", "cpu-only"]


def _sweep_files_exist(target: Path) -> bool:
    return any(target.glob("*/sweep/sweep-job*.bin"))


@pytest.mark.parametrize("moment", ["sweep-files", "restore"])
def test_ctrl_c_while_the_sweep_files_exist_or_during_the_restore_ends_incomplete_and_clean(tmp_path, moment):
    """SIGINT once the sweep's files are on the target (seen there), or between two restores: exit 2, no traceback
    (from the sweep's removal or the target helper), the INCOMPLETE verdict as the last line, the target clean."""
    target = tmp_path / "target"
    target.mkdir()
    reports = ["--junitxml", str(tmp_path / "q.xml"), "--results", str(tmp_path / "r.json")]
    tests = ("test_fill.py", "test_read_sweep.py", "test_restore.py")  # as `pytest tests_qual` orders them
    sweep = SWEEP
    if moment == "restore":  # the restore follows the fill, as without the sweep's own files
        tests, sweep = ("test_fill.py", "test_restore.py"), []
    # one pass of four checkpoints, all four restored: three restores still to come when the first is printed
    fill = [*PAIR, "--passes", "1", "--checkpoints-per-pass", "4", "--restore-checkpoints", "4"]
    args = [*fill, *sweep, "--target", str(target), *reports]
    suite = LiveSuite(tmp_path / "run.log", *args, tests=tests)
    if moment == "restore":
        suite.wait_for("ckptqual: restore of checkpoint")  # the second of four restores is under way
    else:
        deadline = time.monotonic() + 300
        while not _sweep_files_exist(target):
            assert suite.process.poll() is None and time.monotonic() < deadline, suite.output()[-3000:]
            time.sleep(0.02)
    suite.process.send_signal(signal.SIGINT)
    assert suite.finish() == 2, suite.output()[-3000:]
    output = suite.output()
    assert "Traceback" not in output and "EOFError" not in output, output[-3000:]
    data = results(tmp_path / "r.json")
    assert data["verdict"]["overall"] in ("INCOMPLETE", "INVALID")  # a busy host's INVALID figure outranks it
    during = "test_restore.py::test_restore" if moment == "restore" else "test_read_sweep.py::test_read_sweep["
    interrupted = f"the run was interrupted by SIGINT (Ctrl-C) during tests_qual/{during}"
    assert any(reason.startswith(interrupted) for reason in data["verdict"]["reasons"]), data["verdict"]["reasons"]
    last = output.rstrip().splitlines()[-1]
    assert last.startswith(head(data["verdict"])) and interrupted in last, last
    assert data["cleanup"]["removed"] is True
    assert list(target.iterdir()) == []
