"""Where one directory shows on this host: its own path, and every other mount of its filesystem that exposes it
(a bind mount of it, of a directory above it), found through /proc/self/mountinfo and confirmed by device and inode.
A directory reached through a bind mount is the same directory: its parents by path are not all of its parents."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

MOUNTINFO = Path("/proc/self/mountinfo")
_ESCAPED = re.compile(r"\\([0-7]{3})")  # mountinfo writes a space in a path as \040


@dataclass(frozen=True)
class Mount:
    """One line of mountinfo: the filesystem (major:minor), the directory of it mounted (root), and where."""

    device: str
    root: PurePosixPath
    point: Path


def mounts(mountinfo: Path = MOUNTINFO) -> list[Mount]:
    """This process's mounts in mountinfo's order (a later mount on the same point hides an earlier one)."""
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        fields = line.split(" - ", 1)[0].split()
        if len(fields) >= 5:
            found.append(Mount(fields[2], PurePosixPath(_unescape(fields[3])), Path(_unescape(fields[4]))))
    return found


def _unescape(text: str) -> str:
    return _ESCAPED.sub(lambda match: chr(int(match.group(1), 8)), text)


def key(path: Path) -> tuple[int, int]:
    """(st_dev, st_ino) of `path`, links followed."""
    info = os.stat(path)
    return info.st_dev, info.st_ino


def aliases(directory: Path, mountinfo: Path = MOUNTINFO) -> list[Path]:
    """Every path other than its own at which the existing `directory` shows through another mount of its
    filesystem, each confirmed to be the same directory by device and inode."""
    real = directory.resolve()
    table = mounts(mountinfo)
    own = _mount_of(real, table)
    if own is None:
        return []
    inside = own.root / real.relative_to(own.point)  # the directory's path from its filesystem's root
    wanted, found = key(real), []
    for mount in table:
        if mount.device != own.device or not inside.is_relative_to(mount.root):
            continue
        candidate = mount.point / inside.relative_to(mount.root)
        if candidate != real and _is(candidate, wanted):
            found.append(candidate)
    return found


def all_places(directory: Path, mountinfo: Path = MOUNTINFO) -> Iterator[Path]:
    """The resolved `directory`, then its aliases."""
    yield directory.resolve()
    yield from aliases(directory, mountinfo)


def ancestor_keys(path: Path) -> set[tuple[int, int]]:
    """(st_dev, st_ino) of the deepest existing directory at or above `path` and of each of its parents, at each
    place it shows (aliases): what a path lies inside, whichever mount it is reached through."""
    existing = next(parent for parent in (path, *path.parents) if parent.is_dir())
    keys = set()
    for place in all_places(existing):
        for directory in (place, *place.parents):
            try:
                keys.add(key(directory))
            except OSError:
                continue
    return keys


def _mount_of(real: Path, table: list[Mount]) -> Mount | None:
    """The mount that `real` (resolved) is reached through: the last of those with the longest point holding it."""
    best = None
    for mount in table:
        if real.is_relative_to(mount.point) and (best is None or len(mount.point.parts) >= len(best.point.parts)):
            best = mount
    return best


def _is(path: Path, wanted: tuple[int, int]) -> bool:
    try:
        return key(path) == wanted
    except OSError:
        return False
