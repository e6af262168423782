"""The `ckptqual` command: plan, workloads and clean subcommands, and its one-line errors."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import ckptqual
from ckptqual.cli import main
from ckptqual.host.target import LOCK_FILE, RUN_MARKER, TARGET_MARKER
from ckptqual.plan.workloads import available_workloads

REVIEW_BYTES = 1_635_776_902_656


def plan_json(capsys, *args: str) -> dict:
    assert main(["plan", "llama3.1-405b-review", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_plan_json_gives_the_review_totals(capsys):
    plan = plan_json(capsys)
    assert plan["total_bytes"] == REVIEW_BYTES
    assert plan["files"] == 536
    assert len(plan["ranks"]) == 8
    assert sum(r["bytes"] for r in plan["ranks"]) == REVIEW_BYTES


def test_plan_scale_halves_the_bytes(capsys):
    plan = plan_json(capsys, "--scale", "0.5")
    assert plan["scale"] == 0.5
    assert plan["files"] == 536
    assert plan["total_bytes"] == pytest.approx(REVIEW_BYTES / 2, rel=1e-9)


def test_plan_table_says_what_space_is_needed(capsys):
    assert main(["plan", "llama3-1t"]) == 0
    out = capsys.readouterr().out
    assert "16,564,174,094,592 bytes" in out  # DLIO's bytes (tests/test_mlperf.py)
    assert "16,564.17 GB" in out and "15,426.59 GiB" in out
    assert "2,072 over 1024 ranks" in out
    assert "512-1023" in out  # alike ranks share one row


def test_workloads_lists_every_workload_with_its_size(capsys):
    assert main(["workloads"]) == 0
    out = capsys.readouterr().out
    for name in available_workloads():
        assert name in out
    assert "1,635.78" in out


def test_plan_by_path(capsys):
    path = Path(ckptqual.__file__).parents[2] / "fixtures" / "workloads" / "llama3-8b.toml"
    assert main(["plan", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["total_bytes"] == 112_425_623_552


def test_bad_workload_name_exits_2(capsys):
    assert main(["plan", "llama9"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "'llama9'" in captured.err and "available:" in captured.err
    assert len(captured.err.strip().splitlines()) == 1


@pytest.mark.parametrize("scale", ["0", "-0.5", "1.5", "abc", "nan", "inf"])
def test_bad_scale_exits_2(capsys, scale):
    assert main(["plan", "llama3-8b", f"--scale={scale}"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"ckptqual plan: --scale {scale!r}: must be a number with 0 < scale <= 1" in err
    assert len(err.splitlines()) == 1


def test_plan_help_shows_the_scale_default_from_the_settings_table(capsys):
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert (
        "--scale SCALE shrink every tensor (and the odd layouts) by this factor, 0 < S <= 1, and not so far that the "
        "checkpoint holds less than one 4K block per file (default: 1.0)"
    ) in help_text


def run_module(*args: str) -> subprocess.CompletedProcess:
    src = str(Path(ckptqual.__file__).parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "ckptqual.cli", *args], capture_output=True, text=True, env=env, timeout=120
    )


def test_module_entry_point():
    good = run_module("plan", "llama3.1-405b-review", "--json")
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout)["total_bytes"] == REVIEW_BYTES
    bad = run_module("plan", "llama9")
    assert bad.returncode == 2
    assert "llama9" in bad.stderr and bad.stdout == ""


# ---- ckptqual clean ------------------------------------------------------------------------------------------

# A run in another process: opens the target, declares and writes one checkpoint file, prints its run
# directory, then waits for a line on stdin before cleaning up (or is killed before that).
RUN_IN_CHILD = r"""
import os, sys
from pathlib import Path
from ckptqual.host.target import open_target
target = open_target(Path(sys.argv[1]))
target.declare("checkpoints/checkpoint-*", ["rank-0/model.pt"])
directory = target.run_dir / "checkpoints" / "checkpoint-00001" / "rank-0"
directory.mkdir(parents=True)
(directory / "model.pt").write_bytes(os.urandom(int(sys.argv[2])))
print(target.run_dir, flush=True)
sys.stdin.readline()
target.cleanup()
"""


@pytest.fixture
def start_run() -> Iterator[Callable[[Path, int], tuple[subprocess.Popen, Path]]]:
    """Starts a run holding a target in a child process; kills any still running at the end."""
    children: list[subprocess.Popen] = []

    def start(target: Path, size_bytes: int = 4096) -> tuple[subprocess.Popen, Path]:
        child = subprocess.Popen(
            [sys.executable, "-c", RUN_IN_CHILD, str(target), str(size_bytes)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        children.append(child)
        assert child.stdout is not None
        line = child.stdout.readline().strip()
        assert line.startswith("/"), f"the child run did not start: {line!r}"
        return child, Path(line)

    yield start
    for child in children:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=60)


def killed_run(start_run, target: Path, size_bytes: int = 4096) -> Path:
    """A run that died by SIGKILL after writing a checkpoint file: its directory."""
    child, run_dir = start_run(target, size_bytes)
    child.send_signal(signal.SIGKILL)
    assert child.wait(timeout=60) == -signal.SIGKILL
    return run_dir


def snapshot(root: Path) -> dict[str, str]:
    """Every path under root with its file's digest: compared before and after."""
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
        for path in sorted(root.rglob("*"))
    }


