"""The drive under test: the guard, the lock, the run directory and its manifest, leftovers, and identity.

One run at a time holds a target: an exclusive POSIX lock on `.ckptqual-lock`, taken before anything else is
created and released at cleanup. A run writes only inside a run directory of its own, records in that
directory's manifest (`.ckptqual-run`) what it writes before writing it, and removes only what the manifest
names. A target must be empty or hold only ckptqual's entries; anything else is refused untouched.

A process holding a target's lock must not open `.ckptqual-lock` other than through this module: closing any
descriptor of a file drops every POSIX lock the process holds on that file.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import fnmatch
import glob
import json
import os
import secrets
import shutil
import socket
import stat
import struct
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack, suppress
from dataclasses import dataclass, field, replace
from itertools import takewhile
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

from ckptqual import __version__
from ckptqual.faults import os_error_line

TARGET_MARKER = ".ckptqual-target"
RUN_MARKER = ".ckptqual-run"
RUN_PREFIX = "ckptqual-run-"
LOCK_FILE = ".ckptqual-lock"
FILE_LIST = ".ckptqual-files"
MANIFEST_FORMAT = "ckptqual-run-manifest"
MANIFEST_VERSION = 1
NOT_OURS = "not created by ckptqual"
KEPT = "kept with --keep"
_TEMP_INFIX = ".tmp-"  # `.ckptqual-run.tmp-PID`: a manifest being written (renamed into place when whole)
_ROOT = PurePosixPath()
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FLOCK = "hhqqi4x"  # struct flock on 64-bit Linux: type, whence, start, len, pid
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
_FIXES = {
    errno.ENOSPC: "no free space or no free inodes? see df -h and df -i",
    errno.EDQUOT: "the disk quota is used up; see quota -s",
    errno.EROFS: "the filesystem is read-only; remount it read-write",
    errno.EACCES: "give this user write permission on the target",
    errno.EPERM: "give this user write permission on the target",
}


class TargetError(ValueError):
    """The target cannot be used; the message is one line naming the path, the problem and the fix."""


def _os_error_line(operation: str, path: Path | str, error: OSError) -> str:
    """'unlink /mnt/x/a.pt: [Errno 30 EROFS] Read-only file system'."""
    if error.errno is None:
        return f"{operation} {path}: {error}"
    return os_error_line(OSError(error.errno, error.strerror, str(path)), operation)


def _failure(operation: str, path: Path, error: OSError) -> TargetError:
    """A TargetError naming the operation, the path, the errno and the fix."""
    fix = _FIXES.get(error.errno or 0, "check the target's filesystem (see dmesg)")
    return TargetError(f"{_os_error_line(operation, path, error)}; {fix}")


def _unlink_quietly(path: Path) -> None:
    """Removes a file this module just created, on a path that is failing anyway."""
    with suppress(OSError):
        path.unlink(missing_ok=True)


def _rmdir_quietly(path: Path) -> None:
    """Removes a directory this module just created, if it is empty."""
    with suppress(OSError):
        path.rmdir()


def _now_text() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")


def format_bytes(size_bytes: int) -> str:
    """'1.31 GB' (1e9), '4.10 MB' (1e6), '12.29 kB' (1e3) or '12 bytes'."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size_bytes >= scale:
            return f"{size_bytes / scale:,.2f} {unit}"
    return f"{size_bytes} bytes"


def format_age(age_s: float) -> str:
    """'45 s', '12 min', '2 h' or '3 d'."""
    for unit, scale, below in (("s", 1, 120), ("min", 60, 7_200), ("h", 3_600, 172_800)):
        if age_s < below:
            return f"{int(age_s // scale)} {unit}"
    return f"{int(age_s // 86_400)} d"


# ---- the lock: one run (or one `ckptqual clean`) per target --------------------------------------------------


@dataclass
class _Lock:
    """An exclusive POSIX lock on a target's lock file, held through an open descriptor."""

    path: Path
    fd: int
    key: tuple[int, int]
    holder: dict[str, Any]

    def release(self) -> str | None:
        """Unlinks the lock file while still holding the lock, then closes it; an error as one line, else None."""
        if self.fd < 0:
            return None
        try:
            return _unlink_lock_file(self.path)
        finally:
            self.close()

    def close(self) -> None:
        """Drops the lock; a lock file still there is stale from now on (taken over by the next run)."""
        if self.fd >= 0:
            _HELD.pop(self.key, None)
            os.close(self.fd)
            self.fd = -1


def _unlink_lock_file(path: Path) -> str | None:
    """Unlinks a lock file (its holder still holding the lock); an error as one line, else None."""
    try:
        path.unlink(missing_ok=True)
    except OSError as error:
        return _os_error_line("unlink", path, error)
    return None


_HELD: dict[tuple[int, int], _Lock] = {}  # target directory (st_dev, st_ino) -> the lock this process holds


def _dir_key(directory: Path) -> tuple[int, int]:
    info = os.stat(directory)
    return info.st_dev, info.st_ino


