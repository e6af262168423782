"""Removal of exactly what a run directory's manifest declares, in one walk down the run directory from one RunTree
handle, through directory descriptors that never follow a symlink. A directory is the run's when its path leads to a
declared directory or file; anything else is left whole and reported, a planted symlink (or FIFO, device) as an error
naming what it is. The manifest goes last, and stays while anything is left, so that `ckptqual clean` finds the run."""

from __future__ import annotations

import errno
import fnmatch
import glob
import os
import stat
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any

from ckptqual.host.beneath import PlantedEntry, RunTree, what_is
from ckptqual.host.guard import RUN_MARKER, error_line
from ckptqual.host.manifest import FILE_LIST, TEMP_INFIX, read_json, read_manifest, relative

NOT_OURS = "not created by ckptqual"
_ROOT = PurePosixPath()
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


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
    planted: tuple[str, ...] = ()  # one line each: a symlink, FIFO or device planted in the run directory, left alone
    dry_run: bool = False

    @property
    def complete(self) -> bool:
        """Everything in scope is gone (would be, in a dry run): nothing left, no error."""
        return not self.left and not self.errors

    @property
    def why(self) -> str | None:
        """Why the removal is not complete, in one line (its first error, else its first entry left); None if it is."""
        if self.errors:
            more = len(self.errors) - 1
            return self.errors[0] + (f" (and {more} more error{'s' * (more > 1)})" if more else "")
        if self.left:
            more = len(self.left) - 1
            return f"left {self.left[0].path}: {self.left[0].why}" + (f" (and {more} more)" if more else "")
        return None

    def to_dict(self) -> dict[str, Any]:
        listed = {"left": [*map(asdict, self.left)], "errors": [*self.errors], "planted": [*self.planted]}
        return {**asdict(self), "complete": self.complete, "why": self.why, **listed}


def _leads(parts: tuple[str, ...], pattern: tuple[str, ...]) -> bool:
    """Whether `parts` match the first parts of the glob `pattern` (all of it when as long)."""
    return len(parts) <= len(pattern) and all(map(fnmatch.fnmatchcase, parts, pattern))


def _within(path: PurePosixPath, scope: PurePosixPath) -> bool:
    return path == scope or scope in path.parents


def _read_error(path: Path, error: Exception) -> str:
    return error_line("read", path, error) if isinstance(error, OSError) else f"read {path}: {error}"


