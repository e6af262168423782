"""The drive under test: the safety guard, the run directory, free space, and the drive's identity.

The suite writes only inside a run directory of its own under the target and removes only what it
created. A target must be empty or marked by ckptqual before; anything else is refused untouched.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

TARGET_MARKER = ".ckptqual-target"
RUN_MARKER = ".ckptqual-run"
RUN_PREFIX = "ckptqual-run-"
_TOLERATED = {"lost+found"}  # a fresh filesystem's root holds it; never touched
_SYSTEM_DIRS = {
    "/",
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/home",
    "/lib",
    "/lib32",
    "/lib64",
    "/media",
    "/mnt",
    "/opt",
    "/proc",
    "/root",
    "/run",
    "/sbin",
    "/srv",
    "/sys",
    "/tmp",
    "/usr",
    "/var",
    "/var/tmp",
}


class TargetError(ValueError):
    """The target cannot be used; nothing was written."""


@dataclass
class Target:
    """A validated target directory and the run directory the suite owns inside it."""

    path: Path
    run_dir: Path
    created_target: bool
    created_marker: bool
    keep: bool = False
    removed: bool = field(default=False, init=False)

    def free_bytes(self) -> int:
        return shutil.disk_usage(self.path).free

    def capacity_bytes(self) -> int:
        return shutil.disk_usage(self.path).total

    def cleanup(self) -> None:
        """Removes what this run created (run directory, marker, a temporary target) unless kept."""
        if self.keep or self.removed:
            return
        _remove_owned_tree(self.run_dir)
        if self.created_marker:
            (self.path / TARGET_MARKER).unlink(missing_ok=True)
        if self.created_target:
            self.path.rmdir()
        self.removed = True


def _remove_owned_tree(run_dir: Path) -> None:
    """Deletes a run directory, but only one that carries the run marker."""
    if (run_dir / RUN_MARKER).is_file():
        shutil.rmtree(run_dir)


def check_target(path: Path) -> list[str]:
    """Why `path` cannot be a target (empty list: it can). Reads only."""
    if not path.exists():
        return [f"target {path} does not exist; create and mount it first"]
    if not path.is_dir():
        return [f"target {path} is not a directory"]
    real = path.resolve()
    if str(real) in _SYSTEM_DIRS:
        return [f"target {real} is a system directory; mount the drive under test and point --target at it"]
    if not os.access(real, os.W_OK | os.X_OK):
        return [f"target {real} is not writable by this user"]
    foreign = sorted(
        entry.name
        for entry in real.iterdir()
        if entry.name not in _TOLERATED and entry.name != TARGET_MARKER and not _is_run_dir(entry)
    )
    if foreign:
        shown = ", ".join(foreign[:5]) + (" ..." if len(foreign) > 5 else "")
        return [
            f"target {real} holds {len(foreign)} entr{'y' if len(foreign) == 1 else 'ies'} ckptqual did not "
            f"create ({shown}); give an empty directory (nothing will be deleted here)"
        ]
    return []


def _is_run_dir(entry: Path) -> bool:
    return entry.name.startswith(RUN_PREFIX) and entry.is_dir() and (entry / RUN_MARKER).is_file()


def open_target(path: Path | None, keep: bool = False) -> Target:
    """Validates the target (or makes a temporary one) and creates this run's own directory in it."""
    created_target = path is None
    if path is None:
        path = Path(tempfile.mkdtemp(prefix="ckptqual-target-"))
    problems = check_target(path)
    if problems:
        raise TargetError(problems[0])
    path = path.resolve()
    marker = path / TARGET_MARKER
    created_marker = not marker.exists()
    if created_marker:
        marker.write_text("This directory is a ckptqual target; ckptqual removes only what it creates here.\n")
    run_dir = Path(tempfile.mkdtemp(prefix=f"{RUN_PREFIX}{time.strftime('%Y%m%d-%H%M%S')}-", dir=path))
    (run_dir / RUN_MARKER).write_text("Created by ckptqual; removed at the end of the run unless --keep.\n")
    return Target(path, run_dir, created_target, created_marker, keep)


@dataclass(frozen=True)
class DriveIdentity:
    """What the system says of the device and filesystem behind a path."""

    device: str = "unknown"
    model: str = "unknown"
    serial: str = "unknown"
    firmware: str = "unknown"
    filesystem: str = "unknown"
    mount_point: str = "unknown"
    mount_options: str = "unknown"
    discard: bool | None = None

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def identify(path: Path) -> DriveIdentity:
    """Model, serial, firmware from sysfs and the mount from /proc/self/mountinfo (unknown where absent)."""
    mount = _mount_of(path)
    block = _block_device(path)
    if block is None:
        return DriveIdentity(**mount)
    device_dir = block / "device"
    return DriveIdentity(
        device=block.name,
        model=_read(device_dir / "model"),
        serial=_read(device_dir / "serial"),
        firmware=_read(device_dir / "firmware_rev")
        if (device_dir / "firmware_rev").exists()
        else _read(device_dir / "rev"),
        discard=_read(block / "queue" / "discard_max_bytes") not in ("0", "unknown"),
        **mount,
    )


def _read(path: Path) -> str:
    try:
        return path.read_text().strip() or "unknown"
    except OSError:
        return "unknown"


def _block_device(path: Path) -> Path | None:
    dev = os.stat(path).st_dev
    sys_path = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    if not sys_path.exists():
        return None
    block = sys_path.resolve()
    return block.parent if (block / "partition").exists() else block


def _mount_of(path: Path) -> dict[str, str]:
    best: dict[str, str] = {}
    real = str(path.resolve())
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return best
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        point = fields[4].replace("\\040", " ")
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best.get("mount_point", "")):
            options = ",".join(part for part in (fields[5], tail[2] if len(tail) > 2 else "") if part)
            best = {"mount_point": point, "filesystem": tail[0], "mount_options": options}
    return best
