"""The bytes the lowest block devices under a path really read and wrote over a timed region, from the block layer's
own counters (/sys/class/block/<dev>/stat: sectors read is the 3rd field, sectors written the 7th, in 512-byte
sectors), and the layer below a loop device (its backing file), which a cold read must evict as well.

The walk follows partitions of stacked devices, device-mapper and md members (`slaves/`) and loop devices, whose
backing file the kernel itself names by device and inode (LOOP_GET_STATUS64), down to the disks or partitions that
hold the bytes. Every reader takes its sysfs, proc and dev roots as parameters, so that tests can point them elsewhere.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import socket
import stat
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ckptqual.host.cache import resident_bytes
from ckptqual.host.identity import PROC, SYS, block_dir, block_of, mount_of

SECTOR_BYTES = 512  # the block layer counts 512-byte sectors whatever the device's block size
DEV = Path("/dev")
MAX_RESIDENT_SHARE = 0.05  # of a backing file still in memory after eviction: not evicted (as the cold reads allow)
_LOOP_GET_STATUS64 = 0x4C05
_LOOP_INFO64 = struct.Struct("=QQQQQIIII64s64s32s2Q")  # struct loop_info64: lo_device and lo_inode come first


class OnHost(Protocol):
    """Where some ranks ran (runs.timing.NodeTiming)."""

    @property
    def hostname(self) -> str: ...


class Unresolved(Exception):
    """The devices under a path cannot be told; the message says why."""


@dataclass(frozen=True)
class BackingFile:
    """The file under loop device `loop`, as the kernel records it (device and inode) and names it (`path`)."""

    loop: str
    path: str
    device: int
    inode: int

    def evict(self) -> str:
        """Writes back and drops the file's cached pages (opened O_RDONLY|O_NOFOLLOW, and only if it is still the
        loop device's file), then asks mincore how much stayed (locked pages do); one line saying what was done or
        why not."""
        name = f"{self.loop}'s backing file {self.path}"
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as error:
            return f"{name} could not be evicted: {error.strerror}"
        try:
            found = os.fstat(fd)
            if (found.st_dev, found.st_ino) != (self.device, self.inode):
                return f"{name} could not be evicted: the path now names another file than the loop device reads"
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            resident, size = resident_bytes(fd, self.path)
        except OSError as error:
            return f"{name} could not be evicted: {error.strerror}"
        finally:
            os.close(fd)
        if resident > MAX_RESIDENT_SHARE * size:
            return (
                f"{name} could not be evicted: {resident:,} of its {size:,} bytes stayed in memory (mincore; "
                f"pages locked in memory stay)"
            )
        return f"{name} evicted (mincore finds under {MAX_RESIDENT_SHARE:.0%} of it in memory)"


@dataclass(frozen=True)
class Devices:
    """The lowest block devices under a path, by name with their stat files, and the loop backing files above them;
    `not_countable` says why there are none to count (tmpfs, a network filesystem)."""

    stats: tuple[tuple[str, Path], ...] = ()
    backing_files: tuple[BackingFile, ...] = ()
    not_countable: str | None = None

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.stats]

    def evict_below(self) -> tuple[str, ...]:
        """Drops the layer below the files from the page cache (every loop backing file); one line for each."""
        return tuple(backing.evict() for backing in self.backing_files)


def devices_under(path: Path, *, sys_root: Path = SYS, proc_root: Path = PROC, dev_root: Path = DEV) -> Devices:
    """The devices whose counters show the I/O to the files under `path`."""
    mount = mount_of(path, proc_root=proc_root)
    block = block_of(path, mount.get("source"), sys_root)
    if block is None:
        where = f"{mount.get('filesystem', 'the filesystem')} at {mount.get('mount_point', path)}"
        return Devices(not_countable=f"{where} has no block device whose reads can be counted")
    return devices_of(block, sys_root=sys_root, dev_root=dev_root)


def devices_of(block: Path, *, sys_root: Path = SYS, dev_root: Path = DEV) -> Devices:
    """The devices whose counters show the I/O to the block device whose sysfs directory is `block`."""
    stats: dict[str, Path] = {}
    backing: list[BackingFile] = []
    try:
        _walk(block, stats, backing, sys_root, dev_root)
    except Unresolved as why:
        return Devices(not_countable=str(why))
    return Devices(tuple(stats.items()), tuple(backing))


def _walk(block: Path, stats: dict[str, Path], backing: list[BackingFile], sys_root: Path, dev_root: Path) -> None:
    """Adds the lowest devices under the block device whose sysfs directory is `block` (and the backing files on the
    way) to `stats` and `backing`."""
    if (block / "partition").exists() and _is_stacked(block.parent):
        block = block.parent  # a partition of a loop, md or dm device: the whole device's members hold its bytes
    slaves = sorted((block / "slaves").iterdir()) if (block / "slaves").is_dir() else []
    slaves = slaves or nvme_paths(block, sys_root)
    if slaves:
        for slave in slaves:
            _walk(slave.resolve(), stats, backing, sys_root, dev_root)
    elif (block / "loop" / "backing_file").exists():
        file = loop_backing_file(block, dev_root)
        backing.append(file)
        below = block_dir(f"{os.major(file.device)}:{os.minor(file.device)}", sys_root)
        if below is None:
            raise Unresolved(f"{file.loop}'s backing file {file.path} lies on a filesystem without a block device")
        _walk(below, stats, backing, sys_root, dev_root)
    else:
        stats.setdefault(block.name, block / "stat")


def nvme_paths(block: Path, sys_root: Path = SYS) -> list[Path]:
    """The path devices (nvmeScCnN, hidden) of a native-multipath NVMe head nvmeSnN, which count the I/O the head
    passes on (older kernels count none on the head); none for any other device."""
    head = re.fullmatch(r"nvme(\d+)n(\d+)", block.name)
    if head is None or "nvme-subsystem" not in block.parts:
        return []
    return sorted((sys_root / "class" / "block").glob(f"nvme{head[1]}c*n{head[2]}"))


def _is_stacked(block: Path) -> bool:
    """Whether the block device at `block` is made of others: members (md, dm) or a backing file (loop)."""
    return ((block / "slaves").is_dir() and any((block / "slaves").iterdir())) or (block / "loop").is_dir()


def loop_backing_file(block: Path, dev_root: Path = DEV) -> BackingFile:
    """The backing file of the loop device whose sysfs directory is `block`: its device and inode from the kernel
    (LOOP_GET_STATUS64 on the device node, checked to be that device), its path from sysfs."""
    name, path = block.name, (block / "loop" / "backing_file").read_text().strip()
    major, minor = (int(part) for part in (block / "dev").read_text().split(":"))
    try:
        fd = os.open(dev_root / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as error:
        raise Unresolved(f"{dev_root / name} cannot be opened to ask for its backing file: {error.strerror}") from None
    try:
        node = os.fstat(fd)
        if not stat.S_ISBLK(node.st_mode) or node.st_rdev != os.makedev(major, minor):
            raise Unresolved(f"{dev_root / name} is not the block device {major}:{minor} that sysfs names {name}")
        info = fcntl.ioctl(fd, _LOOP_GET_STATUS64, bytes(_LOOP_INFO64.size))
    except OSError as error:
        raise Unresolved(f"{dev_root / name} does not say which file it reads: {error.strerror}") from None
    finally:
        os.close(fd)
    device, inode = _LOOP_INFO64.unpack(info)[:2]
    return BackingFile(name, path, device, inode)


def parse_stat(text: str) -> tuple[int, int]:
    """(bytes read, bytes written) so far, from the text of a block device's stat file."""
    fields = text.split()
    if len(fields) < 7 or not (fields[2].isdigit() and fields[6].isdigit()):
        raise ValueError(f"not a block device stat line: {text.strip()!r}")
    return int(fields[2]) * SECTOR_BYTES, int(fields[6]) * SECTOR_BYTES


