"""Once a layout fails (the drive failed: a frozen filesystem; a rank stopped; the run directory tampered with), the
odd layouts stop at once: no more are written, none is shrunk, and the summary counts only the layouts written and
verified."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from stand_in import slow_drive
from suite_runs import REPO, LiveSuite, junit_cases, rank_processes, results

# Two ranks: how the layouts stop does not depend on how many ranks write them.
TINY = ["--workload", "llama3-8b-dp2", "--scale", "0.0002", "--layout-examples", "5", "--layout-max-bytes", "32M"]


def test_the_odd_layouts_stop_at_the_first_failure_and_count_only_what_was_written(tmp_path):
    target, outside = tmp_path / "target", tmp_path / "outside"
    target.mkdir()
    outside.mkdir()
    env = {
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(REPO / "tests" / "fault_plugins"), os.environ.get("PYTHONPATH")])
        ),
        "CKPTQUAL_PLANT": "layouts",
        "CKPTQUAL_PLANT_BEFORE": "test_shard_layouts",
        "CKPTQUAL_PLANT_OUTSIDE": str(outside),
    }
    xml, json_path = tmp_path / "q.xml", tmp_path / "r.json"
    args = ["-p", "plant", *TINY, "--target", str(target), "--junitxml", str(xml), "--results", str(json_path)]
    suite = LiveSuite(tmp_path / "log", *args, tests=("test_shard_layouts.py",), env=env)
    code, output = suite.finish(timeout_s=600), suite.output()
    assert code == 1 and "Traceback" not in output, output[-3000:]
    record = results(json_path)
    assert len(record.get("layouts", [])) <= 1, record["layouts"]  # one tried, none shrunk or tried after it
    assert output.count("ckptqual: layout 0 failed: ") == 1 and "ckptqual: layout 1 failed" not in output
    assert "odd shard layouts: 0 written and verified" in output, output[-3000:]
    assert junit_cases(xml)["test_shard_layouts"]["outcome"] in ("failure", "error")
    assert list(outside.iterdir()) == []


def layouts_running(target: Path, layout: int = 1, timeout_s: float = 300) -> None:
    """Waits until the run has begun odd layout number `layout` (its directory exists under the run's layouts/)."""
    deadline = time.monotonic() + timeout_s
    while not list(target.glob(f"ckptqual-run-*/layouts/layout-{layout:03d}*")):
        assert time.monotonic() < deadline, f"no layout {layout} within {timeout_s} s"
        time.sleep(0.02)


def layouts_run(tmp_path: Path, target: Path, *more: str) -> tuple[LiveSuite, Path, Path]:
    xml, json_path = tmp_path / "q.xml", tmp_path / "r.json"
    args = [*TINY[:-4], "--layout-examples", "200", "--layout-max-bytes", "32M", "--rank-timeout", str(RANK_TIMEOUT_S)]
    args += ["--target", str(target), "--junitxml", str(xml), "--results", str(json_path), *more]
    return LiveSuite(tmp_path / "log", *args, tests=("test_shard_layouts.py",)), xml, json_path


# The drive: the stand-in (stand_in/slow_drive.py), its image in memory of its own and held to rates far above what
# a layout needs, so that no other work's I/O slows a layout towards the rank timeout. A frozen drive's run waits the
# timeout for the ranks, then for each removal it cannot do.
throttled_target = slow_drive.throttled_target(write_bps=200_000_000, read_bps=400_000_000, size_mb=256)
RANK_TIMEOUT_S = 5
CLEANUP_S = 60  # stopping the ranks, removing what the run wrote, the reports: on a loaded 2-core host


def assert_stopped_in_one_line(output: str, record: dict, xml: Path, cause: str) -> None:
    """The layouts stopped at the failed one, its cause named once, not QUALIFIED, and no traceback."""
    assert "Traceback" not in output, output[-3000:]
    failed = [line for line in output.splitlines() if line.startswith("ckptqual: layout ") and " failed: " in line]
    assert len(failed) == 1 and cause in output, output[-3000:]
    number = int(failed[0].split()[2])
    assert f"ckptqual: layout {number + 1}" not in output, output[-3000:]
    assert record["verdict"]["overall"] != "QUALIFIED" and len(record.get("layouts", [])) <= 2, record["verdict"]
    assert junit_cases(xml)["test_shard_layouts"]["outcome"] in ("failure", "error")
    written = next(line for line in output.splitlines() if line.startswith("odd shard layouts: "))
    assert "NOT_RUN" not in written, written


def test_a_frozen_filesystem_stops_the_odd_layouts_at_once(throttled_target, tmp_path):
    point = throttled_target.point
    target = point / "target"
    target.mkdir()
    suite, xml, json_path = layouts_run(tmp_path, target)
    layouts_running(target)
    subprocess.run(["fsfreeze", "-f", str(point)], check=True)
    frozen = time.monotonic()
    try:
        code = suite.finish(timeout_s=RANK_TIMEOUT_S + CLEANUP_S)
    finally:
        subprocess.run(["fsfreeze", "-u", str(point)], check=True)
    output, record = suite.output(), results(json_path)
    assert code == 1, output[-3000:]  # NOT QUALIFIED: the drive did not respond
    assert time.monotonic() - frozen < RANK_TIMEOUT_S + CLEANUP_S
    assert_stopped_in_one_line(output, record, xml, "the drive did not respond")
    cleaned = subprocess.run(
        [sys.executable, "-m", "ckptqual.cli", "clean", str(target)], capture_output=True, text=True, timeout=120
    )  # the fix the run names for what it could not remove from the frozen drive
    assert cleaned.returncode == 0, cleaned.stdout + cleaned.stderr
    assert list(target.iterdir()) == []


def test_a_stopped_rank_stops_the_odd_layouts_at_once(throttled_target, tmp_path):
    target = throttled_target.point / "target"
    target.mkdir()
    suite, xml, json_path = layouts_run(tmp_path, target)
    layouts_running(target, 0)
    [rank, *_] = rank_processes(suite.process.pid)  # found before layout 1, which is stopped as soon as it begins
    layouts_running(target)
    os.kill(rank, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        code = suite.finish(timeout_s=RANK_TIMEOUT_S + CLEANUP_S)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(rank, signal.SIGCONT)
    output, record = suite.output(), results(json_path)
    assert code != 0, output[-3000:]
    assert time.monotonic() - stopped < RANK_TIMEOUT_S + CLEANUP_S
    assert_stopped_in_one_line(output, record, xml, "(stopped)")
    assert list(target.iterdir()) == []  # the drive answered: the run removed all it wrote