class _Sweep:
    """One removal pass down a run directory (or only the part of it in `scope`)."""

    def __init__(self, run_dir: Path, groups: list[dict[str, Any]], scope: PurePosixPath, dry_run: bool) -> None:
        self.run_dir, self.scope, self.dry_run = run_dir, scope, dry_run
        self.files: dict[tuple[str, ...], set[str]] = {}  # a directory glob, by parts -> the files declared in each
        self.listed = [PurePosixPath(group["pattern"]).parts for group in groups if group["listed"]]
        for group in groups:
            self.declare(PurePosixPath(group["pattern"]).parts, group["files"])
        self.left: list[Left] = []
        self.errors: list[str] = []
        self.planted_lines: list[str] = []
        self.removed_files = self.removed_bytes = 0

    def declare(self, directory: tuple[str, ...], files: Iterable[str]) -> None:
        self.files.setdefault(directory, set())
        for path in map(PurePosixPath, files):
            self.files.setdefault(directory + tuple(map(glob.escape, path.parent.parts)), set()).add(path.name)

    def fail(self, operation: str, rel: PurePosixPath, error: OSError) -> bool:
        """Notes that `rel` is left, and why; False (not gone)."""
        line = error_line(operation, self.run_dir / rel, error)
        return self.refuse(rel, line, line)

    def refuse(self, rel: PurePosixPath, error: str, why: str) -> bool:
        """Notes `rel` as left (`why`) with the one-line `error`; False (not gone)."""
        self.errors.append(error)
        self.left.append(Left(f"{self.run_dir.name}/{rel}", why))
        return False

    def planted(self, rel: PurePosixPath, parent_fd: int) -> bool:
        """Leaves the planted entry `rel` alone and reports it, naming what it is; False (not gone)."""
        planted = PlantedEntry(self.run_dir / rel, what_is(parent_fd, rel.name))
        self.planted_lines.append(str(planted))
        return self.refuse(rel, str(planted), f"{planted.what}: planted, left alone")

    def entries(self, rel: PurePosixPath, fd: int) -> list[os.DirEntry]:
        try:
            with os.scandir(fd) as found:
                return sorted(found, key=lambda entry: entry.name)
        except OSError as error:
            self.fail("list", rel, error)
            return []

    def sweep(self, rel: PurePosixPath, fd: int) -> bool:
        """Removes what the run declared below `rel`, and the run's directories emptied; whether `rel` is now empty
        (would be, in a dry run)."""
        if any(len(rel.parts) == len(parts) and _leads(rel.parts, parts) for parts in self.listed):
            self.read_file_list(rel, fd)
        keys = [parts for parts in self.files if len(parts) == len(rel.parts) and _leads(rel.parts, parts)]
        declared = set().union(*(self.files[parts] for parts in keys))
        # a directory's file list goes last: removal stopped part way (a frozen or failing drive) leaves what is left
        # still listed, for `ckptqual clean`
        entries = sorted(self.entries(rel, fd), key=lambda entry: entry.name == FILE_LIST)
        return all([self.sweep_entry(rel / entry.name, entry, fd, declared) for entry in entries])

    def read_file_list(self, rel: PurePosixPath, fd: int) -> None:
        """Declares the files a listed directory's file list names, and the list."""
        names = [FILE_LIST]
        try:
            names += [relative(name, "file") for name in read_json(FILE_LIST, fd)]
        except FileNotFoundError:
            pass
        except (OSError, ValueError, TypeError) as error:
            self.errors.append(_read_error(self.run_dir / rel / FILE_LIST, error))
        self.declare(tuple(map(glob.escape, rel.parts)), names)

    def sweep_entry(self, rel: PurePosixPath, entry: os.DirEntry, fd: int, declared: set[str]) -> bool:
        """Removes `rel` if the run declared it (sweeping the run's directories); whether it is gone."""
        if not (_within(rel, self.scope) or _within(self.scope, rel)) or _is_manifest(rel):
            return False
        if not (entry.is_dir(follow_symlinks=False) or entry.is_file(follow_symlinks=False)):
            return self.planted(rel, fd) if _within(rel, self.scope) else False
        if entry.is_dir(follow_symlinks=False) and any(_leads(rel.parts, parts) for parts in self.files):
            return self.sweep_dir(rel, fd)
        temporary = entry.name.startswith(FILE_LIST + TEMP_INFIX) and FILE_LIST in declared
        if entry.is_file(follow_symlinks=False) and (entry.name in declared or temporary):
            return self.unlink(rel, entry, fd)
        if _within(rel, self.scope):
            self.left.append(Left(f"{self.run_dir.name}/{rel}", NOT_OURS))
        return False

    def sweep_dir(self, rel: PurePosixPath, parent_fd: int) -> bool:
        """Sweeps the run's directory `rel`, then removes it if empty and in scope; whether it is gone."""
        try:
            fd = os.open(rel.name, _DIR_FLAGS, dir_fd=parent_fd)
        except OSError as error:
            if error.errno in (errno.ELOOP, errno.ENOTDIR):  # swapped for a symlink since it was listed
                return self.planted(rel, parent_fd)
            return error.errno == errno.ENOENT or self.fail("open", rel, error)
        try:
            if not (self.sweep(rel, fd) and _within(rel, self.scope)):
                return False
        finally:
            os.close(fd)
        try:
            if not self.dry_run:
                os.rmdir(rel.name, dir_fd=parent_fd)
        except FileNotFoundError:
            pass
        except OSError as error:
            return self.fail("rmdir", rel, error)
        return True

    def unlink(self, rel: PurePosixPath, entry: os.DirEntry, fd: int) -> bool:
        try:
            found = os.stat(entry.name, dir_fd=fd, follow_symlinks=False)
            if not stat.S_ISREG(found.st_mode):  # swapped since it was listed
                return self.planted(rel, fd)
            size_bytes = found.st_blocks * 512
            if not self.dry_run:
                os.unlink(entry.name, dir_fd=fd)
        except FileNotFoundError:
            return True  # already removed
        except OSError as error:
            return self.fail("unlink", rel, error)
        self.removed_files += 1
        self.removed_bytes += size_bytes
        return True

    def finish(self, tree: RunTree) -> None:
        """Removes the manifest's half-written copies, then the manifest and the run directory (now empty), unless
        something is left: then the manifest stays, so that the run directory is still known as the run's."""
        if self.left or self.errors:
            return
        manifests = [entry for entry in self.entries(_ROOT, tree.fd) if _is_manifest(PurePosixPath(entry.name))]
        for entry in sorted(manifests, key=lambda entry: entry.name == RUN_MARKER):
            if entry.is_file(follow_symlinks=False):
                self.unlink(PurePosixPath(entry.name), entry, tree.fd)
        if not (self.left or self.errors or self.dry_run):
            try:
                tree.remove_self()
            except OSError as error:
                self.errors.append(error_line("rmdir", self.run_dir, error))


