"""The target guard: one run at a time, refuse anything not ours, remove only what the run recorded as written."""

import hashlib
import json
import multiprocessing
import os
import pickle
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from ckptqual.faults import RunError
from ckptqual.host.guard import LOCK_FILE, RUN_MARKER, RUN_PREFIX, TARGET_MARKER, TargetError
from ckptqual.host.identity import identify
from ckptqual.host.leftovers import describe_leftovers, leftover_runs
from ckptqual.host.manifest import FILE_LIST, write_file_list
from ckptqual.host.removal import NOT_OURS, remove_owned
from ckptqual.host.target import check_target, open_target

# A run in another process: opens the target, declares and writes one checkpoint file of argv[2] bytes, prints
# its run directory, then waits for a line on stdin before cleaning up (or is killed before that).
RUN_IN_CHILD = r"""
import os, sys
from pathlib import Path
from ckptqual.host.target import open_target
try:
    target = open_target(Path(sys.argv[1]))
except Exception as error:
    print("refused:", error, flush=True)
    sys.exit(3)
target.declare("checkpoints/checkpoint-*", ["rank-0/model.pt"])
directory = target.run_dir / "checkpoints" / "checkpoint-00001" / "rank-0"
directory.mkdir(parents=True)
(directory / "model.pt").write_bytes(os.urandom(int(sys.argv[2])))
print(target.run_dir, flush=True)
sys.stdin.readline()
target.cleanup()
"""


