"""The plugin's wiring, in process (pytester), on a recorded run replayed in place of the drive's I/O
(stand_in/replay.py), altered where a case needs it: a run stopped by Ctrl-C at a chosen point, a restore that read
back wrong bytes, a pass slower than its limit. Each is read back as a CI gate reads it: exit code, JUnit XML,
results JSON."""

from pathlib import Path

import pytest

from replay_runs import checkout, replay_suite
from suite_runs import BOTH, PAIR, REPO, junit_cases, lenient_drive, results, suite_properties

pytest_plugins = ("pytester",)

ABSOLUTE = """
[[limit]]
name = "fill_throughput"
min = 0.05
unit = "GB/s"
source = "test: an absolute minimum the recorded passes meet"
"""


def lenient(tmp_path: Path, extra: str = "") -> str:
    return str(lenient_drive(tmp_path / "drive.toml", "lenient drive", extra, requires=("fill", "restore")))


def test_ctrl_c_during_the_restore_stops_the_run_incomplete_naming_where(pytester, tmp_path):
    done = replay_suite(pytester, *PAIR, "--drive", lenient(tmp_path), "--replay-interrupt", "restore", tests=BOTH)
    assert done.ret == pytest.ExitCode.INTERRUPTED, done.stdout[-3000:]
    data = results(done.out / "r.json")
    verdict = data["verdict"]
    assert verdict["overall"] == "INCOMPLETE"
    assert verdict["reasons"][0].startswith("the run was interrupted by SIGINT (Ctrl-C) during "), verdict
    assert "restore" in verdict["reasons"][0]
    cases = junit_cases(done.out / "q.xml")
    assert [cases[f"test_fill_pass[{n}]"]["outcome"] for n in (1, 2)] == ["passed", "passed"]
    assert (
        cases["test_restore"]["outcome"] in ("failure", "error") and "interrupted" in cases["test_restore"]["message"]
    )
    assert cases["verdict"]["outcome"] == "failure" and verdict["reasons"][0] in cases["verdict"]["message"]
    assert "restore" not in data or data["restore"] == []
    assert list((done.out / "target").iterdir()) == []


def test_a_restore_that_read_back_wrong_bytes_fails_it_and_the_run(pytester, tmp_path):
    wrong = "restore of checkpoint 3: rank 1: checkpoint-00003/r1.pt: byte 4096 differs from what was written"
    done = replay_suite(pytester, *PAIR, "--drive", lenient(tmp_path), "--replay-fail-restore", wrong, tests=BOTH)
    assert done.ret == 1, done.stdout[-3000:]
    data = results(done.out / "r.json")
    reason = f"restore FAIL: {wrong}"
    assert data["verdict"]["overall"] == "NOT QUALIFIED" and data["verdict"]["reasons"] == [reason]
    assert data["tests"]["tests_qual/test_restore.py::test_restore"]["outcome"] == "FAIL"
    assert wrong in data["errors"][0]  # the run's own error list
    cases = junit_cases(done.out / "q.xml")
    assert cases["test_restore"]["outcome"] == "failure" and cases["test_restore"]["message"] == reason
    assert suite_properties(done.out / "q.xml")["ckptqual.limits.verdict"] == "NOT QUALIFIED"
    assert done.last.startswith("ckptqual verdict: NOT QUALIFIED") and done.last.endswith(reason)


def test_a_pass_slower_than_an_absolute_minimum_fails_alone(pytester, tmp_path):
    """Pass 2 replayed 100 times slower: it alone fails, in its JUnit case, the summary's rows and the verdict; the
    basis is no longer "relative limits only"."""
    done = replay_suite(pytester, *PAIR, "--drive", lenient(tmp_path, ABSOLUTE), "--replay-slower", "2=100", tests=BOTH)
    assert done.ret == 1, done.stdout[-3000:]
    cases = junit_cases(done.out / "q.xml")
    assert cases["test_fill_pass[1]"]["outcome"] == "passed" and cases["test_restore"]["outcome"] == "passed"
    failed = cases["test_fill_pass[2]"]
    assert failed["outcome"] == "failure" and failed["message"].startswith("pass 2 FAIL: fill_throughput ")
    assert " < min 0.05 GB/s (pass=2, state=steady; source: test: an absolute minimum" in failed["message"]
    rows = [line.split() for line in done.stdout.splitlines() if line.strip().startswith(("1 ", "2 "))]
    assert [row[-1] for row in rows[-2:]] == ["PASS", "FAIL"]
    verdict = results(done.out / "r.json")["verdict"]
    assert verdict["overall"] == "NOT QUALIFIED" and verdict["reasons"] == [failed["message"].split(" || ")[0]]
    assert "relative limits only" not in verdict["basis"]


def test_a_collection_error_is_named_as_pytests_stop_not_as_a_ctrl_c(pytester, tmp_path):
    """pytest stops a session whose tests fail to import (its Interrupted, a KeyboardInterrupt): the verdict says
    so, never that someone pressed Ctrl-C."""
    (checkout(pytester).parent / "tests_qual" / "test_broken.py").write_text("import a_module_that_is_not_there\n")
    done = replay_suite(pytester, *PAIR, "--drive", lenient(tmp_path), tests=("test_fill.py", "test_broken.py"))
    assert done.ret == pytest.ExitCode.INTERRUPTED, done.stdout[-3000:]
    verdict = results(done.out / "r.json")["verdict"]
    assert verdict["overall"] == "INCOMPLETE", verdict
    assert verdict["reasons"][0].startswith("the run was interrupted by pytest (1 error during collection)"), verdict
    assert not any("SIGINT" in reason for reason in verdict["reasons"]), verdict
    assert done.last.startswith("ckptqual verdict: INCOMPLETE: the run was interrupted by pytest (")


def test_no_module_of_tests_shares_its_name_with_one_of_tests_qual():
    """The in-process runs collect tests_qual inside this suite's workers, where tests/ modules are already imported
    by their base name: a shared name would make pytest refuse the file ("import file mismatch")."""
    ours = {path.name for path in Path(__file__).parent.glob("test_*.py")}
    assert not ours & {path.name for path in (REPO / "tests_qual").glob("test_*.py")}
