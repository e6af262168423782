"""A gate that is never green when it should be red: each run below is read back as a CI gate reads it (exit code,
JUnit XML, results JSON), on real filesystems, with real faults: a frozen drive, a filesystem that turns read-only,
a lost file, a second run and xdist workers on one target; a failed limit and limits that could not be judged, whose
point is the judging, on a replayed run in process (stand_in/replay.py)."""

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ckptqual.host import gpu
from expected_basis import RELATIVE, STEADY, line, qualified, uncounted
from replay_runs import replay_suite
from suite_runs import (
    BOTH,
    PAIR,
    REPO,
    SMALL,
    SMALL_PAIR,
    LiveSuite,
    junit_cases,
    lenient_drive,
    plugin_path,
    results,
    run_suite,
    suite_properties,
    user_environment,
)

pytest_plugins = ("pytester",)


def reports(tmp_path: Path) -> list[str]:
    return ["--junitxml", str(tmp_path / "q.xml"), "--results", str(tmp_path / "r.json")]


def summary_again(results_path: Path) -> subprocess.CompletedProcess:
    """`ckptqual summary RESULTS.json`: the report drawn again from the record alone."""
    command = [sys.executable, "-m", "ckptqual.cli", "summary", str(results_path)]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def test_a_qualified_run_says_so_in_every_report(qualified_run):
    """On the slow stand-in drive, so that a busy host cannot make its figures INVALID."""
    done, out = qualified_run, qualified_run.out
    assert done.returncode == 0, done.stdout[-3000:]
    data = results(out / "results.json")
    expected = qualified(data, RELATIVE, STEADY, last=uncounted(data))  # local.toml's limits, 2 passes of 2 checkpoints
    assert data["verdict"] == expected
    assert done.stdout.rstrip().splitlines()[-1] == line(expected)
    cases = junit_cases(out / "qual.xml")
    assert cases["verdict"]["outcome"] == "passed"
    assert suite_properties(out / "qual.xml")["ckptqual.limits.verdict"] == "QUALIFIED"
    assert suite_properties(out / "qual.xml")["ckptqual.limits.verdict.basis"] == "; ".join(expected["basis"])
    assert {test["subject"]: test["outcome"] for test in data["tests"].values()} == {
        "pass 1": "PASS",
        "pass 2": "PASS",
        "restore": "PASS",
    }
    summary = done.stdout[done.stdout.index("ckptqual summary") :]
    assert "every byte verified" in summary and summary.split("every byte verified")[1].split("\n")[0].endswith("PASS")
    again = summary_again(out / "results.json")
    assert again.returncode == 0 and again.stdout.splitlines()[-1] == line(expected)
    drawn = again.stdout.splitlines()[1:-1]  # the record's summary, as the run printed it
    assert len(drawn) > 5 and all(line in done.stdout.splitlines() for line in drawn)


def test_a_pass_that_fails_its_limit_shows_it_and_is_not_qualified(pytester, tmp_path):
    """In process, on a replayed run (stand_in/replay.py) whose pass 1 met its limit. (A drive file that requires
    the steady state of more rounds than the run writes is refused before any I/O: tests/test_refusals.py.)"""
    impossible = """
[[limit]]
name = "fill_throughput"
min = 1000
unit = "ratio"
relative_to = "raw_write"
where = { state = "steady" }
source = "test: no drive writes a thousand times its own raw rate"
"""
    drive = lenient_drive(tmp_path / "d.toml", "strict", impossible)
    done = replay_suite(pytester, *PAIR, "--drive", str(drive), tests=BOTH)
    assert done.ret == 1, done.stdout[-3000:]
    xml, record = done.out / "q.xml", done.out / "r.json"
    message = junit_cases(xml)["test_fill_pass[2]"]["message"]
    assert message.startswith("pass 2 FAIL: ") and "fill_throughput" in message and "< min 1000 of raw_write" in message
    rows = [line.split() for line in done.stdout.splitlines() if line.strip().startswith(("1 ", "2 "))]
    assert [row[-1] for row in rows[-2:]] == ["PASS", "FAIL"]  # the summary shows what the test decided
    data = results(record)
    assert data["verdict"]["overall"] == "NOT QUALIFIED"
    reason, figures = message.split(" || figures: ")  # the JUnit message adds every judged figure
    assert data["verdict"]["reasons"][0] == reason
    assert "fill_throughput " in figures and " < 1000 of raw_write" in figures
    assert junit_cases(xml)["verdict"]["outcome"] == "failure"
    again = summary_again(record)
    assert again.returncode == 1 and again.stdout.splitlines()[-1] == done.last