@dataclass(frozen=True)
class DeviceBytes:
    """One timed region's bytes: what the suite read (or wrote and fsynced) and what the devices under the target
    did the same way (None where `not_countable` says why they could not be counted)."""

    direction: str  # "read" or "written"
    suite_bytes: int
    device_bytes: int | None
    devices: tuple[str, ...]
    not_countable: str | None = None
    layer_below: tuple[str, ...] = ()  # what was done to the layer below before a cold read (Devices.evict_below)

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "devices": list(self.devices), "layer_below": list(self.layer_below)}


@dataclass
class Count:
    """The devices' bytes between entering and leaving `counted` (None until it is left, or where not countable)."""

    devices: Devices
    read_bytes: int | None = None
    written_bytes: int | None = None
    not_countable: str | None = None

    def of(
        self, suite_bytes: int, direction: str, nodes: Iterable[OnHost] = (), layer_below: tuple[str, ...] = ()
    ) -> DeviceBytes:
        """The region's figures for `suite_bytes` moved in `direction` by ranks on `nodes` (none: this host alone)."""
        others = sorted({node.hostname for node in nodes if node.hostname != socket.gethostname()})
        why = self.not_countable or (
            f"ranks ran on {', '.join(others)}, whose devices this host cannot count" if others else None
        )
        counted = self.read_bytes if direction == "read" else self.written_bytes
        names = tuple(self.devices.names)
        return DeviceBytes(direction, suite_bytes, None if why else counted, names, why, layer_below)


@contextlib.contextmanager
def counted(devices: Devices) -> Iterator[Count]:
    """Counts what `devices` read and write while the block runs (the counters of every process, so other I/O only
    adds to them)."""
    count = Count(devices, not_countable=devices.not_countable)
    before = _snapshot(devices, count)
    yield count
    after = _snapshot(devices, count)
    if before is not None and after is not None:
        count.read_bytes = sum(after[name][0] - before[name][0] for name in after)
        count.written_bytes = sum(after[name][1] - before[name][1] for name in after)


def _snapshot(devices: Devices, count: Count) -> dict[str, tuple[int, int]] | None:
    """Every device's (bytes read, bytes written) now; None (and why, in `count`) where one cannot be read."""
    if count.not_countable:
        return None
    try:
        return {name: parse_stat(path.read_text()) for name, path in devices.stats}
    except (OSError, ValueError) as error:
        count.not_countable = f"the block layer's counters could not be read: {error}"
        return None
