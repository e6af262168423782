"""What may be a target: an existing, writable directory, no system directory, holding only ckptqual's entries
(its marker, its lock file, its marked run directories). Also the names of those entries and the one-line errors."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path

from ckptqual.faults import os_error_line
from ckptqual.host.beneath import PlantedEntry, RunTree
from ckptqual.host.identity import mount_of

TARGET_MARKER = ".ckptqual-target"
RUN_MARKER = ".ckptqual-run"
RUN_PREFIX = "ckptqual-run-"
LOCK_FILE = ".ckptqual-lock"
_TOLERATED = "lost+found"  # a fresh filesystem's root holds it; never touched
_SYSTEM_DIRS = (  # a target here is refused
    "/ /bin /boot /dev /etc /home /lib /lib32 /lib64 /media /mnt /opt /proc /root /run /sbin /srv /sys /tmp /usr /var"
    " /var/tmp"
)
_WRITE_FIX = "give this user write permission on the target"
_FIXES = {
    errno.ENOSPC: "its filesystem has no free space or no free inodes (df -h, df -i): free some or use a larger target",
    errno.EDQUOT: "the disk quota is used up; see quota -s",
    errno.EROFS: "the filesystem is read-only; remount it read-write",
    errno.EACCES: _WRITE_FIX,
    errno.EPERM: _WRITE_FIX,
}


class TargetError(ValueError):
    """The target cannot be used; the message is one line naming the path, the problem and the fix."""


def error_line(operation: str, path: Path | str, error: OSError) -> str:
    """'unlink /mnt/x/a.pt: [Errno 30 EROFS] Read-only file system', naming the whole path."""
    return os_error_line(OSError(error.errno, error.strerror, str(path)), operation)


def failure(operation: str, path: Path, error: OSError) -> TargetError:
    """A TargetError naming the operation, the path, the errno and the fix."""
    fix = _FIXES.get(error.errno or 0, "check the target's filesystem (see dmesg)")
    return TargetError(f"{error_line(operation, path, error)}; {fix}")


def usable_problem(path: Path, writing: bool = True) -> str | None:
    """Why `path` can be no target at all (missing, not a directory, a system directory, not writable)."""
    if not path.exists():
        return f"target {path} does not exist; create and mount it first"
    if not path.is_dir():
        return f"target {path} is not a directory"
    real = path.resolve()
    if str(real) in _SYSTEM_DIRS.split():
        return f"target {real} is a system directory; mount the drive under test and point --target at it"
    if writing and os.statvfs(real).f_flag & os.ST_RDONLY:
        mount = mount_of(real).get("mount_point", "unknown")
        return f"target {real} is on a read-only filesystem (mounted at {mount}); remount it read-write"
    if writing and not os.access(real, os.W_OK | os.X_OK):
        return f"target {real} is not writable by this user"
    return None


def is_run_dir(entry: Path) -> bool:
    """A directory ckptqual marked as a run directory: it and its manifest reached without following a symlink, the
    manifest a regular file."""
    if not entry.name.startswith(RUN_PREFIX):
        return False
    try:
        with RunTree(entry) as tree:
            return stat.S_ISREG(tree.lstat(entry / RUN_MARKER).st_mode)
    except OSError:  # a symlink or no directory (PlantedEntry), or no manifest
        return False


def has_run_dir(target: Path) -> bool:
    return any(map(is_run_dir, target.iterdir()))


def foreign_entries(target: Path) -> list[str]:
    """The names in `target` that are not ckptqual's (its marker or lock file planted as a symlink, a FIFO, ... is
    not)."""
    return sorted(entry.name for entry in target.iterdir() if not _is_ours(entry))


def _is_ours(entry: Path) -> bool:
    """Whether `entry` is ckptqual's; one gone since it was listed (another run's cleanup removed it) is no one's."""
    if entry.name in (TARGET_MARKER, LOCK_FILE):
        try:
            return stat.S_ISREG(entry.lstat().st_mode)
        except FileNotFoundError:
            return True
    return entry.name == _TOLERATED or is_run_dir(entry)


def _shown(target: Path, name: str) -> str:
    """The name, and where it points for a symlink ("x -> /victim")."""
    with suppress(OSError):
        return f"{name} -> {os.readlink(target / name)}"
    return name


def foreign_message(target: Path, foreign: Sequence[str]) -> str:
    shown = ", ".join(_shown(target, name) for name in foreign[:5]) + (" ..." if len(foreign) > 5 else "")
    return (
        f"target {target} holds {len(foreign)} entr{'y' if len(foreign) == 1 else 'ies'} ckptqual did not "
        f"create ({shown}); give an empty directory (nothing will be deleted here)"
    )


def ensure_marker(target: Path) -> bool:
    """Creates the target marker unless present; whether this call created it."""
    marker = target / TARGET_MARKER
    if os.path.lexists(marker):
        return False
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as error:
        raise failure("create", marker, error) from error
    try:
        os.write(fd, b"This directory is a ckptqual target; ckptqual removes only what it creates here.\n")
    except OSError as error:
        with suppress(OSError):
            marker.unlink()
        raise failure("write", marker, error) from error
    finally:
        os.close(fd)
    return True


def remove_marker(target: Path) -> str | None:
    """Removes the target marker unless a marked run directory remains (one planted in its place is left and
    named); an error as one line, else None."""
    marker = target / TARGET_MARKER
    try:
        if has_run_dir(target):
            return None
        with RunTree(target) as tree:
            tree.unlink(marker)
    except FileNotFoundError:
        pass
    except OSError as error:  # PlantedEntry names what it is
        return str(error) if isinstance(error, PlantedEntry) else error_line("unlink", marker, error)
    return None