def _holder_record(run_dir: str | None, command: str) -> dict[str, Any]:
    """Who holds a lock: PID, host, start time, run directory (None for `ckptqual clean`)."""
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": _now_text(),
        "started_unix": time.time(),
        "run_dir": run_dir,
        "command": command,
    }


def _acquire_lock(target: Path, holder: dict[str, Any]) -> _Lock:
    """Locks `target` for this process at once or raises TargetError naming the holder."""
    key = _dir_key(target)
    if key in _HELD:  # POSIX locks never conflict within a process: refuse from the registry
        raise TargetError(_in_use_message(target, _HELD[key].holder))
    path = target / LOCK_FILE
    for _ in range(100):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as error:
            raise _failure("create", path, error) from error
        if not _try_lock(fd, path, target):
            continue
        lock = _Lock(path, fd, key, holder)
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(holder).encode(), 0)
        except OSError as error:
            lock.release()
            raise _failure("write", path, error) from error
        _HELD[key] = lock
        return lock
    raise TargetError(f"lock {path}: the file keeps being replaced; stop whatever removes it and try again")


def _try_lock(fd: int, path: Path, target: Path) -> bool:
    """Locks the open lock file; False (fd closed) when the path meanwhile names another file: retry."""
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        holder = _read_holder(fd)
        os.close(fd)
        if error.errno in (errno.EACCES, errno.EAGAIN):
            raise TargetError(_in_use_message(target, holder or {})) from None
        raise _failure("lock", path, error) from error
    if _names_inode(path, fd):
        return True
    os.close(fd)  # the holder unlinked it between our open and our lock: the lock we got guards nothing
    return False


def _names_inode(path: Path, fd: int) -> bool:
    """Whether `path` still names the file open as `fd`."""
    opened = os.fstat(fd)
    try:
        named = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino)


def _read_holder(fd: int) -> dict[str, Any] | None:
    """The holder record in an open lock file (None when empty, being written or unreadable)."""
    try:
        record = json.loads(os.pread(fd, 1 << 16, 0))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _is_locked(fd: int) -> bool:
    """Whether another process holds a lock on the open file (F_GETLK; works on a read-only descriptor)."""
    query = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
    try:
        answer = fcntl.fcntl(fd, fcntl.F_GETLK, query)
    except OSError:
        return False  # cannot tell (e.g. no lock daemon): taking the lock will say
    return struct.unpack(_FLOCK, answer)[0] != fcntl.F_UNLCK


def _live_holder(target: Path) -> dict[str, Any] | None:
    """The record of the run holding `target`'s lock ({} if not yet recorded); None when nobody holds it."""
    try:
        key = _dir_key(target)
    except OSError:
        return None
    if key in _HELD:
        return _HELD[key].holder
    path = target / LOCK_FILE
    for _ in range(100):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            if _is_locked(fd):
                return _read_holder(fd) or {}
            if _names_inode(path, fd):
                return None
        finally:
            os.close(fd)
    return {}  # the file keeps being replaced: runs are coming and going


def _stale_holder(target: Path) -> dict[str, Any] | None:
    """The record in a lock file nobody holds ({} if unreadable); None when there is no such file."""
    if _live_holder(target) is not None or not (target / LOCK_FILE).is_file():
        return None
    try:
        fd = os.open(target / LOCK_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return {}
    try:
        return _read_holder(fd) or {}
    finally:
        os.close(fd)


def describe_holder(holder: dict[str, Any]) -> str:
    """'PID 1234 on host h, since 2026-11-30 01:02:03, run directory ckptqual-run-...'."""
    parts = []
    if "pid" in holder:
        parts.append(f"PID {holder['pid']} on host {holder.get('host', 'unknown')}")
    if "started" in holder:
        parts.append(f"since {holder['started']}")
    if holder.get("run_dir"):
        parts.append(f"run directory {holder['run_dir']}")
    elif holder.get("command"):
        parts.append(str(holder["command"]))
    return ", ".join(parts) or "its holder is not recorded yet"


def _in_use_message(target: Path, holder: dict[str, Any]) -> str:
    return (
        f"target {target} is in use by another ckptqual run ({describe_holder(holder)}); "
        "wait for it to finish, or stop it"
    )


# ---- the manifest: what a run writes, declared before it writes it --------------------------------------------


def _relative(text: str, what: str, root_ok: bool = False) -> str:
    """`text` as a clean path relative to the run directory; TargetError if absolute, with '..' or empty."""
    path = PurePosixPath(text) if isinstance(text, str) else None
    if path is None or path.is_absolute() or ".." in path.parts or RUN_MARKER in path.parts:
        raise TargetError(
            f"{what} {text!r}: must be a path relative to the run directory, without '..' or {RUN_MARKER}"
        )
    if not path.parts and not root_ok:
        raise TargetError(f"{what} {text!r}: must name a file; give its path relative to the directory")
    return str(path)


def _write_json_atomically(directory: Path, name: str, data: Any) -> None:
    """Writes `directory/name` whole or not at all: a temporary file, fsynced, renamed over it."""
    temporary = directory / f"{name}{_TEMP_INFIX}{os.getpid()}"
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "wb") as file:
            file.write(json.dumps(data, indent=1).encode())
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, directory / name)
    except BaseException:
        _unlink_quietly(temporary)
        raise