def _is_manifest(rel: PurePosixPath) -> bool:
    """The run directory's manifest, or a half-written copy of it."""
    return len(rel.parts) == 1 and (rel.name == RUN_MARKER or rel.name.startswith(RUN_MARKER + TEMP_INFIX))


def remove_owned(
    run_dir: Path, only: Path | None = None, dry_run: bool = False, identity: tuple[int, int] | None = None
) -> Removal:
    """Removes exactly the files the run directory's manifest declares (everywhere, or only inside `only`) and the
    run's directories they leave empty, then (without `only`, and when nothing is left) the manifest and the run
    directory. `identity`: the run directory's (st_dev, st_ino), refused if it was replaced. dry_run only counts."""
    run_dir = Path(os.path.abspath(run_dir))
    nothing = Removal(str(run_dir), dry_run=dry_run)
    try:
        scope = _ROOT if only is None else PurePosixPath(Path(os.path.abspath(run_dir / only)).relative_to(run_dir))
    except ValueError:
        return replace(nothing, errors=(f"remove {only}: not inside the run directory {run_dir}; nothing removed",))
    try:
        tree = RunTree(run_dir, identity)
    except PlantedEntry as planted:
        left, lines = (Left(run_dir.name, str(planted)),), (f"{planted}; nothing removed",)
        return replace(nothing, left=left, errors=lines, planted=lines)
    except OSError as error:
        return _unreadable(nothing, error)
    with tree:
        try:
            groups = read_manifest(RUN_MARKER, tree.fd)["groups"]
        except (OSError, ValueError) as error:
            return _unreadable(nothing, error)
        sweep = _Sweep(run_dir, groups, scope, dry_run)
        sweep.sweep(_ROOT, tree.fd)
        if only is None:
            sweep.finish(tree)
    kept, errors, planted_lines = (*sweep.left,), (*sweep.errors,), (*sweep.planted_lines,)
    return Removal(str(run_dir), sweep.removed_files, sweep.removed_bytes, kept, errors, planted_lines, dry_run)


def _unreadable(nothing: Removal, error: Exception) -> Removal:
    """The Removal of a directory without a manifest this version reads: nothing removed, all of it left."""
    line = _read_error(Path(nothing.run_dir) / RUN_MARKER, error)
    left = (Left(Path(nothing.run_dir).name, "no readable ckptqual manifest"),)
    return replace(nothing, left=left, errors=(f"{line}; nothing removed",))
