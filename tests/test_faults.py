"""Faults, for real: a full filesystem, an interrupted run, corrupted checkpoints, a failing read."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ckptqual.host.beneath import RunTree
from ckptqual.io.engines.base import ReadBackError
from ckptqual.io.engines.torchread.source import pread_exactly
from ckptqual.plan.model import CheckpointPlan, FilePlan, RankPlan, TensorSpec
from ckptqual.runs.failure import RankFailure
from ckptqual.runs.fill import FillCampaign, FillError
from ckptqual.runs.pool import RankPool
from ckptqual.runs.restore import evict_checkpoint
from expected_basis import head
from suite_runs import junit_cases, suite_properties

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def small_filesystem(tmpfs):
    """A 64 MiB tmpfs mounted inside the test's temporary directory."""
    return tmpfs("size=64m")


def two_rank_plan(megabytes: int) -> CheckpointPlan:
    files = lambda rank: (  # noqa: E731
        FilePlan(f"model-{rank}.pt", (TensorSpec("w", megabytes * 500_000, "float16"), TensorSpec("b", 3, "int8"))),
        FilePlan(f"optim/optimizer-{rank}.pt", (TensorSpec("state", megabytes * 250_000, "float32"),)),
    )
    return CheckpointPlan("two-rank", (RankPlan(0, files(0)), RankPlan(1, files(1))))


@pytest.fixture(scope="module")
def pool():
    with RankPool(2, seed=4242, timeout_s=120) as ranks:
        yield ranks


def test_enospc_mid_pass_fails_it_and_removes_the_partial_checkpoint(small_filesystem, pool, checkpoint_space):
    plan = two_rank_plan(12)
    space, root = checkpoint_space(plan, small_filesystem)
    campaign = FillCampaign(root, plan, pool, "stream", checkpoints_per_pass=3, remove=space.remove)  # 3 x 48 MB
    expected = r"the target ran out of space: rank \d failed during checkpoint 2/3 of pass 1 .*\[Errno 28 ENOSPC\]"
    with pytest.raises(FillError, match=expected) as error:
        campaign.run_pass(1)
    assert error.value.fault == "out-of-space"
    assert sorted(p.name for p in root.iterdir()) == ["checkpoint-00000"]
    with pytest.raises(FillError, match=r"not run: pass 1 failed \(the target ran out of space\)") as later:
        campaign.run_pass(2)
    assert later.value.fault == "not-run"


def written_checkpoints(checkpoint_space, pool, count=2):
    plan = two_rank_plan(1)
    space, root = checkpoint_space(plan)
    campaign = FillCampaign(root, plan, pool, "stream", checkpoints_per_pass=count, remove=space.remove)
    campaign.run_pass(1)
    return plan, [directory for _, directory in campaign.retained]


def read_back(pool, plan, directory, checkpoint):
    with RunTree(directory.parent) as tree:
        evict_checkpoint(tree, directory, plan)
    return pool.run(
        "read", directory, plan.ranks, f"restore of checkpoint {checkpoint}", checkpoint, {"engine": "stream"}
    )


def data_offset(path: Path, tensor: str) -> int:
    from ckptqual.io.engines.torchread.stored import read_table

    return next(t.data_offset for t in read_table(path) if t.name == tensor)


def test_an_intact_checkpoint_reads_back_verified(checkpoint_space, pool):
    plan, (_, newest) = written_checkpoints(checkpoint_space, pool)
    timing = read_back(pool, plan, newest, 1)
    assert timing.bytes == plan.total_bytes


