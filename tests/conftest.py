"""Shared fixtures of the project's tests."""

import functools
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stand_in.slow_drive import SlowDriveUnavailable, slow_drive
from suite_runs import BOTH, PAIR, SharedRun, lenient_drive, load_once, run_suite, run_suite_in_process, shared_run

# The modules whose tests are real runs of half a minute or more on a loaded 2-core host, longest first. They are
# run first, so that under -n auto the suite ends on many short tests that an idle worker can take over from a busy
# one (pytest_xdist_make_scheduler), not on one long run on one worker while the others wait.
LONG_FIRST = (
    "test_multi_node",
    "test_multi_drive",
    "test_early_stop",
    "test_trust",
    "test_layouts_stop",
    "test_signals",
    "test_faults",
    "test_qualification_run",
    "test_host_waits",
    "test_shared_disk",
    "test_mlperf",
    "test_cpu_honesty",
)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist's work stealing where no --dist was chosen: a worker that has run its share takes tests not yet
    started from a busy one.
    xdist's default `load` never moves a test once handed out, and its first hand-out alone split these tests 760 s
    to 520 s between two workers."""
    if config.getoption("dist") != "load":  # xdist's default under -n; another --dist given is kept
        return None
    from xdist.scheduler import WorkStealingScheduling  # the controller's only: workers never ask for a scheduler

    return WorkStealingScheduling(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Runs the modules of LONG_FIRST first, in its order; every other test keeps its place after them."""
    rank = {name: position for position, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(LONG_FIRST)))


@pytest.fixture
def tmpfs(tmp_path) -> Iterator[Callable[[str], Path]]:
    """Mounts a tmpfs with the given options (e.g. "size=64m", "ro,size=1m") inside the test's temporary
    directory: a real small or read-only filesystem. Skips where mounting needs a root this machine lacks."""
    mounted: list[Path] = []

    def mount(options: str) -> Path:
        point = tmp_path / f"tmpfs-{len(mounted)}"
        point.mkdir()
        if shutil.which("mount") is None:
            pytest.skip("cannot mount a tmpfs here: mount is not on PATH (apt-get install mount)")
        if subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)]).returncode:
            pytest.skip(f"cannot mount a tmpfs ({options}) here (needs root)")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], check=True)


@pytest.fixture
def loop_ext4(tmp_path) -> Iterator[Callable[[str], Path]]:
    """Makes and mounts a real ext4 filesystem of the given size (e.g. "256M"; mount options e.g.
    "errors=remount-ro") on a loop device inside the test's temporary directory, for faults only a block-backed
    filesystem shows (freeze, going read-only on an error). Skips where this machine cannot (needs root and loop
    devices); always thaws and unmounts."""
    mounted: list[Path] = []

    def make(size: str, options: str = "", mkfs: tuple[str, ...] = ()) -> Path:
        """`mkfs`: more options of mkfs.ext4, e.g. ("-N", "64") for few inodes."""
        image = tmp_path / f"ext4-{len(mounted)}.img"
        point = tmp_path / f"ext4-{len(mounted)}"
        point.mkdir()
        subprocess.run(["truncate", "-s", size, str(image)], check=True)
        mount = ["mount", "-o", ",".join(["loop", *filter(None, [options])]), str(image), str(point)]
        try:
            made = subprocess.run(["mkfs.ext4", "-q", "-F", *mkfs, str(image)], capture_output=True)
            mounted_now = not made.returncode and not subprocess.run(mount).returncode
        except FileNotFoundError:  # mkfs.ext4 (e2fsprogs) or mount is not on PATH
            mounted_now = False
        if not mounted_now:
            pytest.skip("cannot make and loop-mount an ext4 filesystem here (needs root, mkfs.ext4, loop devices)")
        mounted.append(point)
        return point

    yield make
    for point in mounted:
        subprocess.run(["fsfreeze", "-u", str(point)], capture_output=True)
        subprocess.run(["umount", "-l", str(point)], check=True)


@pytest.fixture
def checkpoint_space(tmp_path) -> Iterator[Callable[..., tuple]]:
    """A real run space for writing checkpoints of a plan: a locked target (a new directory, or `where`), its run
    directory with the plan's files declared, and the helper that removes them. Returns (space, checkpoints root);
    the space is closed (everything removed) at the end."""
    from ckptqual.host.space import RunSpace
    from ckptqual.host.target import open_target

    spaces: list[RunSpace] = []

    def make(plan, where: Path | None = None) -> tuple:
        target = where if where is not None else tmp_path / f"target-{len(spaces)}"
        target.mkdir(exist_ok=True)
        space = RunSpace(open_target(target), timeout_s=120)
        space.declare("checkpoints/checkpoint-*", [spec.path for rank in plan.ranks for spec in rank.files])
        spaces.append(space)
        return space, space.run_dir / "checkpoints"

    yield make
    for space in spaces:
        space.close()


@pytest.fixture
def slow_target(tmp_path) -> Iterator[Path]:
    """An empty target on the slow stand-in drive (stand_in/slow_drive.py), where the host is never the limit of a
    small run; skips, naming what is missing, where this machine cannot make the drive."""
    try:
        with slow_drive(tmp_path / "slow") as point:
            (point / "target").mkdir()
            yield point / "target"
    except SlowDriveUnavailable as error:
        pytest.skip(str(error))


def run_qualified(out: Path) -> SharedRun:
    """A small run of the fill and the restore (PAIR) under a lenient drive file, on the slow stand-in drive, with
    every report a user can ask for: the JUnit XML, the results JSON and pytest-benchmark's saved run."""
    drive = lenient_drive(out / "lenient.toml", "lenient drive")
    try:
        with slow_drive(out / "slow") as point:
            target = point / "target"
            target.mkdir()
            reports = ["--junitxml", str(out / "qual.xml"), "--results", str(out / "results.json")]
            benchmarks = ["--benchmark-autosave", "--benchmark-storage", str(out / "benchmarks")]
            done = run_suite(
                *PAIR, "--drive", str(drive), "--target", str(target), *reports, *benchmarks, "--restore-checkpoints",
                "2", tests=BOTH,
            )  # fmt: skip
            left = tuple(sorted(entry.name for entry in target.iterdir()))
    except SlowDriveUnavailable as error:
        pytest.skip(str(error))
    return SharedRun(done.returncode, done.stdout, done.stderr, out, left)


@pytest.fixture(scope="session")
def qualified_run(tmp_path_factory) -> SharedRun:
    """One qualified small run (`run_qualified`), run once in a test session and read by every test that only reads
    what it left."""
    return shared_run(tmp_path_factory, "qualified", run_qualified)


@pytest.fixture
def suite_in_process(request) -> Callable[..., pytest.RunResult]:
    """suite_runs.run_suite_in_process with this test's pytester, made once what cannot be imported twice in one
    process is loaded (the test module needs `pytest_plugins = ("pytester",)`)."""
    load_once()
    return functools.partial(run_suite_in_process, request.getfixturevalue("pytester"))
