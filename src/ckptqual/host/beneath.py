"""Entries under a run directory, reached from one handle of it without following a symlink.

Every step of a path is an openat(2) with O_NOFOLLOW from the directory above it, starting at a handle of the run
directory opened once, so that an entry planted as a symlink (or a directory swapped for one) is refused with
PlantedEntry, never followed: nothing outside the run directory is written, read or removed through it.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from ckptqual.resources import kind_of

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class PlantedEntry(OSError):
    """An entry under the run directory that is not what the suite made there: a symlink, or a file of another kind.
    It is left alone; `what` says what it is (for a symlink, what it points to)."""

    def __init__(self, path: Path, what: str) -> None:
        super().__init__(errno.ELOOP, f"{path} {what}: an entry planted in the run directory, left alone", str(path))
        self.path, self.what = path, what

    def __str__(self) -> str:
        return str(self.strerror)

    def __reduce__(self) -> tuple[type, tuple[Path, str]]:
        return type(self), (self.path, self.what)


def what_is(parent_fd: int, name: str) -> str:
    """What the entry `name` of the directory `parent_fd` is, in words ("is a symlink to /outside")."""
    try:
        mode = os.stat(name, dir_fd=parent_fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return "vanished while it was opened"
    if stat.S_ISLNK(mode):
        return f"is a symlink to {os.readlink(name, dir_fd=parent_fd)}"
    return f"is {kind_of(mode)}"


class RunTree:
    """A handle on one run directory (`root`, itself not a symlink): opens, makes and removes the entries under it,
    each step without following a symlink. `identity` (st_dev, st_ino) proves it is the directory the run made."""

    def __init__(self, root: Path, identity: tuple[int, int] | None = None) -> None:
        try:
            fd = os.open(root, _DIRECTORY)
        except OSError as error:
            if error.errno in (errno.ELOOP, errno.ENOTDIR):
                raise PlantedEntry(root, _what_path_is(root)) from None
            raise
        found = os.fstat(fd)
        if identity is not None and (found.st_dev, found.st_ino) != identity:
            os.close(fd)
            raise PlantedEntry(root, "is not the run directory this run made (it was replaced)")
        self.root, self.fd = root, fd

    @property
    def identity(self) -> tuple[int, int]:
        """(st_dev, st_ino) of the run directory, for a process that opens it again."""
        found = os.fstat(self.fd)
        return found.st_dev, found.st_ino

    @property
    def reference(self) -> RunRoot:
        """How another process (or a later step) opens this same run directory again."""
        return RunRoot(str(self.root), self.identity)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> RunTree:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def parts(self, path: Path) -> list[str]:
        """The names from the run directory down to `path`, which must lie under it (lexically, without `..`)."""
        relative = Path(path).relative_to(self.root).parts
        if any(part in ("..", ".") for part in relative):
            raise ValueError(f"{path}: a path under the run directory may not hold '.' or '..'")
        return list(relative)

    @contextmanager
    def directory(self, path: Path, create: bool = False) -> Iterator[int]:
        """A handle of the directory `path` (the run directory itself included), made where `create` and missing."""
        fd = os.dup(self.fd)
        reached = self.root
        try:
            for name in self.parts(path):
                reached = reached / name
                above, fd = fd, -1
                try:
                    fd = _step(above, name, reached, create)
                finally:
                    os.close(above)
            yield fd
        finally:
            if fd >= 0:
                os.close(fd)

    def open(self, path: Path, flags: int, mode: int = 0o644) -> int:
        """A descriptor of the file `path` opened with `flags` (its directories made first under O_CREAT); a symlink or
        a non-regular file in its place, or any entry where O_EXCL makes a new file, raises PlantedEntry."""
        with self.directory(path.parent, create=bool(flags & os.O_CREAT)) as parent:
            try:
                fd = os.open(path.name, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode, dir_fd=parent)
            except OSError as error:
                if error.errno == errno.EEXIST and flags & os.O_EXCL and _is_directory(parent, path.name):
                    raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path)) from None
                if error.errno == errno.ELOOP or (error.errno == errno.EEXIST and flags & os.O_EXCL):
                    raise PlantedEntry(path, what_is(parent, path.name)) from None
                raise OSError(error.errno, error.strerror, str(path)) from None  # named in full, not by its last part
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or device planted as a file: never read or written
                os.close(fd)
                raise PlantedEntry(path, what_is(parent, path.name))
            if not flags & os.O_NONBLOCK:
                os.set_blocking(fd, True)
            return fd

    def makedirs(self, path: Path) -> None:
        """Makes the directory `path` and those above it under the run directory."""
        with self.directory(path, create=True):
            pass

    def unlink(self, path: Path) -> None:
        """Removes the file `path` (a symlink in its place is left and raises PlantedEntry)."""
        with self.directory(path.parent) as parent:
            if _is_link(parent, path.name):
                raise PlantedEntry(path, what_is(parent, path.name))
            os.unlink(path.name, dir_fd=parent)

    def rmdir(self, path: Path) -> None:
        """Removes the empty directory `path`."""
        with self.directory(path.parent) as parent:
            os.rmdir(path.name, dir_fd=parent)

    def lstat(self, path: Path) -> os.stat_result:
        """The entry `path` itself, a symlink not followed."""
        with self.directory(path.parent) as parent:
            return os.stat(path.name, dir_fd=parent, follow_symlinks=False)

    def remove_self(self) -> None:
        """Removes the run directory itself (empty by now) by its name in the directory above, only while that name
        is still this directory: one swapped in its place raises PlantedEntry and is left."""
        parent = os.open(self.root.parent, _DIRECTORY & ~os.O_NOFOLLOW)
        try:
            found = os.stat(self.root.name, dir_fd=parent, follow_symlinks=False)
            if (found.st_dev, found.st_ino) != self.identity:
                raise PlantedEntry(self.root, "is not the run directory this run made (it was replaced)")
            os.rmdir(self.root.name, dir_fd=parent)
        finally:
            os.close(parent)


@dataclass(frozen=True)
class RunRoot:
    """A run directory as plain data that another process opens as a RunTree: its path and, where known on this host,
    its (st_dev, st_ino), so that a directory swapped in its place is refused."""

    path: str
    identity: tuple[int, int] | None = None

    @classmethod
    def of(cls, path: Path) -> RunRoot:
        """The directory `path` as it is now, its identity recorded."""
        with RunTree(path) as tree:
            return tree.reference

    def open(self) -> RunTree:
        return RunTree(Path(self.path), (self.identity[0], self.identity[1]) if self.identity else None)


def _step(fd: int, name: str, reached: Path, create: bool) -> int:
    """The handle of the directory `name` in `fd`, made first where `create` and missing; an error names `reached`."""
    try:
        if create:
            with suppress(FileExistsError):
                os.mkdir(name, 0o700, dir_fd=fd)
        return os.open(name, _DIRECTORY, dir_fd=fd)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR):
            raise PlantedEntry(reached, what_is(fd, name)) from None
        raise OSError(error.errno, error.strerror, str(reached)) from None


def _is_directory(parent_fd: int, name: str) -> bool:
    try:
        return stat.S_ISDIR(os.stat(name, dir_fd=parent_fd, follow_symlinks=False).st_mode)
    except FileNotFoundError:
        return False


def _is_link(parent_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=parent_fd, follow_symlinks=False).st_mode)
    except FileNotFoundError:
        return False


def _what_path_is(path: Path) -> str:
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return what_is(fd, path.name)
    finally:
        os.close(fd)
