"""What the system says of the drive and the filesystem behind a path: sysfs for the device, mountinfo for the mount."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class DriveIdentity:
    """The device and filesystem behind a path ("unknown" where the system does not say)."""

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
    """Model, serial and firmware from sysfs, the mount from /proc/self/mountinfo."""
    mount = mount_of(path)
    block = _block_device(path)
    if block is None:
        return DriveIdentity(**mount)
    device = block / "device"
    firmware = device / ("firmware_rev" if (device / "firmware_rev").exists() else "rev")
    discard = _read(block / "queue" / "discard_max_bytes") not in ("0", "unknown")
    return DriveIdentity(
        block.name, _read(device / "model"), _read(device / "serial"), _read(firmware), **mount, discard=discard
    )


def _read(path: Path) -> str:
    try:
        return path.read_text().strip() or "unknown"
    except OSError:
        return "unknown"


def _block_device(path: Path) -> Path | None:
    """The sysfs directory of the whole disk holding `path` (a partition's parent), or None."""
    dev = os.stat(path).st_dev
    sys_path = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    if not sys_path.exists():
        return None
    block = sys_path.resolve()
    return block.parent if (block / "partition").exists() else block


def mount_of(path: Path) -> dict[str, str]:
    """The innermost mount holding `path`: mount_point, filesystem, mount_options ({} when unreadable)."""
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
