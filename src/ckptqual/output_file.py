"""The files the suite writes outside any target (results JSON, JUnit XML, report, secret file): what stands at an
output's path, and a write that never follows a link nor replaces what is not a regular file of this user."""

from __future__ import annotations

import errno
import os
import secrets
import stat
from contextlib import suppress
from pathlib import Path

_KINDS = (
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
)


class UnsafeOutput(OSError):
    """An output's path holds something the suite must not replace (a link, a device, a FIFO, another's file)."""


def entry_problem(path: Path, directory_ok: bool = False) -> str | None:
    """Why the suite must not write at `path`: something there other than a regular file this user owns (or a
    directory, where `directory_ok`); None when nothing is there or it may be replaced."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as error:
        return f"cannot be examined ({error.strerror})"
    problem = _problem(info, directory_ok)
    if problem is not None and stat.S_ISLNK(info.st_mode):
        with suppress(OSError):
            return f"{problem} to {os.readlink(path)}"
    return problem


def write_file(path: Path, data: bytes, mode: int = 0o666, sync: bool = True) -> None:
    """Writes `path` whole or not at all: a new file beside it (O_CREAT|O_EXCL|O_NOFOLLOW), fsynced (unless not
    `sync`), renamed over nothing or over a regular file of this user only. Raises UnsafeOutput where anything else
    stands there."""
    directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    temporary = f".{path.name}.{secrets.token_hex(4)}.tmp"
    try:
        fd = os.open(
            temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=directory
        )
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(data)
                file.flush()
                if sync:
                    os.fsync(file.fileno())
            if (problem := _replaceable(directory, path.name)) is not None:
                raise UnsafeOutput(errno.EEXIST, f"{problem}; left alone, nothing written", str(path))
            os.replace(temporary, path.name, src_dir_fd=directory, dst_dir_fd=directory)
        except BaseException:
            with suppress(OSError):
                os.unlink(temporary, dir_fd=directory)
            raise
    finally:
        os.close(directory)


def _replaceable(directory: int, name: str) -> str | None:
    """Why the entry `name` of the directory open as `directory` must not be renamed over; None when it may."""
    try:
        return _problem(os.stat(name, dir_fd=directory, follow_symlinks=False))
    except FileNotFoundError:
        return None


def _problem(info: os.stat_result, directory_ok: bool = False) -> str | None:
    if stat.S_ISREG(info.st_mode) or (directory_ok and stat.S_ISDIR(info.st_mode)):
        if info.st_uid != os.geteuid():
            return f"is owned by uid {info.st_uid}, not by this user (uid {os.geteuid()})"
        return None
    return "is " + next((word for test, word in _KINDS if test(info.st_mode)), "not a regular file")
