"""A verdict never stands without its required parts: a run whose selection leaves out a part its drive file
requires (-k, --deselect, a test file not given), or in which that part is only skipped, is not QUALIFIED, and says
which part and what dropped it in every report. In process (pytester), on a recorded run replayed in place of the
drive's I/O (stand_in/replay.py): the selection, the verdict and the reports are the plugin's own."""

from pathlib import Path

import pytest

from expected_basis import RELATIVE, STEADY, head, qualified
from replay_runs import Replayed, not_counted, replay_suite
from suite_runs import REPO, junit_cases, lenient_drive, results, suite_properties

pytest_plugins = ("pytester",)

TINY = ["--workload", "llama3-8b-dp2", "--scale", "0.0001", "--checkpoints-per-pass", "1", "--passes", "1"]
TINY += ["--restore-checkpoints", "1"]
BOTH = ("test_fill.py", "test_restore.py")
MLPERF = "mlperf-checkpointing"
FAULT_PLUGINS = REPO / "tests" / "fault_plugins"


def restore_requiring_drive(tmp_path: Path) -> str:
    """A drive file of one's own whose verdict requires the verified restore, with no restore limit."""
    return str(lenient_drive(tmp_path / "own.toml", "own drive", requires=("fill", "restore")))


def assert_held_back(done: Replayed, *named: str) -> str:
    """The run is not QUALIFIED, in the exit code, the last line, the JUnit verdict case and suite property and the
    results JSON, and its required-part reason names each of `named`; returns that reason."""
    data = results(done.out / "r.json")
    verdict = data["verdict"]
    reason = next((r for r in verdict["reasons"] if r.startswith("required part restore")), None)
    assert reason is not None and all(text in reason for text in named), done.stdout[-3000:]
    assert verdict["overall"] == "INCOMPLETE", verdict
    assert done.ret == 1, done.stdout[-3000:]
    assert done.last.startswith(head(verdict))
    assert reason in done.last
    case = junit_cases(done.out / "q.xml")["verdict"]
    assert case["outcome"] == "failure" and reason in case["message"]
    properties = suite_properties(done.out / "q.xml")
    assert properties["ckptqual.limits.verdict"] == verdict["overall"]
    assert reason in properties["ckptqual.limits.verdict.reasons"]
    return reason


@pytest.mark.parametrize("drive", [MLPERF, "own"])
def test_a_run_that_deselects_the_required_restore_with_k_is_not_qualified(drive, pytester, tmp_path):
    drive_file = MLPERF if drive == MLPERF else restore_requiring_drive(tmp_path)
    done = replay_suite(pytester, *TINY, "--drive", drive_file, "-k", "not restore", tests=BOTH)
    reason = assert_held_back(done, "deselected by -k 'not restore'")
    assert reason.startswith("required part restore was not run: deselected by -k 'not restore' (required by ")
    assert "restore" not in results(done.out / "r.json")  # nothing was read back


def test_a_run_that_deselects_the_required_restore_by_node_id_is_not_qualified(pytester):
    deselect = "tests_qual/test_restore.py::test_restore"
    done = replay_suite(pytester, *TINY, "--drive", MLPERF, "--deselect", deselect, tests=BOTH)
    assert_held_back(done, f"deselected by --deselect {deselect}")


def test_a_run_not_given_the_restores_file_is_not_qualified(pytester, tmp_path):
    done = replay_suite(pytester, *TINY, "--drive", restore_requiring_drive(tmp_path))  # test_fill.py alone
    assert_held_back(done, "not collected: pytest was given tests_qual/test_fill.py", "own.toml")


def test_a_run_whose_required_restore_was_skipped_is_not_qualified(pytester, monkeypatch):
    monkeypatch.syspath_prepend(str(FAULT_PLUGINS))
    monkeypatch.setenv("CKPTQUAL_SKIP_TEST", "test_restore")
    done = replay_suite(pytester, *TINY, "--drive", MLPERF, "-p", "skip_test", tests=BOTH)
    assert_held_back(done, "did not run: restore SKIPPED: skipped by the skip_test plugin")


def test_a_run_of_every_required_part_is_qualified(pytester, tmp_path):
    drive = restore_requiring_drive(tmp_path)
    done = replay_suite(pytester, *TINY, "--drive", drive, tests=BOTH)
    assert done.ret == 0, done.stdout[-3000:]
    data = results(done.out / "r.json")
    assert data["verdict"] == qualified(data, RELATIVE, STEADY, last=not_counted(data))  # local.toml's limits; 1 pass
    assert [r["checkpoint"] for r in data["restore"]] == [0]


@pytest.mark.parametrize(
    ("tests", "args", "reason"),
    [
        (
            ("test_fill.py::test_fill_pass[1]", "test_restore.py"),
            (),
            "required part fill was not run: pass 1 never reached: the session ended before it; pass 2, "
            "pass 3 not among the tests the arguments name (tests_qual/test_fill.py::test_fill_pass[1] "
            "tests_qual/test_restore.py)",
        ),
        (
            BOTH,
            ("-p", "mark_test", "-m", "not chosen"),
            "required part restore was not run: deselected by -m 'not chosen'",
        ),
    ],
    ids=["node-id", "marker"],
)
def test_what_dropped_a_required_part_is_named_before_anything_runs(tests, args, reason, pytester, monkeypatch):
    """Collection only (nothing runs, so every selected test is 'never reached'): which option dropped each test."""
    monkeypatch.syspath_prepend(str(FAULT_PLUGINS))
    monkeypatch.setenv("CKPTQUAL_MARK_TEST", "test_restore")
    done = replay_suite(pytester, "--drive", MLPERF, "--passes", "3", "--co", *args, tests=tests, reports=False)
    assert done.last.startswith("ckptqual verdict: INCOMPLETE: ") and reason in done.last, done.stdout[-3000:]
    assert "(required by mlperf-checkpointing.toml [verdict] requires)" in done.last