def _new_manifest(holder: dict[str, Any]) -> dict[str, Any]:
    return {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "ckptqual": __version__,
        "pid": holder["pid"],
        "host": holder["host"],
        "started": holder["started"],
        "started_unix": holder["started_unix"],
        "kept": False,
        "groups": [],
    }


def write_file_list(directory: Path, files: Iterable[str]) -> None:
    """Names, before they are written, more files of one directory of a group declared with listed=True."""
    names = [_relative(name, "file") for name in files]
    try:
        _write_json_atomically(directory, FILE_LIST, names)
    except OSError as error:
        raise _failure("write", directory / FILE_LIST, error) from error


@dataclass(frozen=True)
class _Group:
    """Directories matching `pattern` (relative to the run directory) and the files the run writes in each."""

    pattern: str
    files: tuple[str, ...]
    listed: bool


def _parse_groups(manifest: Any) -> list[_Group]:
    """The groups of a manifest; ValueError when it is not a ckptqual run manifest this version reads."""
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise ValueError("not a ckptqual run manifest (an older ckptqual's marker?)")
    if manifest.get("version") != MANIFEST_VERSION:
        raise ValueError(f"manifest version {manifest.get('version')!r}, this ckptqual reads {MANIFEST_VERSION}")
    try:
        return [
            _Group(
                _relative(group["pattern"], "pattern", root_ok=True),
                tuple(_relative(name, "file") for name in group["files"]),
                bool(group.get("listed", False)),
            )
            for group in manifest["groups"]
        ]
    except (KeyError, TypeError, TargetError) as error:
        raise ValueError(f"malformed groups: {error}") from error


def _read_json_at(dir_fd: int, name: str) -> Any:
    """A JSON file inside an open directory, without following a symlink."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    with os.fdopen(fd, "rb") as file:
        return json.loads(file.read())


def _load_manifest(run_dir_fd: int) -> dict[str, Any]:
    """The manifest of an open run directory; OSError or ValueError when it has none this version can read."""
    try:
        manifest = _read_json_at(run_dir_fd, RUN_MARKER)
    except json.JSONDecodeError:
        raise ValueError("not a ckptqual run manifest (an older ckptqual's marker?)") from None
    _parse_groups(manifest)
    return manifest


def _read_manifest(run_dir: Path) -> dict[str, Any]:
    """A run directory's manifest; OSError or ValueError when it has none this version can read."""
    fd = os.open(run_dir, _DIR_FLAGS)
    try:
        return _load_manifest(fd)
    finally:
        os.close(fd)


# ---- removal: exactly what a manifest names, never through a symlink ---------------------------------------------


@dataclass(frozen=True)
class Left:
    """An entry a removal left in place: its path relative to the target, and why."""

    path: str
    why: str


@dataclass(frozen=True)
class Removal:
    """What `remove_owned` did to one run directory (picklable; `to_dict` is its JSON form)."""

    run_dir: str
    removed_files: int = 0
    removed_bytes: int = 0  # allocated on disk (st_blocks)
    left: tuple[Left, ...] = ()
    errors: tuple[str, ...] = ()  # one line each: operation, path, errno
    dry_run: bool = False

    @property
    def complete(self) -> bool:
        """Everything in scope is gone (would be, in a dry run): nothing left, no error."""
        return not self.left and not self.errors

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_dir": self.run_dir,
            "complete": self.complete,
            "removed_files": self.removed_files,
            "removed_bytes": self.removed_bytes,
            "left": [{"path": entry.path, "why": entry.why} for entry in self.left],
            "errors": list(self.errors),
            "dry_run": self.dry_run,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Removal:
        return cls(
            run_dir=data["run_dir"],
            removed_files=data["removed_files"],
            removed_bytes=data["removed_bytes"],
            left=tuple(Left(entry["path"], entry["why"]) for entry in data["left"]),
            errors=tuple(data["errors"]),
            dry_run=data.get("dry_run", False),
        )


def _within(path: PurePosixPath, scope: PurePosixPath) -> bool:
    return scope == _ROOT or path == scope or scope in path.parents