class ChildRun:
    """A ckptqual run holding a target in another process."""

    def __init__(self, target: Path, size_bytes: int = 4096) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", RUN_IN_CHILD, str(target), str(size_bytes)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        line = self.process.stdout.readline().strip()
        assert line.startswith("/"), f"the child run did not start: {line!r}"
        self.run_dir = Path(line)

    @property
    def pid(self) -> int:
        return self.process.pid

    def finish(self) -> None:
        """Lets the run clean up and exit."""
        self.process.communicate("\n", timeout=60)
        assert self.process.returncode == 0

    def kill(self) -> None:
        """SIGKILL: the run leaves everything behind."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=60)
        assert self.process.returncode == -signal.SIGKILL


@pytest.fixture
def child_runs() -> Iterator[list[ChildRun]]:
    """Starts child runs on demand; kills any still running at the end."""
    runs: list[ChildRun] = []
    yield runs
    for run in runs:
        if run.process.poll() is None:
            run.kill()


def start_child(runs: list[ChildRun], target: Path, size_bytes: int = 4096) -> ChildRun:
    runs.append(ChildRun(target, size_bytes))
    return runs[-1]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tree(root: Path) -> dict[str, str]:
    """Every path under root with the digest of each file: a snapshot to compare before and after."""
    return {
        str(path.relative_to(root)): digest(path) if path.is_file() and not path.is_symlink() else "dir"
        for path in sorted(root.rglob("*"))
    }


def write(path: Path, size_bytes: int = 4096) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(size_bytes))
    return path


def write_checkpoint(run_dir: Path, number: int) -> Path:
    directory = run_dir / "checkpoints" / f"checkpoint-{number:05d}"
    write(directory / "rank-0" / "model.pt")
    write(directory / "optim.pt")
    return directory


def test_an_empty_directory_is_marked_locked_used_and_left_empty(tmp_path):
    target = open_target(tmp_path, keep=False)
    assert (tmp_path / TARGET_MARKER).is_file() and (tmp_path / LOCK_FILE).is_file()
    assert (target.run_dir / RUN_MARKER).is_file() and target.run_dir.parent == tmp_path
    target.declare("checkpoints/checkpoint-*", ["rank-0/model.pt", "optim.pt"])
    write_checkpoint(target.run_dir, 1)
    removal = target.cleanup()
    assert removal is not None and removal.complete and target.removed
    assert list(tmp_path.iterdir()) == []


def test_the_manifest_records_who_wrote_what(tmp_path):
    target = open_target(tmp_path)
    target.declare("checkpoints/checkpoint-*", ["rank-0/model.pt"])
    target.declare("checkpoints/checkpoint-*", ["optim.pt", "rank-0/model.pt"])
    target.declare("layouts/layout-*", [], listed=True)
    manifest = json.loads((target.run_dir / RUN_MARKER).read_text())
    assert manifest["format"] == "ckptqual-run-manifest" and manifest["version"] == 1
    assert manifest["pid"] == os.getpid() and manifest["host"] == socket.gethostname()
    assert manifest["groups"] == [
        {"pattern": "checkpoints/checkpoint-*", "files": ["rank-0/model.pt", "optim.pt"], "listed": False},
        {"pattern": "layouts/layout-*", "files": [], "listed": True},
    ]
    lock = json.loads((tmp_path / LOCK_FILE).read_text())
    assert (lock["pid"], lock["run_dir"]) == (os.getpid(), target.run_dir.name)
    target.cleanup()


@pytest.mark.parametrize("bad", ["/etc/passwd", "../x", "a/../../x", "", f"{RUN_MARKER}"])
def test_declared_paths_must_stay_inside_the_run_directory(tmp_path, bad):
    target = open_target(tmp_path)
    with pytest.raises(TargetError, match=r"relative to the run directory|must name a file"):
        target.declare("raw", [bad])
    target.cleanup()


def test_a_temporary_target_is_created_and_removed_whole():
    target = open_target(None)
    assert target.path.is_dir()
    target.cleanup()
    assert not target.path.exists()


def test_keep_leaves_the_run_and_a_marked_target_is_accepted_again(tmp_path):
    first = open_target(tmp_path, keep=True)
    removal = first.cleanup()
    assert first.run_dir.is_dir() and not first.removed
    assert removal is not None and [entry.why for entry in removal.left] == ["kept with --keep"]
    assert check_target(tmp_path) == []
    second = open_target(tmp_path)
    second.cleanup()
    assert first.run_dir.is_dir() and (tmp_path / TARGET_MARKER).is_file()  # the marker predates this run
    assert [run.kept for run in leftover_runs(tmp_path)] == [True]


def test_lost_and_found_of_a_fresh_filesystem_is_tolerated_and_untouched(tmp_path):
    (tmp_path / "lost+found").mkdir()
    target = open_target(tmp_path)
    target.cleanup()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lost+found"]


def test_a_directory_with_foreign_files_is_refused_and_untouched(tmp_path):
    foreign = tmp_path / "precious.bin"
    foreign.write_bytes(os.urandom(4096))
    before = digest(foreign)
    with pytest.raises(TargetError, match=r"holds 1 entry ckptqual did not create \(precious.bin\)"):
        open_target(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["precious.bin"]
    assert digest(foreign) == before


def test_a_foreign_directory_named_like_a_run_is_foreign(tmp_path):
    (tmp_path / "ckptqual-run-20260101-000000-1").mkdir()
    assert "did not create" in check_target(tmp_path)[0]
    with pytest.raises(TargetError, match=r"holds 1 entry ckptqual did not create \(ckptqual-run-20260101-000000-1\)"):
        open_target(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["ckptqual-run-20260101-000000-1"]


def test_files_that_appear_beside_the_run_survive_its_cleanup(tmp_path):
    target = open_target(tmp_path)
    visitor = tmp_path / "visitor.txt"
    visitor.write_text("not ckptqual's")
    target.cleanup()
    assert visitor.read_text() == "not ckptqual's"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["visitor.txt"]


def test_foreign_files_inside_the_run_and_a_checkpoint_survive_cleanup_and_are_listed(tmp_path):
    target = open_target(tmp_path)
    target.declare("checkpoints/checkpoint-*", ["rank-0/model.pt", "optim.pt"])
    target.declare("raw", ["raw-000.bin"])
    write_checkpoint(target.run_dir, 1)
    second = write_checkpoint(target.run_dir, 2)
    write(target.run_dir / "raw" / "raw-000.bin")
    foreign = {
        "visitor.txt": write(target.run_dir / "visitor.txt"),
        "checkpoints/checkpoint-00002/notes.txt": write(second / "notes.txt"),
        "theirs": write(target.run_dir / "theirs" / "deep" / "data.bin").parents[1],
    }
    before = tree(target.run_dir / "theirs") | {name: digest(foreign[name]) for name in list(foreign)[:2]}
    removal = target.cleanup()
    assert removal is not None and not removal.complete and not target.removed
    assert {entry.path: entry.why for entry in removal.left} == {
        f"{target.run_dir.name}/{name}": NOT_OURS for name in foreign
    }
    assert before == tree(target.run_dir / "theirs") | {name: digest(foreign[name]) for name in list(foreign)[:2]}
    assert sorted(str(p.relative_to(target.run_dir)) for p in target.run_dir.rglob("*")) == [
        RUN_MARKER,  # kept while anything is left, so that `ckptqual clean` knows the directory as the run's
        "checkpoints",
        "checkpoints/checkpoint-00002",
        "checkpoints/checkpoint-00002/notes.txt",
        "theirs",
        "theirs/deep",
        "theirs/deep/data.bin",
        "visitor.txt",
    ]
    assert removal.removed_files == 5  # 2 checkpoints x 2 files, the raw file


def test_declared_names_are_taken_literally_not_as_globs(tmp_path):
    target = open_target(tmp_path)
    target.declare("raw", ["rank[0]/a.bin"])
    write(target.run_dir / "raw" / "rank[0]" / "a.bin")
    theirs = write(target.run_dir / "raw" / "rank0" / "a.bin")  # what the glob rank[0] would match
    removal = target.cleanup()
    assert removal is not None and [entry.path for entry in removal.left] == [f"{target.run_dir.name}/raw/rank0"]
    assert theirs.is_file() and not (target.run_dir / "raw" / "rank[0]").exists()


def test_files_of_the_run_directory_itself_are_declared_with_dot(tmp_path):
    target = open_target(tmp_path)
    target.declare(".", ["cufile.log"])
    write(target.run_dir / "cufile.log")
    write(target.run_dir / "cufile.log.1")
    removal = target.cleanup()
    assert removal is not None and [entry.path for entry in removal.left] == [f"{target.run_dir.name}/cufile.log.1"]
    assert sorted(p.name for p in target.run_dir.iterdir()) == [RUN_MARKER, "cufile.log.1"]


def test_only_one_checkpoint_is_removed_when_asked(tmp_path):
    target = open_target(tmp_path)
    target.declare("checkpoints/checkpoint-*", ["rank-0/model.pt", "optim.pt"])
    first, second = write_checkpoint(target.run_dir, 1), write_checkpoint(target.run_dir, 2)
    before = tree(second)
    removal = remove_owned(target.run_dir, only=first)
    assert removal.complete and removal.removed_files == 2 and removal.removed_bytes >= 2 * 4096
    assert not first.exists() and tree(second) == before and (target.run_dir / RUN_MARKER).is_file()
    target.cleanup()
    assert list(tmp_path.iterdir()) == []


def test_only_outside_the_run_directory_removes_nothing(tmp_path):
    target = open_target(tmp_path)
    outside = write(tmp_path.parent / f"{tmp_path.name}-outside" / "optim.pt")
    removal = remove_owned(target.run_dir, only=outside.parent)
    assert not removal.complete and "not inside the run directory" in removal.errors[0]
    assert outside.is_file()
    target.cleanup()


def test_listed_files_of_a_layout_are_removed_and_nothing_else(tmp_path):
    target = open_target(tmp_path)
    target.declare("layouts/layout-*", [], listed=True)
    layout = target.run_dir / "layouts" / "layout-000"
    layout.mkdir(parents=True)
    directory_fd = os.open(layout, os.O_RDONLY | os.O_DIRECTORY)
    write_file_list(directory_fd, layout, ["rank-0/a.pt", "b.pt"])
    os.close(directory_fd)
    write(layout / "rank-0" / "a.pt")
    write(layout / "b.pt")
    stray = write(layout / "c.pt")
    removal = target.cleanup()
    assert removal is not None
    assert [(entry.path, entry.why) for entry in removal.left] == [
        (f"{target.run_dir.name}/layouts/layout-000/c.pt", NOT_OURS)
    ]
    assert sorted(p.name for p in layout.iterdir()) == ["c.pt"] and stray.is_file()


def test_symlinks_in_the_run_directory_are_never_followed(tmp_path):
    target_dir, outside = tmp_path / "target", tmp_path / "outside"
    target_dir.mkdir()
    write_checkpoint(outside, 1)
    before = tree(outside)
    target = open_target(target_dir)
    target.declare("checkpoints/checkpoint-*", ["rank-0/model.pt", "optim.pt"])
    (target.run_dir / "checkpoints").symlink_to(outside / "checkpoints")
    removal = target.cleanup()
    assert tree(outside) == before
    assert removal is not None and [entry.path for entry in removal.left] == [f"{target.run_dir.name}/checkpoints"]


def test_an_unmarked_directory_is_never_emptied(tmp_path):
    directory = tmp_path / f"{RUN_PREFIX}20260101-000000-1"
    write_checkpoint(directory, 1)
    (directory / RUN_MARKER).write_text("an older ckptqual's marker, or anyone's file\n")
    before = tree(directory)
    removal = remove_owned(directory)
    assert not removal.complete and removal.removed_files == 0
    assert "nothing removed" in removal.errors[0]
    assert tree(directory) == before


def test_a_removal_error_is_one_line_and_never_claims_removed(tmp_path):
    target = open_target(tmp_path)
    target.declare("checkpoints/checkpoint-*", ["rank-0/model.pt", "optim.pt"])
    checkpoint = write_checkpoint(target.run_dir, 3)
    if subprocess.run(["chattr", "+i", str(checkpoint)], capture_output=True).returncode:
        pytest.skip("cannot make a directory immutable here (chattr needs root and ext4 or alike)")
    try:
        removal = target.cleanup()
    finally:
        subprocess.run(["chattr", "-i", str(checkpoint)], check=True)
    assert removal is not None and not removal.complete and not target.removed
    expected = f"unlink {checkpoint}/optim.pt: [Errno 1 EPERM] Operation not permitted"
    assert expected in removal.errors
    assert all("\n" not in error for error in removal.errors)
    assert (f"{target.run_dir.name}/checkpoints/checkpoint-00003/optim.pt", expected) in {
        (entry.path, entry.why) for entry in removal.left
    }
    assert (target.run_dir / RUN_MARKER).is_file()  # kept, so that `ckptqual clean` can finish later
    assert (tmp_path / TARGET_MARKER).is_file()
    assert remove_owned(target.run_dir).complete
    assert not target.run_dir.exists()


def test_removal_travels_between_processes(tmp_path):
    target = open_target(tmp_path)
    target.declare("checkpoints/checkpoint-*", ["rank-0/model.pt", "optim.pt"])
    first = write_checkpoint(target.run_dir, 1)
    write(first / "notes.txt")
    predicted = remove_owned(target.run_dir, only=first, dry_run=True)
    assert pickle.loads(pickle.dumps(predicted)) == predicted
    result = subprocess.run(
        [sys.executable, "-m", "ckptqual.host.target", "remove", str(target.run_dir), "--only", str(first)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1, result.stderr
    removal = json.loads(result.stdout)
    assert removal == {**predicted.to_dict(), "dry_run": False}  # the dry run foretold it exactly
    assert removal["removed_files"] == 2 and not removal["complete"]
    assert [entry["path"] for entry in removal["left"]] == [
        f"{target.run_dir.name}/{first.relative_to(target.run_dir)}/notes.txt"
    ]
    target.cleanup()


class HelperProcessOps:
    """Runs each change to the target in a helper process, as the qualification run does with its deadline."""

    def __init__(self) -> None:
        self.pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        self.calls: list[str] = []

    def call(self, what: str, function: Callable[..., Any], *args: Any) -> Any:
        self.calls.append(what)
        return self.pool.submit(function, *args).result(timeout=120)


class UnresponsiveOps:
    """A runner whose deadline always passes."""

    def call(self, what: str, function: Callable[..., Any], *args: Any) -> Any:
        raise TimeoutError(f"{what}: no answer within the deadline")


def test_cleanup_can_run_every_change_in_a_helper_process(tmp_path):
    target = open_target(tmp_path)
    target.declare("checkpoints/checkpoint-*", ["rank-0/model.pt", "optim.pt"])
    write_checkpoint(target.run_dir, 1)
    visitor = write(target.run_dir / "visitor.txt")
    ops = HelperProcessOps()
    try:
        removal = target.cleanup(ops)
    finally:
        ops.pool.shutdown()
    assert removal is not None and [entry.path for entry in removal.left] == [f"{target.run_dir.name}/visitor.txt"]
    assert removal.removed_files == 2 and not removal.errors and visitor.is_file()
    assert [call.split(" ")[0] for call in ops.calls] == ["removing", "removing", "releasing"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [TARGET_MARKER, target.run_dir.name]


def test_a_cleanup_that_misses_its_deadline_still_drops_the_lock(tmp_path):
    target = open_target(tmp_path)
    target.declare("raw", ["raw-000.bin"])
    write(target.run_dir / "raw" / "raw-000.bin")
    with pytest.raises(TimeoutError):
        target.cleanup(UnresponsiveOps())
    assert not target.removed and (target.run_dir / "raw" / "raw-000.bin").is_file()
    assert check_target(tmp_path) == []  # the lock file left behind is stale
    assert [run.path for run in leftover_runs(tmp_path)] == [target.run_dir]
    open_target(tmp_path).cleanup()


def test_abandon_drops_the_lock_and_touches_nothing(tmp_path):
    target = open_target(tmp_path)
    target.declare("raw", ["raw-000.bin"])
    write(target.run_dir / "raw" / "raw-000.bin")
    before = tree(tmp_path)
    target.abandon()
    assert tree(tmp_path) == before and target.removal is None and not target.removed
    assert check_target(tmp_path) == []
    assert [run.path for run in leftover_runs(tmp_path)] == [target.run_dir]
    assert target.cleanup() is None  # abandoned: nothing more is done


def test_a_second_run_in_another_process_is_refused_naming_pid_and_host(tmp_path, child_runs):
    child = start_child(child_runs, tmp_path)
    expected = (
        rf"target {tmp_path} is in use by another ckptqual run \(PID {child.pid} on host {socket.gethostname()}, "
        rf"since [0-9-]+ [0-9:]+, run directory {child.run_dir.name}\); wait for it to finish, or stop it"
    )
    with pytest.raises(TargetError, match=f"^{expected}$"):
        open_target(tmp_path)
    problems = check_target(tmp_path)
    assert len(problems) == 1 and problems[0].startswith(f"target {tmp_path} is in use by another ckptqual run")
    assert leftover_runs(tmp_path) == []  # a live run's directory is no leftover
    child.finish()
    assert list(tmp_path.iterdir()) == []
    open_target(tmp_path).cleanup()


def test_a_second_run_in_the_same_process_is_refused(tmp_path):
    first = open_target(tmp_path)
    with pytest.raises(TargetError, match=rf"in use by another ckptqual run \(PID {os.getpid()} on host"):
        open_target(tmp_path)
    assert "in use" in check_target(tmp_path)[0]
    first.cleanup()
    open_target(tmp_path).cleanup()
    assert list(tmp_path.iterdir()) == []


def test_the_lock_of_a_killed_run_is_taken_over(tmp_path, child_runs):
    child = start_child(child_runs, tmp_path)
    child.kill()
    assert check_target(tmp_path) == []
    target = open_target(tmp_path)
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    target.cleanup()
    assert not (tmp_path / LOCK_FILE).exists() and child.run_dir.is_dir()  # the dead run's files are `clean`'s


EXCLUSIVE_LOOP = r"""
import os, sys
from pathlib import Path
from ckptqual.host.target import TargetError, open_target
target_dir, sentinel, rounds = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
held = 0
while held < rounds:
    try:
        target = open_target(target_dir)
    except TargetError as error:
        assert "in use by another ckptqual run" in str(error), error
        continue
    os.close(os.open(sentinel, os.O_CREAT | os.O_EXCL))  # FileExistsError: two holders at once
    os.unlink(sentinel)
    target.cleanup()
    held += 1
