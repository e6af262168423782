"""One run (or one `ckptqual clean`) per target: an exclusive POSIX lock on the target's `.ckptqual-lock`, which
records its holder. A process holding it must not open that file other than through this module: closing any
descriptor of a file drops every POSIX lock the process holds on it.

Nested targets: runs on a directory and one inside it would measure each other. A run first takes its own target's
lock, then probes (never creates) the lock file of every directory above its target and of every directory below
it, and gives its lock up if any is held; "above" also through every other mount of the target's filesystem that
shows the target (host.aliases), so that a bind mount cannot share a held target. Of two runs starting at once on
nested targets, the later to take its own lock sees the other's: at most one goes on (both may be refused; neither
ever runs beside the other)."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import stat
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptqual.host.aliases import aliases
from ckptqual.host.beneath import what_is
from ckptqual.host.guard import LOCK_FILE, TargetError, error_line, failure

_FLOCK = "hhqqi4x"  # struct flock on 64-bit Linux: type, whence, start, len, pid
_TRIES = 100  # the lock file replaced under us this often (holders leaving, others arriving): give up


@dataclass
class Lock:
    """An exclusive POSIX lock on a target's lock file, held through an open descriptor."""

    path: Path
    fd: int
    key: tuple[int, int]  # the target directory's (st_dev, st_ino)
    holder: dict[str, Any]

    def release(self) -> str | None:
        """Unlinks the lock file while still holding the lock, then closes it; an error as one line, else None."""
        try:
            return unlink_lock_file(self.path) if self.fd >= 0 else None
        finally:
            self.close()

    def close(self) -> None:
        """Drops the lock; a lock file still there is stale from now on (taken over by the next run)."""
        if self.fd >= 0:
            _HELD.pop(self.key, None)
            os.close(self.fd)
            self.fd = -1


_HELD: dict[tuple[int, int], Lock] = {}  # POSIX locks never conflict within a process: this one's, by target


def unlink_lock_file(path: Path) -> str | None:
    """Unlinks a lock file (its holder still holding the lock); an error as one line, else None."""
    try:
        path.unlink(missing_ok=True)
    except OSError as error:
        return error_line("unlink", path, error)
    return None


def holder_record(run_dir: str | None, command: str) -> dict[str, Any]:
    """Who holds a lock: PID, host, start time, run directory (None for `ckptqual clean`)."""
    now_s = time.time()
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now_s))
    who = dict(pid=os.getpid(), host=socket.gethostname(), started=started, started_unix=now_s)
    return {**who, "run_dir": run_dir, "command": command}


def acquire(target: Path, holder: dict[str, Any]) -> Lock:
    """Locks `target` for this process at once, or raises TargetError naming the holder."""
    key = _key(target)
    if key in _HELD:
        raise TargetError(in_use_message(target, _HELD[key].holder))
    path = target / LOCK_FILE
    for _ in range(_TRIES):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise TargetError(planted_message(target)) from None
            raise failure("create", path, error) from error
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise TargetError(planted_message(target))
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            holder_now = _read_holder(fd)
            os.close(fd)
            if error.errno in (errno.EACCES, errno.EAGAIN):
                raise TargetError(in_use_message(target, holder_now)) from None
            raise failure("lock", path, error) from error
        if _names(path, fd):
            return _alone_in_tree(_record(Lock(path, fd, key, holder)), target)
        os.close(fd)  # the holder unlinked it between our open and our lock: that lock guards nothing
    raise TargetError(f"lock {path}: the file keeps being replaced; stop whatever removes it and try again")


def _record(lock: Lock) -> Lock:
    """Writes the holder into the lock file just locked."""
    try:
        os.ftruncate(lock.fd, 0)
        os.pwrite(lock.fd, json.dumps(lock.holder).encode(), 0)
    except OSError as error:
        lock.release()
        raise failure("write", lock.path, error) from error
    _HELD[lock.key] = lock
    return lock


def _alone_in_tree(lock: Lock, target: Path) -> Lock:
    """The lock, once no run holds a target above or below `target`; else released, and TargetError names that run."""
    if (problem := nested_problem(target)) is not None:
        lock.release()
        raise TargetError(problem)
    return lock