def test_clean_removes_a_dead_runs_directory(tmp_path, start_run, capsys):
    run_dir = killed_run(start_run, tmp_path, size_bytes=2_000_000)
    assert {p.name for p in tmp_path.iterdir()} == {run_dir.name, TARGET_MARKER, LOCK_FILE}
    assert main(["clean", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"{run_dir.name} (PID " in out and "did not finish): removed 2 files, 2.0" in out
    assert f"removed the stale lock file {LOCK_FILE} (PID " in out
    assert f"removed the target marker {TARGET_MARKER}" in out
    assert out.strip().endswith("everything of ckptqual's is gone")
    assert list(tmp_path.iterdir()) == []


def test_clean_keeps_a_foreign_file_in_a_dead_run_and_says_so(tmp_path, start_run, capsys):
    run_dir = killed_run(start_run, tmp_path)
    visitor = run_dir / "checkpoints" / "checkpoint-00001" / "visitor.txt"
    visitor.write_text("not ckptqual's")
    assert main(["clean", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"  left {run_dir.name}/checkpoints/checkpoint-00001/visitor.txt: not created by ckptqual" in out
    assert "left 1 entry (see above)" in out
    assert visitor.read_text() == "not ckptqual's"
    kept = snapshot(tmp_path)
    assert kept.pop(TARGET_MARKER) and kept.pop(f"{run_dir.name}/{RUN_MARKER}")  # the run is still known as ckptqual's
    assert kept == {
        run_dir.name: "dir",
        f"{run_dir.name}/checkpoints": "dir",
        f"{run_dir.name}/checkpoints/checkpoint-00001": "dir",
        f"{run_dir.name}/checkpoints/checkpoint-00001/visitor.txt": hashlib.sha256(b"not ckptqual's").hexdigest(),
    }
    visitor.unlink()  # as the advice says: the user removes what is not ckptqual's, then cleans again
    assert main(["clean", str(tmp_path)]) == 0 and list(tmp_path.iterdir()) == []


def test_clean_refuses_a_live_run_and_names_it(tmp_path, start_run, capsys):
    child, run_dir = start_run(tmp_path)
    before = snapshot(tmp_path)
    assert main(["clean", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"in use by another ckptqual run (PID {child.pid} on host {socket.gethostname()}, since " in captured.err
    assert f"run directory {run_dir.name})" in captured.err and len(captured.err.strip().splitlines()) == 1
    assert snapshot(tmp_path) == before
    child.communicate("\n", timeout=60)
    assert child.returncode == 0 and list(tmp_path.iterdir()) == []


def test_clean_dry_run_changes_nothing(tmp_path, start_run, capsys):
    run_dir = killed_run(start_run, tmp_path)
    (run_dir / "visitor.txt").write_text("not ckptqual's")
    before = snapshot(tmp_path)
    assert main(["clean", str(tmp_path), "--dry-run"]) == 1  # what the real clean would return
    out = capsys.readouterr().out
    assert f"{run_dir.name} (PID " in out and "did not finish): would remove 1 file" in out
    assert f"  would leave {run_dir.name}/visitor.txt: not created by ckptqual" in out
    assert f"would remove the stale lock file {LOCK_FILE}" in out
    assert "nothing changed (dry run)" in out
    assert snapshot(tmp_path) == before


def test_clean_never_touches_an_unmarked_directory(tmp_path, capsys):
    (tmp_path / TARGET_MARKER).write_text("")
    lookalike = tmp_path / "ckptqual-run-20260101-000000-1"
    (lookalike / "checkpoints" / "checkpoint-00001").mkdir(parents=True)
    (lookalike / "checkpoints" / "checkpoint-00001" / "model.pt").write_bytes(os.urandom(4096))
    before = snapshot(lookalike)
    assert main(["clean", str(tmp_path)]) == 0
    assert "removed 0 bytes from 0 run directories" in capsys.readouterr().out
    assert snapshot(lookalike) == before


def test_clean_of_a_kept_run_removes_it(tmp_path, capsys):
    from ckptqual.host.target import open_target

    target = open_target(tmp_path, keep=True)
    target.declare("raw", ["raw-000.bin"])
    (target.run_dir / "raw").mkdir()
    (target.run_dir / "raw" / "raw-000.bin").write_bytes(os.urandom(4096))
    target.cleanup()
    assert main(["clean", str(tmp_path)]) == 0
    assert "kept with --keep): removed 2 files" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda root: root / "missing", "does not exist"),
        (lambda root: Path("/etc"), "is a system directory"),
    ],
)
def test_clean_usage_errors_exit_2_and_change_nothing(tmp_path, capsys, make, message):
    (tmp_path / "precious.bin").write_bytes(os.urandom(4096))
    before = snapshot(tmp_path)
    assert main(["clean", str(make(tmp_path))]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and message in captured.err and len(captured.err.strip().splitlines()) == 1
    assert captured.err.startswith("ckptqual clean: ")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]])
def test_clean_of_a_target_with_nothing_of_ours_says_so_and_exits_0(tmp_path, capsys, dry_run):
    (tmp_path / "precious.bin").write_bytes(os.urandom(4096))
    before = snapshot(tmp_path)
    assert main(["clean", str(tmp_path), *dry_run]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith(f"nothing to clean: target {tmp_path.resolve()} holds nothing of ckptqual's")
    assert captured.err == "" and snapshot(tmp_path) == before


def test_version_prints_the_package_version_and_exits_0(capsys):
    """In process: argparse's --version ends the command with SystemExit(0), which a process exits with."""
    from importlib.metadata import version

    with pytest.raises(SystemExit) as end:
        main(["--version"])
    assert end.value.code == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == f"ckptqual {version('ckptqual')}" and captured.err == ""


def test_clean_refuses_a_read_only_target(tmpfs, capsys):
    point = tmpfs("ro,size=1m")
    assert main(["clean", str(point)]) == 2
    assert f"is on a read-only filesystem (mounted at {point}); remount it read-write" in capsys.readouterr().err


def test_clean_by_the_module_entry_point(tmp_path, start_run):
    run_dir = killed_run(start_run, tmp_path)
    result = run_module("clean", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert run_dir.name in result.stdout and list(tmp_path.iterdir()) == []