"""


def test_two_processes_never_hold_a_target_at_once(tmpfs, tmp_path):
    point = tmpfs("size=16m")
    sentinel = tmp_path / "held"
    loops = [
        subprocess.Popen([sys.executable, "-c", EXCLUSIVE_LOOP, str(point), str(sentinel), "400"]) for _ in range(3)
    ]
    codes = [loop.wait(timeout=300) for loop in loops]
    assert codes == [0, 0, 0]
    assert list(point.iterdir()) == []


def nested_refusal(target: Path, relation: str, other: Path, pid: int) -> str:
    """The refusal of `target` while PID `pid` runs on `other`, as a regular expression."""
    target_text, other_text = re.escape(str(target)), re.escape(str(other))
    return (
        rf"^target {target_text} {relation} target {other_text}, which another ckptqual run is using "
        rf"\(PID {pid} on host {socket.gethostname()}, since .*\); runs on nested directories would measure each "
        r"other: wait for it to finish, or give a directory outside it$"
    )


def test_a_target_inside_a_held_target_is_refused_before_anything_is_written(tmp_path, child_runs):
    inner = tmp_path / "lost+found"  # tolerated in a target: an empty directory anyone may point a run at
    inner.mkdir()
    child = start_child(child_runs, tmp_path)
    expected = nested_refusal(inner, "is inside", tmp_path, child.pid)
    assert re.match(expected, check_target(inner)[0])
    with pytest.raises(TargetError, match=expected):
        open_target(inner)
    assert list(inner.iterdir()) == []
    child.finish()
    open_target(inner).cleanup()


def test_a_target_that_holds_a_held_target_is_refused_before_anything_is_written(tmp_path, child_runs):
    inner = tmp_path / "lost+found"
    inner.mkdir()
    child = start_child(child_runs, inner)
    expected = nested_refusal(tmp_path, "holds", inner, child.pid)
    before = tree(tmp_path)
    assert re.match(expected, check_target(tmp_path)[0])
    with pytest.raises(TargetError, match=expected):
        open_target(tmp_path)
    assert tree(tmp_path) == before
    child.finish()
    open_target(tmp_path).cleanup()


# A run that starts when a line arrives on stdin, says whether it holds its target, and holds it until the next line.
START_ON_CUE = r"""
import sys
from pathlib import Path
from ckptqual.host.target import TargetError, open_target
sys.stdin.readline()
try:
    target = open_target(Path(sys.argv[1]))