def nested_problem(target: Path) -> str | None:
    """The run that holds a target above or below `target`, in one line; None when there is none. Above: by path,
    and through every other mount of its filesystem that shows it (a bind mount shares its directories). Reads only."""
    real = target.resolve()
    for above in real.parents:
        if (holder := live_holder(above)) is not None:
            return f"target {real} is inside target {above}, {_nested_fix(holder)}"
    for alias in aliases(real):
        for above in alias.parents:
            if (holder := live_holder(above)) is not None:
                return f"target {real} is {alias}, inside target {above} (a bind mount), {_nested_fix(holder)}"
    for below in _lock_files_below(real):
        if (holder := live_holder(below)) is not None:
            return f"target {real} holds target {below}, {_nested_fix(holder)}"
    return None


def _nested_fix(holder: dict[str, Any]) -> str:
    return (
        f"which another ckptqual run is using ({describe_holder(holder)}); runs on nested directories would measure "
        "each other: wait for it to finish, or give a directory outside it"
    )


def _lock_files_below(target: Path) -> Iterator[Path]:
    """Every directory under `target` (symlinks not followed) that holds a lock file."""
    for directory, _, files in os.walk(target, followlinks=False):
        if LOCK_FILE in files and directory != str(target):
            yield Path(directory)


def planted_message(target: Path) -> str:
    """'target /mnt/x: /mnt/x/.ckptqual-lock is a symlink to /victim: ...' for a lock file ckptqual did not make."""
    fd = os.open(target, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        what = what_is(fd, LOCK_FILE)
    finally:
        os.close(fd)
    return (
        f"target {target}: {target / LOCK_FILE} {what}: an entry ckptqual did not create, left alone; remove it, "
        "or give an empty directory"
    )


def state(target: Path) -> tuple[bool, dict[str, Any]] | None:
    """(whether a live run holds it, its holder record) of `target`'s lock file; None when it has none."""
    try:
        key = _key(target)
    except OSError:
        return None
    if key in _HELD:
        return True, _HELD[key].holder
    path = target / LOCK_FILE
    for _ in range(_TRIES):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or device in its place holds no lock
            os.close(fd)
            return None
        try:
            if (locked := _is_locked(fd)) or _names(path, fd):
                return locked, _read_holder(fd)
        finally:
            os.close(fd)
    return True, {}  # the file keeps being replaced: runs are coming and going


def live_holder(target: Path) -> dict[str, Any] | None:
    """The record of the run holding `target`'s lock ({} if not yet written); None when nobody holds it."""
    found = state(target)
    return found[1] if found is not None and found[0] else None


def _key(directory: Path) -> tuple[int, int]:
    info = os.stat(directory)
    return info.st_dev, info.st_ino


def _names(path: Path, fd: int) -> bool:
    """Whether `path` still names the file open as `fd`."""
    try:
        named = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino)


def _read_holder(fd: int) -> dict[str, Any]:
    """The holder record in an open lock file ({} when empty, being written or unreadable)."""
    try:
        record = json.loads(os.pread(fd, 1 << 16, 0))
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _is_locked(fd: int) -> bool:
    """Whether another process holds a lock on the open file (F_GETLK works on a read-only descriptor)."""
    query = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
    try:
        return struct.unpack(_FLOCK, fcntl.fcntl(fd, fcntl.F_GETLK, query))[0] != fcntl.F_UNLCK
    except OSError:
        return False  # cannot tell (e.g. no lock daemon): taking the lock will say


def describe_holder(holder: dict[str, Any]) -> str:
    """'PID 1234 on host h, since 2026-11-30 01:02:03, run directory ckptqual-run-...'."""
    parts = []
    if "pid" in holder:
        parts.append(f"PID {holder['pid']} on host {holder.get('host', 'unknown')}")
    if "started" in holder:
        parts.append(f"since {holder['started']}")
    if holder.get("run_dir") or holder.get("command"):
        parts.append(f"run directory {holder['run_dir']}" if holder.get("run_dir") else str(holder["command"]))
    return ", ".join(parts) or "its holder is not recorded yet"


def in_use_message(target: Path, holder: dict[str, Any]) -> str:
    holder_text = describe_holder(holder)
    return f"target {target} is in use by another ckptqual run ({holder_text}); wait for it to finish, or stop it"
