"""A verdict never stands without its required parts: a run whose selection leaves out a part its drive file
requires (-k, --deselect, a test file not given), or in which that part is only skipped, is not QUALIFIED, and says
which part and what dropped it in every report. Real suite runs at a tiny scale: one checkpoint, read back once."""

import subprocess
from pathlib import Path

import pytest

from expected_basis import RELATIVE, STEADY, head, qualified, uncounted
from suite_runs import (
    HOST_LIMITED,
    REPO,
    junit_cases,
    lenient_drive,
    plugin_path,
    results,
    run_suite,
    suite_command,
    suite_properties,
    user_environment,
)

TINY = ["--workload", "llama3-8b-dp2", "--scale", "0.0001", "--checkpoints-per-pass", "1", "--passes", "1"]
TINY += ["--restore-checkpoints", "1"]
BOTH = ("test_fill.py", "test_restore.py")
MLPERF = "mlperf-checkpointing"
FAULT_PLUGINS = REPO / "tests" / "fault_plugins"


def reports(tmp_path: Path, target: Path | None = None) -> list[str]:
    """The reports in `tmp_path`, and `target` (else a new directory there)."""
    if target is None:
        target = tmp_path / "target"
        target.mkdir()
    return ["--target", str(target), "--junitxml", str(tmp_path / "q.xml"), "--results", str(tmp_path / "r.json")]


def restore_requiring_drive(tmp_path: Path) -> str:
    """A drive file of one's own whose verdict requires the verified restore, with no restore limit."""
    return str(lenient_drive(tmp_path / "own.toml", "own drive", requires=("fill", "restore")))


def assert_held_back(done: subprocess.CompletedProcess, tmp_path: Path, *named: str) -> str:
    """The run is not QUALIFIED, in the exit code, the last line, the JUnit verdict case and suite property and the
    results JSON, and its required-part reason names each of `named`; returns that reason."""
    data = results(tmp_path / "r.json")
    verdict = data["verdict"]
    reason = next((r for r in verdict["reasons"] if r.startswith("required part restore")), None)
    assert reason is not None and all(text in reason for text in named), done.stdout[-3000:]
    limited = verdict["overall"] == "INVALID" and any(text in " ".join(verdict["reasons"]) for text in HOST_LIMITED)
    assert verdict["overall"] == ("INVALID" if limited else "INCOMPLETE"), verdict  # INVALID outranks INCOMPLETE
    assert done.returncode == 1, done.stdout[-3000:]
    assert done.stdout.rstrip().splitlines()[-1].startswith(head(verdict))
    assert reason in done.stdout.rstrip().splitlines()[-1]
    case = junit_cases(tmp_path / "q.xml")["verdict"]
    assert case["outcome"] == "failure" and reason in case["message"]
    properties = suite_properties(tmp_path / "q.xml")
    assert properties["ckptqual.limits.verdict"] == verdict["overall"]
    assert reason in properties["ckptqual.limits.verdict.reasons"]
    return reason


@pytest.mark.parametrize("drive", [MLPERF, "own"])
def test_a_run_that_deselects_the_required_restore_with_k_is_not_qualified(drive, tmp_path):
    drive_file = MLPERF if drive == MLPERF else restore_requiring_drive(tmp_path)
    done = run_suite(*TINY, "--drive", drive_file, *reports(tmp_path), "-k", "not restore", tests=BOTH)
    reason = assert_held_back(done, tmp_path, "deselected by -k 'not restore'")
    assert reason.startswith("required part restore was not run: deselected by -k 'not restore' (required by ")
    assert "restore" not in results(tmp_path / "r.json")  # nothing was read back


def test_a_run_that_deselects_the_required_restore_by_node_id_is_not_qualified(tmp_path):
    deselect = "tests_qual/test_restore.py::test_restore"
    done = run_suite(*TINY, "--drive", MLPERF, *reports(tmp_path), "--deselect", deselect, tests=BOTH)
    assert_held_back(done, tmp_path, f"deselected by --deselect {deselect}")


def test_a_run_not_given_the_restores_file_is_not_qualified(tmp_path):
    done = run_suite(*TINY, "--drive", restore_requiring_drive(tmp_path), *reports(tmp_path))  # test_fill.py alone
    assert_held_back(done, tmp_path, "not collected: pytest was given tests_qual/test_fill.py", "own.toml")


def test_a_run_whose_required_restore_was_skipped_is_not_qualified(tmp_path):
    command = suite_command(*TINY, "--drive", MLPERF, *reports(tmp_path), "-p", "skip_test", tests=BOTH)
    env = user_environment({"PYTHONPATH": plugin_path(FAULT_PLUGINS), "CKPTQUAL_SKIP_TEST": "test_restore"})
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert_held_back(done, tmp_path, "did not run: restore SKIPPED: skipped by the skip_test plugin")


def test_a_run_of_every_required_part_is_qualified(tmp_path, slow_target):
    """On the slow stand-in drive, so that a busy host cannot make its figures INVALID."""
    drive = restore_requiring_drive(tmp_path)
    done = run_suite(*TINY, "--drive", drive, *reports(tmp_path, slow_target), tests=BOTH)
    assert done.returncode == 0, done.stdout[-3000:]
    data = results(tmp_path / "r.json")
    assert data["verdict"] == qualified(data, RELATIVE, STEADY, last=uncounted(data))  # local.toml's limits; 1 pass
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
def test_what_dropped_a_required_part_is_named_before_anything_runs(tests, args, reason, tmp_path):
    """Collection only (nothing runs, so every selected test is 'never reached'): which option dropped each test."""
    target = tmp_path / "target"
    target.mkdir()
    command = suite_command("--drive", MLPERF, "--passes", "3", "--target", str(target), "--co", *args, tests=tests)
    env = user_environment({"PYTHONPATH": plugin_path(FAULT_PLUGINS), "CKPTQUAL_MARK_TEST": "test_restore"})
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    last = done.stdout.rstrip().splitlines()[-1]
    assert last.startswith("ckptqual verdict: INCOMPLETE: ") and reason in last, done.stdout[-3000:]
    assert "(required by mlperf-checkpointing.toml [verdict] requires)" in last