def overwrite(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as file:
        file.seek(offset)
        file.write(data)


@pytest.mark.parametrize(
    ("damage", "found"),
    [
        ("flip", "corrupted bytes inside a block with a correct header"),
        ("zeros", "zeros"),
        ("stale", "stale data from checkpoint 0"),
        ("other-rank", "a block from rank 1"),
        ("garbage", "garbage (no payload header)"),
    ],
)
def test_each_kind_of_damage_is_named_with_file_and_offset(checkpoint_space, pool, damage, found):
    plan, (older, newest) = written_checkpoints(checkpoint_space, pool)
    victim = newest / "model-0.pt"
    offset = data_offset(victim, "w") + 3 * 4096
    if damage == "flip":
        original = victim.read_bytes()[offset + 100]
        overwrite(victim, offset + 100, bytes([original ^ 0x10]))
    elif damage == "zeros":
        overwrite(victim, offset, bytes(4096))
    elif damage == "stale":
        overwrite(victim, offset, (older / "model-0.pt").read_bytes()[offset : offset + 4096])
    elif damage == "other-rank":
        donor = newest / "model-1.pt"
        start = data_offset(donor, "w") + 3 * 4096
        overwrite(victim, offset, donor.read_bytes()[start : start + 4096])
    else:
        overwrite(victim, offset, np.random.default_rng(1).bytes(4096))
    with pytest.raises(RankFailure) as failure:
        read_back(pool, plan, newest, 1)
    message = str(failure.value)
    assert "rank 0 failed during restore of checkpoint 1: IntegrityError" in message
    assert f"{newest.name}/model-0.pt: tensor 'w' at file offset {offset}" in message
    assert found in message


def test_a_truncated_file_is_reported(checkpoint_space, pool):
    plan, (_, newest) = written_checkpoints(checkpoint_space, pool)
    victim = newest / "optim" / "optimizer-1.pt"
    os.truncate(victim, victim.stat().st_size // 2)
    with pytest.raises(RankFailure, match=r"rank 1 failed .*optimizer-1.pt: truncated: the file is \d+ bytes"):
        read_back(pool, plan, newest, 1)


def test_an_io_error_on_read_back_names_file_and_offset(tmp_path):
    directory_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)  # the kernel refuses to read it: EISDIR
    try:
        with pytest.raises(ReadBackError, match=r"ckpt.pt: I/O error at file offset 8192: Is a directory"):
            pread_exactly(directory_fd, np.empty(4096, np.uint8), 8192, tmp_path / "ckpt.pt")
    finally:
        os.close(directory_fd)


# Two ranks, 11 MB a checkpoint: the faults reach the run through its controller and any rank; eight ranks are
# not the point here.
SMALL = ["--workload", "llama3-8b-dp2", "--scale", "0.0001", "-p", "no:cacheprovider"]


def suite(*args: str, env: dict | None = None, **popen) -> subprocess.Popen:
    command = [
        sys.executable,
        "-m",
        "pytest",
        str(REPO / "tests_qual" / "test_fill.py"),
        str(REPO / "tests_qual" / "test_restore.py"),
        *SMALL,
        *args,
    ]
    return subprocess.Popen(
        command,
        cwd=REPO,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **popen,
    )


def test_enospc_in_a_qualification_run_fails_that_pass_and_the_reports_say_why(small_filesystem, tmp_path):
    target = small_filesystem / "target"
    target.mkdir()
    ballast = small_filesystem / "ballast.bin"  # outside the target, in the test's own filesystem
    env = plugins_env(  # the plugin beside this tree's ckptqual, not whichever one is installed
        CKPTQUAL_BALLAST=str(ballast),
        CKPTQUAL_BALLAST_BEFORE="test_fill_pass[1]",
        CKPTQUAL_BALLAST_LEAVE_BYTES=str(16 << 20),
    )
    process = suite(
        "-p",
        "ballast",
        "--target",
        str(target),
        "--checkpoints-per-pass",
        "2",
        "--passes",
        "2",
        "--junitxml",
        str(tmp_path / "q.xml"),
        "--results",
        str(tmp_path / "r.json"),
        env=env,
    )
    output, _ = process.communicate(timeout=600)
    assert process.returncode == 1 and (tmp_path / "q.xml").is_file(), output[-3000:]  # exit 1 before any test too
    cases = junit_cases(tmp_path / "q.xml")
    assert "the target ran out of space: rank" in cases["test_fill_pass[1]"]["message"]
    assert "[Errno 28 ENOSPC]" in cases["test_fill_pass[1]"]["message"]
    assert "NOT_RUN: not run: pass 1 failed (the target ran out of space)" in cases["test_fill_pass[2]"]["message"]
    assert "not run: pass 1 failed" in cases["test_restore"]["message"]
    assert cases["verdict"]["outcome"] == "failure" and "NOT QUALIFIED" in cases["verdict"]["message"]
    results = json.loads((tmp_path / "r.json").read_text())
    assert results["cleanup"]["removed"] is True and results["verdict"]["overall"] == "NOT QUALIFIED"
    assert list(target.iterdir()) == []


def test_a_target_full_before_the_run_is_refused_in_one_line_before_any_write(loop_ext4, tmp_path):
    mount = loop_ext4("64M", mkfs=("-m", "0"))
    target = mount / "target"
    target.mkdir()
    fill_up(mount / "ballast.bin")
    process = suite("--target", str(target), "--results", str(tmp_path / "r.json"), env=plugins_env())
    output, _ = process.communicate(timeout=600)
    assert process.returncode == 4, output[-3000:]
    assert "Traceback" not in output and "Error:" not in output, output[-3000:]
    refusal = output.rstrip().splitlines()[-1]
    assert refusal.startswith(f"ERROR: --target {target}: the run needs ") and refusal.endswith("use a larger target")
    assert list(target.iterdir()) == []


def test_enospc_in_the_runs_own_setup_is_one_line_naming_the_target_and_the_fix(loop_ext4, tmp_path):
    """The space check passes; then another process fills the filesystem to its last block just before the first
    test's fixtures open the run (its lock, marker, run directory and manifest): every test fails in one line."""
    mount = loop_ext4("200M", mkfs=("-m", "0"))  # no blocks kept for root: full is full for the suite too
    target = mount / "target"
    target.mkdir()
    env = plugins_env(CKPTQUAL_BALLAST=str(mount / "ballast.bin"), CKPTQUAL_BALLAST_BEFORE="test_fill_pass[1]",
                      CKPTQUAL_BALLAST_AT="setup", CKPTQUAL_BALLAST_LEAVE_BYTES="0")  # fmt: skip
    process = suite("-p", "ballast", "--target", str(target), "--results", str(tmp_path / "r.json"), env=env)
    output, _ = process.communicate(timeout=600)
    assert process.returncode == 1, output[-3000:]  # NOT QUALIFIED: the drive had no space (docs/verdict.md)
    assert "Traceback" not in output and "OSError" not in output and "TargetError" not in output, output[-3000:]
    verdict = output.rstrip().splitlines()[-1]
    assert verdict.startswith(f"ckptqual verdict: NOT QUALIFIED: pass 1 FAIL (in setup): create {target}/"), verdict
    assert "[Errno 28 ENOSPC] No space left on device" in verdict and "free some or use a larger target" in verdict
    assert list(target.iterdir()) == []  # the lock and the marker undone


def plugins_env(**more: str) -> dict[str, str]:
    """The fault plugins importable beside this tree's ckptqual."""
    paths = [str(REPO / "tests" / "fault_plugins"), os.environ.get("PYTHONPATH", "")]
    return {"PYTHONPATH": os.pathsep.join(filter(None, paths)), **more}


def fill_up(path: Path) -> None:
    """Writes `path` until its filesystem has no block left (ENOSPC)."""
    with open(path, "wb", buffering=0) as ballast:
        try:
            while True:
                ballast.write(b"\xff" * (1 << 20))
        except OSError as error:
            assert error.errno == 28, error


@pytest.mark.parametrize("fault", ["ENOSPC", "EIO"])
def test_a_fault_while_the_sweep_sets_up_fails_its_first_cell_in_one_line(tmpfs, loop_ext4, tmp_path, fault):
    """The filesystem full (ENOSPC), or shut down (EIO, the ext4 shutdown ioctl), just before the sweep's first cell
    is set up (its files declared in the run's manifest, then written): that cell fails with one line naming the write
    and the errno, no traceback; the reports are written and the verdict is NOT QUALIFIED."""
    point = tmpfs("size=128m") if fault == "ENOSPC" else loop_ext4("256M")
    target = point / "target"
    target.mkdir()
    first = "test_read_sweep[cpu-only-1M-1]"
    env = {"PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO / "tests" / "fault_plugins")])}  # this tree
    if fault == "ENOSPC":
        env |= {"CKPTQUAL_BALLAST": str(point / "ballast.bin"), "CKPTQUAL_BALLAST_BEFORE": first}
        env |= {"CKPTQUAL_BALLAST_AT": "setup", "CKPTQUAL_BALLAST_LEAVE_BYTES": "0"}
    else:
        env |= {"CKPTQUAL_SHUTDOWN": str(target), "CKPTQUAL_SHUTDOWN_BEFORE": first}
    plugin = "ballast" if fault == "ENOSPC" else "shutdown"
    sweep = ["--sweep-block-sizes", "1M", "--sweep-threads", "1", "--sweep-file-bytes", "8M", "--transfer", "cpu-only"]
    tests = [str(REPO / "tests_qual" / name) for name in ("test_fill.py", "test_read_sweep.py")]  # the run set up
    fill = ["--checkpoints-per-pass", "2", "--passes", "1"]
    command = [sys.executable, "-m", "pytest", *tests, *SMALL, *fill, "-p", plugin]
    reports = ["--junitxml", str(tmp_path / "q.xml"), "--results", str(tmp_path / "r.json")]
    done = subprocess.run(
        [*command, *sweep, "--target", str(target), *reports],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 1, output[-3000:]
    assert "Traceback" not in output and "write_json_atomically" not in output, output[-3000:]
    message = junit_cases(tmp_path / "q.xml")[first]["message"]
    errno_word = "[Errno 28 ENOSPC]" if fault == "ENOSPC" else "[Errno 5 EIO]"
    assert "sweep cpu-only-1M-1 FAIL (in setup): write " in message and errno_word in message, message
    results = json.loads((tmp_path / "r.json").read_text())
    assert results["verdict"]["overall"] == "NOT QUALIFIED"
    assert done.stdout.rstrip().splitlines()[-1].startswith(head(results["verdict"]))  # stderr: warnings beside it
    if fault == "ENOSPC":  # a shut-down filesystem keeps the run directory: nothing can be removed from it
        assert results["cleanup"]["removed"] is True and list(target.iterdir()) == []


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_run_is_an_error_in_the_junit_and_incomplete_in_the_results(tmp_path, signum):
    target = tmp_path / "target"
    target.mkdir()
    process = suite(
        "--target",
        str(target),
        "--checkpoints-per-pass",
        "20",
        "--passes",
        "3",
        "--results",
        str(tmp_path / "r.json"),
        "--junitxml",
        str(tmp_path / "q.xml"),
    )
    for line in process.stdout:
        if "ckptqual: pass 2 checkpoint 2/20" in line:
            break
    process.send_signal(signum)
    sent = time.monotonic()
    output, _ = process.communicate(timeout=120)
    assert time.monotonic() - sent < 60
    assert process.returncode == 2, output[-2000:]  # pytest's "interrupted"
    by = "SIGINT (Ctrl-C)" if signum == signal.SIGINT else "SIGTERM"
    cases = junit_cases(tmp_path / "q.xml")
    first = cases["test_fill_pass[1]"]  # judged before the signal: a busy host may make it INVALID, never FAIL
    assert first["outcome"] == "passed" or "INVALID" in first["message"], first
    running = cases["test_fill_pass[2]"]
    assert (
        running["outcome"] == "error" and f"pass 2 INTERRUPTED: the run was interrupted by {by}" in running["message"]
    )
    for name in ("test_fill_pass[3]", "test_restore"):
        assert (
            cases[name]["outcome"] == "error" and "NOT_RUN: not run: the run was interrupted" in cases[name]["message"]
        )
    results = json.loads((tmp_path / "r.json").read_text())
    overall = results["verdict"]["overall"]
    assert overall == ("INCOMPLETE" if first["outcome"] == "passed" else "INVALID")  # INVALID outranks INCOMPLETE
    assert cases["verdict"]["outcome"] == "failure" and overall in cases["verdict"]["message"]
    assert suite_properties(tmp_path / "q.xml")["ckptqual.limits.verdict"] == overall
    last = output.rstrip().splitlines()[-1]
    assert last.startswith(head(results["verdict"])) and f"the run was interrupted by {by} during " in last
    assert any(r.startswith(f"the run was interrupted by {by} during ") for r in results["verdict"]["reasons"])
    assert results["tests"][next(k for k in results["tests"] if k.endswith("[2]"))]["outcome"] == "INTERRUPTED"
    assert len(results["checkpoints"]) >= 21 and results["cleanup"]["removed"] is True
    assert list(target.iterdir()) == []
    leftovers = subprocess.run(["pgrep", "-f", "ckptqual-rank"], capture_output=True, text=True).stdout.split()
    assert leftovers == [] or all(not Path(f"/proc/{pid}").exists() for pid in leftovers)


def restore_result(seconds: float, payload_GBps: float, cached: float = 0.0):
    from ckptqual.runs.restore import RestoreResult

    return RestoreResult(1, 2_000_000_000, seconds, seconds / 2, cached, payload_GBps, [])


def test_a_restore_served_from_cache_or_bound_by_checking_is_invalid():
    assert restore_result(1.0, 10.0).invalid_reason() is None
    assert "still in the page cache" in restore_result(1.0, 10.0, cached=0.5).invalid_reason()
    assert "verification was the bottleneck" in restore_result(1.0, 2.5).invalid_reason()