class _Remover:
    """One removal pass over a run directory, through directory descriptors that never follow a symlink."""

    def __init__(self, run_dir: Path, root_fd: int, scope: PurePosixPath, dry_run: bool) -> None:
        self.run_dir = run_dir
        self.scope = scope
        self.dry_run = dry_run
        self.fds: dict[PurePosixPath, int | None] = {_ROOT: root_fd}
        self.owned_dirs: set[PurePosixPath] = set()
        self.gone: set[PurePosixPath] = set()  # removed, or would be in a dry run
        self.failed: dict[PurePosixPath, str] = {}
        self.errors: list[str] = []
        self.files = 0
        self.bytes = 0

    def close(self) -> None:
        for rel, fd in self.fds.items():
            if fd is not None and rel != _ROOT:
                os.close(fd)

    def fail(self, operation: str, rel: PurePosixPath, error: OSError) -> None:
        line = _os_error_line(operation, self.run_dir / rel, error)
        self.failed[rel] = line
        self.errors.append(line)

    def dir_fd(self, rel: PurePosixPath) -> int | None:
        """A descriptor of the real directory `rel` (None when missing, a symlink or not a directory)."""
        if rel not in self.fds:
            parent = self.dir_fd(rel.parent)
            self.fds[rel] = None if parent is None else self._open_subdir(parent, rel)
        return self.fds[rel]

    def _open_subdir(self, parent_fd: int, rel: PurePosixPath) -> int | None:
        try:
            return os.open(rel.name, _DIR_FLAGS, dir_fd=parent_fd)
        except OSError as error:
            if error.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                self.fail("open", rel, error)
            return None

    def entries(self, rel: PurePosixPath) -> list[tuple[str, bool]]:
        """(name, is a real directory) of each entry of `rel`."""
        fd = self.dir_fd(rel)
        if fd is None:
            return []
        try:
            with os.scandir(fd) as found:
                return sorted((entry.name, entry.is_dir(follow_symlinks=False)) for entry in found)
        except OSError as error:
            self.fail("list", rel, error)
            return []

    def matching(self, pattern: str) -> list[PurePosixPath]:
        """The real directories whose path relative to the run directory matches the glob `pattern`."""
        found = [_ROOT]
        for part in PurePosixPath(pattern).parts:
            found = [
                directory / name
                for directory in found
                for name, is_dir in self.entries(directory)
                if is_dir and fnmatch.fnmatchcase(name, part)
            ]
        return found

    def listed(self, directory: PurePosixPath) -> list[str]:
        """The files a directory's `.ckptqual-files` names (none if it has no such list)."""
        fd = self.dir_fd(directory)
        if fd is None:
            return []
        try:
            names = _read_json_at(fd, FILE_LIST)
            return [_relative(name, "file") for name in names]
        except FileNotFoundError:
            return []
        except OSError as error:
            self.fail("read", directory / FILE_LIST, error)
        except (ValueError, TypeError) as error:
            self.errors.append(f"read {self.run_dir / directory / FILE_LIST}: not a JSON list of file paths ({error})")
        return []

    def unlink(self, rel: PurePosixPath) -> None:
        """Removes the regular file `rel` if it exists; anything else there is left and reported."""
        fd = self.dir_fd(rel.parent)
        if fd is None or rel in self.gone:
            return
        try:
            info = os.stat(rel.name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return  # never written, or already removed
        except OSError as error:
            self.fail("stat", rel, error)
            return
        if not stat.S_ISREG(info.st_mode):
            return
        if not self.dry_run:
            try:
                os.unlink(rel.name, dir_fd=fd)
            except FileNotFoundError:
                return
            except OSError as error:
                self.fail("unlink", rel, error)
                return
        self.gone.add(rel)
        self.files += 1
        self.bytes += info.st_blocks * 512

    def unlink_temporaries(self, directory: PurePosixPath, name: str) -> None:
        """Removes `name.tmp-PID` files: ckptqual's own half-written lists or manifests."""
        for entry, is_dir in self.entries(directory):
            if not is_dir and entry.startswith(f"{name}{_TEMP_INFIX}"):
                self.unlink(directory / entry)

    def remove_group(self, group: _Group) -> None:
        """Removes a group's files in every matching directory in scope; notes the directories they imply, and the
        pattern's fixed leading directories ("checkpoints" of "checkpoints/checkpoint-*"), made by the run too."""
        fixed = PurePosixPath(*takewhile(lambda part: not glob.has_magic(part), PurePosixPath(group.pattern).parts))
        if fixed != _ROOT and _within(fixed, self.scope):
            self.own_dirs(fixed)
        for directory in self.matching(group.pattern):
            if not (_within(directory, self.scope) or _within(self.scope, directory)):
                continue
            names = [*group.files, *self.listed(directory)] if group.listed else list(group.files)
            for name in names:
                path = directory / name
                if _within(path, self.scope):
                    self.unlink(path)
                    self.own_dirs(path.parent)
            if group.listed and _within(directory / FILE_LIST, self.scope):
                self.unlink(directory / FILE_LIST)
                self.unlink_temporaries(directory, FILE_LIST)
            self.own_dirs(directory)

    def own_dirs(self, directory: PurePosixPath) -> None:
        """Notes `directory` and its parents (below the run directory, in scope) as ckptqual's."""
        for rel in (directory, *directory.parents):
            if rel != _ROOT and _within(rel, self.scope):
                self.owned_dirs.add(rel)

    def remove_dirs(self) -> None:
        """Removes each directory ckptqual made that is now empty, deepest first."""
        for rel in sorted(self.owned_dirs, key=lambda rel: len(rel.parts), reverse=True):
            self.rmdir(rel)

    def rmdir(self, rel: PurePosixPath) -> None:
        fd = self.dir_fd(rel.parent)
        if fd is None or self.dir_fd(rel) is None:
            return
        if self.dry_run:
            if all(rel / name in self.gone for name, _ in self.entries(rel)):
                self.gone.add(rel)
            return
        try:
            os.rmdir(rel.name, dir_fd=fd)
        except OSError as error:
            if error.errno not in (errno.ENOENT, errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                self.fail("rmdir", rel, error)
            return
        self.gone.add(rel)

    def leftovers(self, rel: PurePosixPath) -> list[Left]:
        """What is still in `rel`: foreign entries (whole) and ckptqual's files that could not be removed."""
        left = []
        for name, is_dir in self.entries(rel):
            child = rel / name
            if child in self.gone or (rel == _ROOT and _is_manifest_name(name)):
                continue
            if is_dir and child in self.owned_dirs:
                left += self.leftovers(child)
            else:
                left.append(Left(f"{self.run_dir.name}/{child}", self.failed.get(child, NOT_OURS)))
        return left

    def finish_run_dir(self, left: list[Left]) -> None:
        """Removes the manifest (only when nothing of ckptqual's remains) and the run directory if empty."""
        if self.errors:
            return  # keep the manifest, so that `ckptqual clean` can finish the job later
        self.unlink_temporaries(_ROOT, RUN_MARKER)
        self.unlink(PurePosixPath(RUN_MARKER))
        if left or self.errors or self.dry_run:
            return
        try:
            self.run_dir.rmdir()
        except OSError as error:
            self.fail("rmdir", _ROOT, error)


def _is_manifest_name(name: str) -> bool:
    return name == RUN_MARKER or name.startswith(f"{RUN_MARKER}{_TEMP_INFIX}")


def _scope(run_dir: Path, only: Path | None) -> PurePosixPath:
    """`only` relative to the run directory (ValueError when outside it)."""
    if only is None:
        return _ROOT
    return PurePosixPath(Path(os.path.abspath(run_dir / only)).relative_to(run_dir))


def remove_owned(run_dir: Path, only: Path | None = None, dry_run: bool = False) -> Removal:
    """Removes exactly the files the run directory's manifest declares (in every matching directory, or only
    in `only`), then the directories they imply if empty, then (without `only`) the manifest and the run
    directory if empty. Never removes anything else, never follows a symlink; dry_run only counts."""
    run_dir = Path(os.path.abspath(run_dir))
    nothing = Removal(str(run_dir), dry_run=dry_run)
    try:
        scope = _scope(run_dir, only)
    except ValueError:
        return replace(nothing, errors=(f"remove {only}: not inside the run directory {run_dir}; nothing removed",))
    try:
        root_fd = os.open(run_dir, _DIR_FLAGS)
    except OSError as error:
        return _unreadable(nothing, error)
    remover = _Remover(run_dir, root_fd, scope, dry_run)
    try:
        try:
            groups = _parse_groups(_load_manifest(root_fd))
        except (OSError, ValueError) as error:
            return _unreadable(nothing, error)
        for group in groups:
            remover.remove_group(group)
        remover.remove_dirs()
        left = remover.leftovers(scope)
        if only is None:
            remover.finish_run_dir(left)
    finally:
        remover.close()
        os.close(root_fd)
    return Removal(str(run_dir), remover.files, remover.bytes, tuple(left), tuple(remover.errors), dry_run)


def _unreadable(nothing: Removal, error: Exception) -> Removal:
    """The Removal of a directory without a manifest this version reads: nothing removed, all of it left."""
    run_dir = Path(nothing.run_dir)
    path = run_dir / RUN_MARKER
    line = _os_error_line("read", path, error) if isinstance(error, OSError) else f"read {path}: {error}"
    why = f"{line}; nothing removed"
    return replace(nothing, left=(Left(run_dir.name, "no readable ckptqual manifest"),), errors=(why,))


# ---- the target: checks, opening, cleanup ---------------------------------------------------------------------


def _is_run_dir(entry: Path) -> bool:
    """A directory ckptqual marked as a run directory (never a symlink to one)."""
    return (
        entry.name.startswith(RUN_PREFIX)
        and entry.is_dir()
        and not entry.is_symlink()
        and (entry / RUN_MARKER).is_file()
    )


def _is_read_only(path: Path) -> bool:
    return bool(os.statvfs(path).f_flag & os.ST_RDONLY)


def _usable_problem(path: Path, writing: bool = True) -> str | None:
    """Why `path` can be no target at all (missing, not a directory, a system directory, not writable)."""
    if not path.exists():
        return f"target {path} does not exist; create and mount it first"
    if not path.is_dir():
        return f"target {path} is not a directory"
    real = path.resolve()
    if str(real) in _SYSTEM_DIRS:
        return f"target {real} is a system directory; mount the drive under test and point --target at it"
    if writing and _is_read_only(real):
        mount = _mount_of(real).get("mount_point", "unknown")
        return f"target {real} is on a read-only filesystem (mounted at {mount}); remount it read-write"
    if writing and not os.access(real, os.W_OK | os.X_OK):
        return f"target {real} is not writable by this user"
    return None


def check_target(path: Path) -> list[str]:
    """Why `path` cannot be a target (empty list: it can). Reads only; a run's leftovers are accepted."""
    problem = _unlocked_problem(path)
    if problem is not None:
        return [problem]
    real = path.resolve()
    foreign = _foreign_entries(real)
    if foreign and (holder := _live_holder(real)) is not None:
        return [_in_use_message(real, holder)]  # a run started meanwhile: its directory is not marked yet
    return [_foreign_message(real, foreign)] if foreign else []


def _unlocked_problem(path: Path) -> str | None:
    """Why `path` can be no target at all, or the run that holds it now."""
    problem = _usable_problem(path)
    if problem is not None:
        return problem
    holder = _live_holder(path.resolve())
    return None if holder is None else _in_use_message(path.resolve(), holder)


def _foreign_entries(target: Path) -> list[str]:
    """The names in `target` that are not ckptqual's."""
    ours = {TARGET_MARKER, LOCK_FILE} | _TOLERATED
    return sorted(entry.name for entry in target.iterdir() if entry.name not in ours and not _is_run_dir(entry))


def _foreign_message(target: Path, foreign: Sequence[str]) -> str:
    shown = ", ".join(foreign[:5]) + (" ..." if len(foreign) > 5 else "")
    return (
        f"target {target} holds {len(foreign)} entr{'y' if len(foreign) == 1 else 'ies'} ckptqual did not "
        f"create ({shown}); give an empty directory (nothing will be deleted here)"
    )


@dataclass
class Target:
    """A validated, locked target and the run directory the suite owns inside it."""

    path: Path
    run_dir: Path
    created_target: bool
    created_marker: bool
    keep: bool = False
    lock: _Lock | None = field(default=None, repr=False)
    manifest: dict[str, Any] = field(default_factory=dict, repr=False)
    removal: Removal | None = field(default=None, init=False)
    closed: bool = field(default=False, init=False)

    @property
    def removed(self) -> bool:
        """Whether cleanup removed everything the run wrote (never true while anything is left)."""
        return self.removal is not None and self.removal.complete

    def free_bytes(self) -> int:
        return shutil.disk_usage(self.path).free

    def capacity_bytes(self) -> int:
        return shutil.disk_usage(self.path).total

    def declare(self, pattern: str, files: Iterable[str], listed: bool = False) -> None:
        """Records, before they are written, the files (relative to each directory matching the glob `pattern`,
        itself relative to the run directory) that the run writes; listed: directories name more files in
        their `.ckptqual-files` (see write_file_list). Rewrites the manifest atomically."""
        if self.closed:
            raise TargetError(f"declare {pattern!r}: the run in {self.run_dir} was already cleaned up")
        pattern = _relative(pattern, "pattern", root_ok=True)
        names = [_relative(name, "file") for name in files]
        groups = self.manifest["groups"]
        group = next((group for group in groups if group["pattern"] == pattern), None)
        if group is None:
            group = {"pattern": pattern, "files": [], "listed": False}
            groups.append(group)
        group["files"] = list(dict.fromkeys([*group["files"], *names]))
        group["listed"] = group["listed"] or listed
        self._save_manifest()

    def _save_manifest(self) -> None:
        try:
            _write_json_atomically(self.run_dir, RUN_MARKER, self.manifest)
        except OSError as error:
            raise _failure("write", self.run_dir / RUN_MARKER, error) from error

    def cleanup(self, ops: TargetOpsRunner | None = None) -> Removal | None:
        """Removes what the run recorded as written (unless kept), releases the target, removes the target marker
        and a temporary target if this run made them; returns and keeps the Removal (`self.removal`). With `ops`,
        each change to the drive runs through `ops.call` (e.g. in a helper process with a deadline); whatever it
        raises propagates after the lock is dropped."""
        if self.closed:
            return self.removal
        self.closed = True
        call = ops.call if ops is not None else _call_here
        errors: list[str] = []
        try:
            if self.keep:
                self.removal = call(f"marking {self.run_dir} kept", _mark_kept, self.run_dir, self.manifest)
            else:
                self.removal = call(f"removing what the run wrote in {self.run_dir}", remove_owned, self.run_dir)
            # under the lock: another run may start as soon as it is released, and may need the marker
            if self.created_marker and not self.keep:
                errors.append(call("removing the target marker", _remove_marker, self.path))
            if self.lock is not None:
                errors.append(call("releasing the target", _unlink_lock_file, self.lock.path))
        finally:
            if self.lock is not None:
                self.lock.close()
        if self.created_target and not self.keep:
            errors.append(call("removing the temporary target", _remove_temporary_target, self.path))
        if any(errors) and self.removal is not None:
            self.removal = replace(self.removal, errors=(*self.removal.errors, *filter(None, errors)))
        return self.removal

    def abandon(self) -> None:
        """Gives the target up without touching the drive (it stopped responding): drops the lock and leaves
        every file, the lock file included, for `ckptqual clean`."""
        self.closed = True
        if self.lock is not None:
            self.lock.close()


class TargetOpsRunner(Protocol):
    """Runs `function(*args)` somewhere (e.g. a helper process with a deadline) and returns its result."""

    def call(self, what: str, function: Callable[..., Any], *args: Any) -> Any: ...


def _call_here(what: str, function: Callable[..., Any], *args: Any) -> Any:
    """The plain runner: `function(*args)` in this process."""
    return function(*args)


def _mark_kept(run_dir: Path, manifest: dict[str, Any]) -> Removal:
    """Marks a run directory as kept (so leftovers name it so) and reports it as left."""
    kept = Removal(str(run_dir), left=(Left(run_dir.name, KEPT),))
    try:
        _write_json_atomically(run_dir, RUN_MARKER, {**manifest, "kept": True})
    except OSError as error:
        return replace(kept, errors=(_os_error_line("write", run_dir / RUN_MARKER, error),))
    return kept


def _remove_temporary_target(path: Path) -> str | None:
    """Removes the temporary target this process made, if empty; an error as one line, else None."""
    try:
        path.rmdir()
    except OSError as error:
        if error.errno != errno.ENOTEMPTY:  # what is left in it is reported already
            return _os_error_line("rmdir", path, error)
    return None


def _new_run_name() -> str:
    return f"{RUN_PREFIX}{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{secrets.token_hex(3)}"


def _ensure_marker(target: Path) -> bool:
    """Creates the target marker unless present; whether this call created it."""
    marker = target / TARGET_MARKER
    if os.path.lexists(marker):
        return False
    text = b"This directory is a ckptqual target; ckptqual removes only what it creates here.\n"
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as error:
        raise _failure("create", marker, error) from error
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(text)
    except OSError as error:
        _unlink_quietly(marker)
        raise _failure("write", marker, error) from error
    return True


def _make_run_dir(target: Path, name: str, holder: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    """Creates the run directory with its manifest, or nothing: TargetError naming the step that failed."""
    run_dir = target / name
    try:
        os.mkdir(run_dir, 0o700)
    except OSError as error:
        raise _failure("create", run_dir, error) from error
    manifest = _new_manifest(holder)
    try:
        _write_json_atomically(run_dir, RUN_MARKER, manifest)
    except OSError as error:
        failure = _failure("create", run_dir / RUN_MARKER, error)
        try:
            run_dir.rmdir()
        except OSError as rmdir_error:
            raise TargetError(f"{failure}; {_os_error_line('rmdir', run_dir, rmdir_error)}") from error
        raise failure from error
    return run_dir, manifest


def open_target(path: Path | None, keep: bool = False) -> Target:
    """Validates and locks the target (or makes a temporary one) and creates this run's own directory in it."""
    with ExitStack() as undo:
        created_target = path is None
        if path is None:
            path = Path(tempfile.mkdtemp(prefix="ckptqual-target-"))
            undo.callback(_rmdir_quietly, path)
        if (problem := _unlocked_problem(path)) is not None:
            raise TargetError(problem)
        path = path.resolve()
        foreign = _foreign_entries(path)
        if any(not name.startswith(RUN_PREFIX) for name in foreign):  # refused before anything is written
            raise TargetError(_foreign_message(path, foreign))
        name = _new_run_name()
        lock = _acquire_lock(path, _holder_record(name, "ckptqual run"))
        undo.callback(lock.release)
        # An unmarked run directory may be another run's, being made or removed; under the lock it is not.
        if foreign := _foreign_entries(path):
            raise TargetError(_foreign_message(path, foreign))
        created_marker = _ensure_marker(path)
        if created_marker:
            undo.callback(_unlink_quietly, path / TARGET_MARKER)
        run_dir, manifest = _make_run_dir(path, name, lock.holder)
        undo.pop_all()
    return Target(path, run_dir, created_target, created_marker, keep, lock, manifest)


# ---- leftovers of runs that did not finish, and `ckptqual clean` -----------------------------------------------


@dataclass(frozen=True)
class LeftoverRun:
    """A marked run directory no live run holds: a run that died (or was kept), with what it left."""

    path: Path
    size_bytes: int  # allocated on disk (st_blocks), everything inside
    age_s: float
    pid: int | None
    host: str | None
    kept: bool


def _allocated_bytes(directory: Path) -> int:
    """Space the files below `directory` take on disk, without following symlinks."""
    total = 0
    for parent, _, files in os.walk(directory):
        for name in files:
            with suppress(OSError):
                total += os.lstat(os.path.join(parent, name)).st_blocks * 512
    return total


def _leftover(run_dir: Path, now_s: float) -> LeftoverRun:
    try:
        manifest = _read_manifest(run_dir)
    except (OSError, ValueError):
        manifest = {}
    started_s = manifest.get("started_unix") or (run_dir / RUN_MARKER).stat().st_mtime
    return LeftoverRun(
        run_dir,
        _allocated_bytes(run_dir),
        max(0.0, now_s - started_s),
        manifest.get("pid"),
        manifest.get("host"),
        bool(manifest.get("kept", False)),
    )


def leftover_runs(target: Path) -> list[LeftoverRun]:
    """The marked run directories in `target` that no live run holds, oldest name first."""
    target = target.resolve()
    live = (_live_holder(target) or {}).get("run_dir")
    now_s = time.time()
    return [_leftover(entry, now_s) for entry in sorted(target.iterdir()) if entry.name != live and _is_run_dir(entry)]


def describe_leftovers(target: Path) -> str | None:
    """One line naming what earlier runs left on `target` and the command that removes it; None if nothing."""
    runs = leftover_runs(target)
    if not runs:
        return None
    shown = "; ".join(
        f"{run.path.name}, {format_bytes(run.size_bytes)}, {format_age(run.age_s)} old" for run in runs[:3]
    )
    more = "; ..." if len(runs) > 3 else ""
    plural = len(runs) > 1
    return (
        f"the target holds {format_bytes(sum(run.size_bytes for run in runs))} left by {len(runs)} earlier "
        f"run{'s' if plural else ''} {_how_runs_ended(runs)} ({shown}{more}); remove {'them' if plural else 'it'} "
        f"with: ckptqual clean {target.resolve()}"
    )


def _how_runs_ended(runs: Sequence[LeftoverRun]) -> str:
    kept = sum(run.kept for run in runs)
    if kept == 0:
        return "that did not finish"
    if kept == len(runs):
        return KEPT
    return f"({len(runs) - kept} did not finish, {kept} {KEPT})"


@dataclass(frozen=True)
class Cleaning:
    """What `clean_target` did (or would do, in a dry run) to a target."""

    target: Path
    runs: tuple[tuple[LeftoverRun, Removal], ...]
    stale_lock: dict[str, Any] | None  # the record of a lock file no live run held, removed
    marker_removed: bool
    errors: tuple[str, ...]
    dry_run: bool

    @property
    def complete(self) -> bool:
        """Everything of ckptqual's is gone (would be) and nothing was left."""
        return not self.errors and all(removal.complete for _, removal in self.runs)


def _clean_problem(path: Path, dry_run: bool) -> str | None:
    """Why `ckptqual clean` refuses `path`."""
    problem = _usable_problem(path, writing=not dry_run)
    if problem is not None:
        return problem
    real = path.resolve()
    holder = _live_holder(real)
    if holder is not None:
        return _in_use_message(real, holder)
    ours = os.path.lexists(real / TARGET_MARKER) or os.path.lexists(real / LOCK_FILE)
    if not ours and not any(_is_run_dir(entry) for entry in real.iterdir()):
        return (
            f"target {real} holds nothing of ckptqual's (no {TARGET_MARKER}, {LOCK_FILE} or marked {RUN_PREFIX}* "
            "directory); give a directory ckptqual ran on"
        )
    return None


def clean_target(path: Path, dry_run: bool = False) -> Cleaning:
    """Removes (dry_run: only counts) every leftover run's recorded files, a stale lock file and, when nothing of
    ckptqual's is left, the target marker; never an unmarked directory or a foreign file. Holds the target's
    lock meanwhile. TargetError when `path` is no ckptqual target or a live run holds it."""
    problem = _clean_problem(path, dry_run)
    if problem is not None:
        raise TargetError(problem)
    target = path.resolve()
    stale = _stale_holder(target)
    had_marker = os.path.lexists(target / TARGET_MARKER)
    if dry_run:
        runs, marker_error, release_error = _remove_leftovers(target, dry_run=True), None, None
    else:
        lock = _acquire_lock(target, _holder_record(None, "ckptqual clean"))
        try:
            runs = _remove_leftovers(target, dry_run=False)
            marker_error = None if _run_errors(runs) or not had_marker else _remove_marker(target)
        finally:
            release_error = lock.release()  # which removes the lock file, stale or not
    errors = (*_run_errors(runs), *(error for error in (marker_error, release_error) if error))
    marker_gone = not os.path.lexists(target / TARGET_MARKER) or (dry_run and not errors)
    return Cleaning(target, runs, stale, had_marker and marker_gone, errors, dry_run)


def _run_errors(runs: Sequence[tuple[LeftoverRun, Removal]]) -> tuple[str, ...]:
    return tuple(error for _, removal in runs for error in removal.errors)


def _remove_leftovers(target: Path, dry_run: bool) -> tuple[tuple[LeftoverRun, Removal], ...]:
    return tuple((run, remove_owned(run.path, dry_run=dry_run)) for run in leftover_runs(target))


def _remove_marker(target: Path) -> str | None:
    """Removes the target marker unless a marked run directory remains; an error as one line, else None."""
    marker = target / TARGET_MARKER
    try:
        if not any(_is_run_dir(entry) for entry in target.iterdir()):
            marker.unlink(missing_ok=True)
    except OSError as error:
        return _os_error_line("unlink", marker, error)
    return None


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


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m ckptqual.host.target remove RUN_DIR [--only DIR]`: prints the Removal as JSON; 0 when complete."""
    parser = argparse.ArgumentParser(prog="python -m ckptqual.host.target", description=main.__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    remove = commands.add_parser("remove", help="remove what a run directory's manifest declares, nothing else")
    remove.add_argument("run_dir", type=Path, help="a ckptqual-run-* directory")
    remove.add_argument("--only", type=Path, help="only this directory of the run (e.g. one checkpoint's)")
    args = parser.parse_args(argv)
    removal = remove_owned(args.run_dir, args.only)
    print(json.dumps(removal.to_dict()))
    return 0 if removal.complete else 1


if __name__ == "__main__":
    sys.exit(main())