@pytest.mark.skipif(gpu.probe().problem("gpu-direct") is None, reason="this host can run gpu-direct cells")
def test_a_limit_that_no_test_could_judge_leaves_the_run_incomplete(pytester, tmp_path):
    """The D5-P5336 case: its only read limit selects gpu-direct cells, all skipped on a host without a GPU. In
    process, on a replayed run (stand_in/replay.py): which cells this host can run is this host's answer."""
    gpu_limit = """
[[limit]]
name = "sweep_read_bandwidth"
min = 3.78
unit = "GiB/s"
where = { transfer = "gpu-direct", block_size = "1M", threads = 1 }
source = "test: the review's GPU Direct figure"
"""
    drive = lenient_drive(tmp_path / "d.toml", "gpu drive", gpu_limit)
    sweep = ["--sweep-block-sizes", "1M", "--sweep-threads", "1", "--sweep-file-bytes", "4M"]
    cells = ("--transfer", "gpu-direct,cpu-only")
    done = replay_suite(
        pytester,
        *PAIR,
        "--passes",
        "1",
        *sweep,
        *cells,
        "--drive",
        str(drive),
        tests=("test_fill.py", "test_read_sweep.py"),
    )
    tmp_path = done.out
    assert done.ret == 1, done.stdout[-3000:]
    cases = junit_cases(tmp_path / "q.xml")
    assert cases["test_read_sweep[gpu-direct-1M-1]"]["outcome"] == "skipped"
    assert cases["test_read_sweep[cpu-only-1M-1]"]["outcome"] == "passed"
    data = results(tmp_path / "r.json")
    assert data["verdict"]["overall"] == "INCOMPLETE"
    (reason,) = data["verdict"]["reasons"]
    assert (
        reason.startswith("limit 2 (sweep_read_bandwidth >= 3.78 GiB/s where transfer=gpu-direct") and "never" in reason
    )
    assert "gpu-direct needs a GPU" in reason
    assert cases["verdict"]["outcome"] == "failure" and "INCOMPLETE" in cases["verdict"]["message"]


def test_every_directory_a_checkpoint_changes_is_fsynced_by_its_ranks(tmp_path):
    """Traced for real: each rank fsyncs the directories its files created or changed, up to the one that gained
    the checkpoint's entry, inside its timed task (before it reports back)."""
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed (apt-get install strace)")
    script = tmp_path / "write.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys
            from pathlib import Path
            from ckptqual.plan.model import FilePlan, RankPlan, TensorSpec
            from ckptqual.runs.pool import RankPool
            def files(rank):
                return (FilePlan(f"deep/er/m{rank}.pt", (TensorSpec("w", 5000, "int8"),)),
                        FilePlan(f"top{rank}.pt", (TensorSpec("w", 10, "int8"),)))

            if __name__ == "__main__":
                directory = Path(sys.argv[1]) / "checkpoint-00000"
                with RankPool(2, seed=3, timeout_s=120) as pool:
                    pool.write_checkpoint(directory, 0, (RankPlan(0, files(0)), RankPlan(1, files(1))), "stream")
            """
        )
    )
    root = tmp_path / "checkpoints"
    root.mkdir()
    log = tmp_path / "strace"
    traced = subprocess.run(
        [*STRACE, "-o", str(log), sys.executable, str(script), str(root)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert traced.returncode == 0, traced.stderr[-3000:]
    synced = set().union(*(fsynced_directories(trace.read_text()) for trace in tmp_path.glob("strace.*")))
    checkpoint = root / "checkpoint-00000"
    for directory in (root, checkpoint, checkpoint / "deep", checkpoint / "deep" / "er"):
        assert str(directory) in synced, (directory, sorted(synced))


STRACE = ["strace", "-ff", "-qq", "-e", "trace=openat,fcntl,fsync"]  # os.dup is fcntl(F_DUPFD_CLOEXEC)


def fsynced_directories(trace: str) -> set[str]:
    """Directories opened with O_DIRECTORY and then fsynced, from one process's strace log (strace -ff); a directory
    opened relative to another's descriptor (openat from a handle, as the ranks walk the run directory) by its path."""
    opened: dict[str, str] = {}
    synced = set()
    for call in trace.splitlines():
        result = call.rsplit("= ", 1)[1].split()[0] if "= " in call else ""
        if call.startswith("openat(") and "O_DIRECTORY" in call and result.isdigit():
            base, name = call[len("openat(") :].split(",", 1)[0], call.split('"')[1]
            opened[result] = name if base == "AT_FDCWD" or name.startswith("/") else f"{opened.get(base, '?')}/{name}"
        elif call.startswith("fcntl(") and "F_DUPFD" in call and result.isdigit():
            copied = call[len("fcntl(") :].split(",")[0]
            if copied in opened:
                opened[result] = opened[copied]
        elif call.startswith("fsync(") and call.rstrip().endswith("= 0"):
            fd = call[len("fsync(") :].split(")")[0]
            if fd in opened:
                synced.add(opened[fd])
    return synced


