"""A target held by one run cannot be shared through a bind mount: of the held target, of a directory inside it, or
of a directory above it, another run is refused as in use; the guard finds the target by its filesystem, not by its
path. Real `mount --bind` (root), the holder a separate process holding the lock through the lock API."""

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ckptqual.host.aliases import aliases
from ckptqual.host.guard import TargetError
from ckptqual.host.lock import acquire, holder_record
from ckptqual.host.target import check_target

HOLD = (
    "import sys; from pathlib import Path; from ckptqual.host.lock import acquire, holder_record;"
    "lock = acquire(Path(sys.argv[1]), holder_record('held-by-test', 'test')); print('held', flush=True);"
    "sys.stdin.read(); lock.release()"
)


@pytest.fixture
def bind(tmp_path) -> Iterator[Callable[[Path], Path]]:
    """Bind-mounts a directory at a fresh mount point in the test's directory; skips without root."""
    points: list[Path] = []

    def mount(source: Path) -> Path:
        point = tmp_path / f"bind-{len(points)}"
        point.mkdir()
        if subprocess.run(["mount", "--bind", str(source), str(point)], capture_output=True).returncode:
            pytest.skip("cannot bind-mount here (needs root and mount)")
        points.append(point)
        return point

    yield mount
    for point in reversed(points):
        subprocess.run(["umount", str(point)], check=True)


@pytest.fixture
def held(tmp_path) -> Iterator[Path]:
    """A target held by another process (its lock taken through the lock API) until the test ends."""
    target = tmp_path / "x" / "t"
    (target / "sub" / "deeper").mkdir(parents=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(target)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        yield target
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)


def refused_as_in_use(path: Path) -> None:
    """Both the settings' check and taking the lock refuse `path`, naming the holder."""
    problems = check_target(path)
    assert problems and "another ckptqual run" in problems[0] and "held-by-test" in problems[0], problems
    with pytest.raises(TargetError, match=r"(in use by|which) another ckptqual run.*held-by-test"):
        acquire(path, holder_record(None, "second run")).release()


@pytest.mark.parametrize("inside", ["sub", "sub/deeper"])
def test_a_bind_mount_of_a_directory_inside_a_held_target_is_refused_as_in_use(held, bind, inside):
    point = bind(held / inside)
    assert aliases(point) == [(held / inside).resolve()]
    refused_as_in_use(point)


def test_a_bind_mount_of_the_held_target_is_refused_as_in_use(held, bind):
    refused_as_in_use(bind(held))


def test_a_bind_mount_of_a_directory_above_a_held_target_is_refused_as_in_use(held, bind):
    above = bind(held.parent)
    (held.parent / "other").mkdir()  # an empty directory beside the held target, seen through the mount: free
    assert check_target(above / "other") == []
    refused_as_in_use(above)


def test_a_bind_mount_of_a_free_directory_is_not_refused(tmp_path, bind):
    free = tmp_path / "free"
    free.mkdir()
    point = bind(free)
    assert aliases(point) == [free.resolve()]
    assert check_target(point) == []
    acquire(point, holder_record(None, "alone")).release()
