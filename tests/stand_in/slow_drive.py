"""Tests only: a stand-in drive slow enough that the host is never the limit of a small run.

ext4 on a loop device whose image lies in a tmpfs of its own, its reads and writes held by cgroup v1 blkio to a few
MB/s. The ranks then spend most of a checkpoint blocked on the throttled device, not waiting for a CPU, so a busy
host does not make a figure host-bound (limits/host_bound.py). No other process's I/O reaches the image, and a
backing file in memory has no device whose bytes could be counted, so no figure can be INVALID for another's I/O
either (limits/cache_served.py): the verdict's basis says the device bytes were not counted. The figures follow the
throttle, not the host.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

BLKIO = Path("/sys/fs/cgroup/blkio")
WRITE_BPS = 10_000_000
READ_BPS = 20_000_000
SIZE_MB = 160


class SlowDriveUnavailable(RuntimeError):
    """This machine cannot make the stand-in drive (no cgroup v1 blkio, no loop devices, no root); says which."""


def _run(*command: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(command, capture_output=True, text=True)
    except FileNotFoundError as error:  # mount, mkfs.ext4 or findmnt is not installed
        raise SlowDriveUnavailable(f"{command[0]} is not installed here: {error}") from None


def _throttle(device: str, write_bps: int, read_bps: int) -> None:
    (BLKIO / "blkio.throttle.write_bps_device").write_text(f"{device} {write_bps}\n")
    (BLKIO / "blkio.throttle.read_bps_device").write_text(f"{device} {read_bps}\n")


@contextmanager
def slow_drive(
    where: Path, write_bps: int = WRITE_BPS, read_bps: int = READ_BPS, size_mb: int = SIZE_MB
) -> Iterator[Path]:
    """Mounts the stand-in drive of `size_mb` (in as much memory) under the new directory `where` and yields its
    mount point; unthrottles and unmounts everything at the end. Raises SlowDriveUnavailable, naming what is
    missing, where it cannot."""
    if not (BLKIO / "blkio.throttle.write_bps_device").exists():
        raise SlowDriveUnavailable(f"cgroup v1 blkio is missing here ({BLKIO}): a drive cannot be throttled")
    memory, point = where / "memory", where / "drive"
    memory.mkdir(parents=True)
    point.mkdir()
    with ExitStack() as undo:
        mounted = _run("mount", "-t", "tmpfs", "-o", f"size={size_mb + 8}m", "tmpfs", str(memory))
        if mounted.returncode:
            raise SlowDriveUnavailable(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip()}")
        undo.callback(_run, "umount", "-l", str(memory))
        image = memory / "ext4.img"
        _run("truncate", "-s", f"{size_mb}M", str(image))
        made = _run("mkfs.ext4", "-q", "-F", str(image))
        if made.returncode:
            raise SlowDriveUnavailable(f"mkfs.ext4 failed here: {made.stderr.strip()}")
        looped = _run("mount", "-o", "loop", str(image), str(point))
        if looped.returncode:
            raise SlowDriveUnavailable(f"cannot loop-mount an ext4 image here (needs loop devices): {looped.stderr}")
        undo.callback(_run, "umount", str(point))
        device = device_of(point)
        try:
            _throttle(device, write_bps, read_bps)
        except OSError as error:
            raise SlowDriveUnavailable(f"cannot throttle the loop device {device} here ({BLKIO}): {error}") from None
        undo.callback(_throttle, device, 0, 0)
        yield point


def device_of(point: Path) -> str:
    """The MAJ:MIN numbers of the block device mounted at `point`."""
    return _run("findmnt", "-n", "-o", "MAJ:MIN", str(point)).stdout.strip()


@dataclass
class ThrottledDrive:
    """A stand-in drive made by `throttled_target`: its mount point and the rates blkio holds it to."""

    point: Path
    write_bps: int
    read_bps: int

    def throttle(self, write_bps: int, read_bps: int) -> None:
        """Holds the drive to new rates from now on (lifted with the drive at the end)."""
        _throttle(device_of(self.point), write_bps, read_bps)
        self.write_bps, self.read_bps = write_bps, read_bps


def throttled_target(
    write_bps: int = WRITE_BPS, read_bps: int = READ_BPS, size_mb: int = SIZE_MB, drives: int = 1
) -> Callable[..., Iterator]:
    """The pytest fixture `throttled_target` of a test module (`throttled_target = slow_drive.throttled_target(...)`):
    a ThrottledDrive at these rates, or a list of `drives` of them (each its own device and throttle); skips, naming
    what is missing, where this machine cannot make one."""

    @pytest.fixture(name="throttled_target")
    def fixture(tmp_path: Path) -> Iterator[ThrottledDrive | list[ThrottledDrive]]:
        try:
            with ExitStack() as made:
                points = [
                    made.enter_context(slow_drive(tmp_path / f"slow-{n}", write_bps, read_bps, size_mb))
                    for n in range(drives)
                ]
                made_drives = [ThrottledDrive(point, write_bps, read_bps) for point in points]
                yield made_drives[0] if drives == 1 else made_drives
        except SlowDriveUnavailable as error:
            pytest.skip(str(error))

    return fixture