except TargetError as error:
    print("refused:", error, flush=True)
    sys.exit(0)
print("held", flush=True)
sys.stdin.readline()
target.cleanup()
"""


def test_runs_starting_at_once_on_nested_targets_never_run_together(loop_ext4):
    point = loop_ext4("64M")
    for _ in range(5):
        starts = [
            subprocess.Popen(
                [sys.executable, "-c", START_ON_CUE, str(target)],
                stdin=subprocess.PIPE,
                text=True,
                stdout=subprocess.PIPE,
            )
            for target in (point, point / "lost+found")  # a fresh ext4's own lost+found, tolerated in its root
        ]
        for start in starts:  # both started, both importing: the cue reaches them within a moment
            start.stdin.write("\n")
            start.stdin.flush()
        said = [start.stdout.readline().strip() for start in starts]
        assert said.count("held") <= 1, said
        assert all(line == "held" or "which another ckptqual run is using" in line for line in said), said
        for start in starts:
            start.communicate("\n", timeout=60)
    assert [entry.name for entry in point.iterdir()] == ["lost+found"]
    assert list((point / "lost+found").iterdir()) == []


@pytest.mark.parametrize("name", [LOCK_FILE, TARGET_MARKER])
def test_a_lock_file_or_marker_planted_as_a_symlink_is_refused_and_its_victim_untouched(tmp_path, name):
    victim = tmp_path / "victim.txt"
    victim.write_text("someone else's data")
    target = tmp_path / "target"
    target.mkdir()
    (target / name).symlink_to(victim)
    expected = (
        f"target {target} holds 1 entry ckptqual did not create ({name} -> {victim}); give an empty directory "
        "(nothing will be deleted here)"
    )
    assert check_target(target) == [expected]
    with pytest.raises(TargetError, match=f"^{re.escape(expected)}$"):
        open_target(target)
    assert victim.read_text() == "someone else's data" and (target / name).readlink() == victim
    assert [entry.name for entry in target.iterdir()] == [name]


def test_a_lock_file_planted_as_a_fifo_is_refused_without_waiting_on_it(tmp_path):
    os.mkfifo(tmp_path / LOCK_FILE)
    assert check_target(tmp_path) == [
        f"target {tmp_path} holds 1 entry ckptqual did not create ({LOCK_FILE}); give an empty directory "
        "(nothing will be deleted here)"
    ]
    with pytest.raises(TargetError, match="ckptqual did not create"):
        open_target(tmp_path)


@pytest.mark.parametrize(
    ("inodes", "failing"),
    [(1, LOCK_FILE), (2, TARGET_MARKER), (3, RUN_PREFIX), (4, RUN_MARKER)],
)
def test_inode_exhaustion_leaves_nothing_and_says_so_in_one_line(tmpfs, inodes, failing):
    point = tmpfs(f"size=16m,nr_inodes={inodes}")  # the root takes one inode
    with pytest.raises(RunError) as raised:  # the drive's fault, as when the manifest's rewrite fails: one line
        open_target(point)
    assert raised.value.fault == "out-of-space" and raised.value.target_at_fault
    message = str(raised.value)
    assert message.startswith("create ") and failing in message.split(":")[0]
    assert "[Errno 28 ENOSPC] No space left on device" in message and "df -i" in message
    assert "\n" not in message
    assert list(point.iterdir()) == []


def test_a_manifest_that_cannot_be_rewritten_says_why(tmpfs):
    point = tmpfs("size=16m,nr_inodes=5")  # lock, marker, run dir, manifest: no inode left for its rewrite
    target = open_target(point)
    with pytest.raises(
        RunError, match=r"^write .*\.ckptqual-run: \[Errno 28 ENOSPC\] No space left on device; .*df -i"
    ) as raised:
        target.declare("raw", ["raw-000.bin"])
    assert raised.value.fault == "out-of-space" and raised.value.target_at_fault  # the drive's fault: one line
    assert sorted(p.name for p in target.run_dir.iterdir()) == [RUN_MARKER]
    target.cleanup()
    assert list(point.iterdir()) == []


@pytest.mark.parametrize("path", ["/", "/etc", "/tmp", "/usr", "/var/tmp"])
def test_system_directories_are_refused(path):
    assert "is a system directory" in check_target(Path(path))[0]


def test_missing_paths_and_files_are_refused(tmp_path):
    assert "does not exist" in check_target(tmp_path / "nope")[0]
    file = tmp_path / "file"
    file.write_text("x")
    assert "is not a directory" in check_target(file)[0]


def test_a_read_only_filesystem_is_named_as_such(tmpfs):
    point = tmpfs("ro,size=1m")
    assert check_target(point) == [
        f"target {point} is on a read-only filesystem (mounted at {point}); remount it read-write"
    ]


def test_leftovers_of_a_killed_run_are_named_with_their_size(tmp_path, child_runs):
    child = start_child(child_runs, tmp_path, size_bytes=3_000_000)
    child.kill()
    (leftover,) = leftover_runs(tmp_path)
    assert leftover.path == child.run_dir and (leftover.pid, leftover.host) == (child.pid, socket.gethostname())
    assert 3_000_000 <= leftover.size_bytes < 3_200_000 and 0 <= leftover.age_s < 600 and not leftover.kept
    line = describe_leftovers(tmp_path)
    assert line is not None and line.startswith(
        f"the target holds {leftover.size_bytes / 1e6:.2f} MB left by 1 earlier run that did not finish "
        f"({child.run_dir.name}, {leftover.size_bytes / 1e6:.2f} MB, "
    )
    assert line.endswith(f" old); remove it with: ckptqual clean {tmp_path}")
    assert check_target(tmp_path) == []  # leftovers are ckptqual's: the target stays usable


def test_no_leftovers_no_line(tmp_path):
    assert describe_leftovers(tmp_path) is None
    target = open_target(tmp_path)
    assert leftover_runs(tmp_path) == [] and describe_leftovers(tmp_path) is None  # this live run is no leftover
    target.cleanup()


def test_a_half_written_file_list_is_ckptquals_too(tmp_path):
    target = open_target(tmp_path)
    target.declare("layouts/layout-*", ["x.pt"], listed=True)
    layout = target.run_dir / "layouts" / "layout-001"
    write(layout / "x.pt")
    write(layout / f"{FILE_LIST}.tmp-12345")  # a list being written when the run died
    removal = target.cleanup()
    assert removal is not None and removal.complete, removal
    assert list(tmp_path.iterdir()) == []


def test_identity_names_the_filesystem_and_mount_options(tmp_path):
    identity = identify(tmp_path)
    assert identity.filesystem != "unknown"
    assert identity.mount_point != "unknown" and str(tmp_path).startswith(identity.mount_point)