def test_xdist_workers_on_the_qualification_are_refused_before_anything_starts(tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    done = run_suite("-n", "2", "--target", str(target), *SMALL_PAIR)
    assert done.returncode == 4, done.stdout[-2000:] + done.stderr[-2000:]
    assert "run tests_qual without -n" in done.stderr
    assert list(target.iterdir()) == []


def test_a_second_run_on_the_same_target_is_refused_naming_the_first(tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    long_run = ("--checkpoints-per-pass", "10", "--passes", "50")  # still writing while the second one starts
    first = LiveSuite(tmp_path / "first.log", *SMALL_PAIR, *long_run, "--target", str(target), tests=BOTH)
    try:
        first.wait_for("ckptqual: pass 1 checkpoint 1/")
        second = run_suite(*SMALL_PAIR, "--target", str(target))
        assert first.process.poll() is None, "the first run ended too soon to test"
        assert second.returncode == 4, second.stdout[-2000:]
        assert f"is in use by another ckptqual run (PID {first.process.pid} on host" in second.stderr
    finally:
        first.process.terminate()
        first.finish()
    assert list(target.iterdir()) == []


def test_a_frozen_drive_fails_the_checkpoint_on_time_and_cannot_hold_the_run(loop_ext4, tmp_path):
    """fsfreeze mid-checkpoint: the ranks wait in the kernel; the checkpoint fails within --rank-timeout as the
    drive's fault, nothing waits on the frozen drive, and what is left is named with the command that removes it."""
    point = loop_ext4("2G")
    target = point / "target"
    target.mkdir()
    live = LiveSuite(
        tmp_path / "run.log",
        *SMALL,  # eight ranks: each writes an eighth, well within the rank timeout until the drive freezes
        "--scale",
        "0.003",
        "--rank-timeout",
        "5",
        "--target",
        str(target),
        *reports(tmp_path),
        tests=BOTH,
    )
    live.wait_for("ckptqual: pass 1 checkpoint 1/2")
    subprocess.run(["fsfreeze", "-f", str(point)], check=True)
    try:
        code = live.finish(timeout_s=120)  # a run held by the frozen drive fails here
    finally:
        subprocess.run(["fsfreeze", "-u", str(point)], check=True)
    assert code == 1, live.output()[-3000:]
    cases = junit_cases(tmp_path / "q.xml")
    assert "pass 1 FAIL: " in cases["test_fill_pass[1]"]["message"]
    assert "the drive did not respond" in cases["test_fill_pass[1]"]["message"]
    assert "NOT_RUN" in cases["test_fill_pass[2]"]["message"] and "NOT_RUN" in cases["test_restore"]["message"]
    data = results(tmp_path / "r.json")
    assert data["verdict"]["overall"] == "NOT QUALIFIED"
    assert data["cleanup"]["removed"] is False and data["cleanup"]["fix"] == f"ckptqual clean {target}"
    abandoned = data.get("abandoned_processes", [])
    assert len(abandoned) == len(set(abandoned)), abandoned  # each process stuck on the frozen drive named once
    run_dir = next(target.glob("ckptqual-run-*")).name
    assert [entry["path"] for entry in data["left_on_target"]] == [run_dir]  # the whole run directory was left
    assert "not attempted: the drive did not respond" in data["left_on_target"][0]["why"]
    cleaned = subprocess.run(
        [sys.executable, "-m", "ckptqual.cli", "clean", str(target)], capture_output=True, text=True, timeout=120
    )
    assert cleaned.returncode == 0, cleaned.stdout + cleaned.stderr
    assert list(target.iterdir()) == []


def test_a_filesystem_that_turns_read_only_mid_run_fails_the_pass_in_one_line(loop_ext4, tmp_path):
    """ext4 remounts itself read-only on an error (errors=remount-ro), here triggered through its sysfs knob."""
    point = loop_ext4("2G", "errors=remount-ro")
    device = Path(subprocess.run(["findmnt", "-n", "-o", "SOURCE", str(point)], capture_output=True, text=True).stdout)
    trigger = Path("/sys/fs/ext4") / device.name.strip() / "trigger_fs_error"
    if not trigger.exists():
        pytest.skip(f"this kernel has no {trigger}")
    target = point / "target"
    target.mkdir()
    live = LiveSuite(tmp_path / "run.log", *SMALL, "--scale", "0.003", "--target", str(target), *reports(tmp_path))
    live.wait_for("ckptqual: pass 1 checkpoint 1/2")
    trigger.write_text("ckptqual test\n")
    assert live.finish() == 1, live.output()[-3000:]
    message = junit_cases(tmp_path / "q.xml")["test_fill_pass[1]"]["message"]
    assert message.startswith("pass 1 FAIL: ") and "\n" not in message
    assert "[Errno 30 EROFS] Read-only file system" in message and str(target) in message
    assert "Traceback" not in live.output()
    data = results(tmp_path / "r.json")
    assert data["tests"][next(iter(data["tests"]))]["outcome"] == "FAIL"
    assert data["verdict"]["overall"] == "NOT QUALIFIED"
    assert data["cleanup"]["removed"] is False and "[Errno 30 EROFS]" in " ".join(data["cleanup"]["errors"])


def test_a_checkpoint_file_lost_before_the_restore_fails_it_naming_the_file(tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    plugin = tmp_path / "lose_a_file.py"
    plugin.write_text(
        textwrap.dedent(
            """
            import os, pathlib, pytest

            @pytest.hookimpl(tryfirst=True)
            def pytest_runtest_call(item):
                if item.name == "test_restore":
                    newest = sorted(pathlib.Path(os.environ["TARGET"]).glob("ckptqual-run-*/checkpoints/*"))[-1]
                    next(p for p in sorted(newest.rglob("*.pt"))).unlink()
            """
        )
    )
    command = [sys.executable, "-m", "pytest", *(str(REPO / "tests_qual" / name) for name in BOTH)]
    command += ["-p", "no:cacheprovider", "-p", "lose_a_file", *SMALL_PAIR, "--target", str(target), *reports(tmp_path)]
    env = user_environment({"PYTHONPATH": plugin_path(tmp_path), "TARGET": str(target)})
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stdout[-3000:]
    message = junit_cases(tmp_path / "q.xml")["test_restore"]["message"]
    assert message.startswith("restore FAIL: checkpoint 3 cannot be read back: evict ")
    assert "[Errno 2 ENOENT] No such file or directory" in message
    assert results(tmp_path / "r.json")["verdict"]["overall"] == "NOT QUALIFIED"
    assert list(target.iterdir()) == []


def test_what_a_killed_run_left_is_named_in_the_space_refusal_and_clean_removes_it(tmpfs, tmp_path):
    target = tmpfs("size=400m") / "target"
    target.mkdir()
    big = ("--workload", "llama3-8b-dp2", "--scale", "0.001", "--checkpoints-per-pass", "3", "--passes", "1")  # ~105 MB
    killed = LiveSuite(tmp_path / "killed.log", *big, "--target", str(target))
    killed.wait_for("ckptqual: pass 1 checkpoint 2/3")
    killed.process.kill()
    killed.finish()
    again = run_suite(*big, "--checkpoints-per-pass", "2", "--target", str(target))
    assert again.returncode == 4, again.stdout[-2000:]
    refusal = again.stderr
    assert "GB free" in refusal and "left by 1 earlier run that did not finish (ckptqual-run-" in refusal
    assert f"remove it with: ckptqual clean {target}" in refusal
    cleaned = subprocess.run(
        [sys.executable, "-m", "ckptqual.cli", "clean", str(target)], capture_output=True, text=True
    )
    assert cleaned.returncode == 0, cleaned.stdout + cleaned.stderr
    assert list(target.iterdir()) == []
