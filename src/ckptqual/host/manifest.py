"""What a run writes, declared before it writes it. The run directory's manifest (`.ckptqual-run`) holds groups:
a glob of directories relative to the run directory, the files the run writes in each, and whether each such
directory names more files in its own list (`.ckptqual-files`)."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterable
from contextlib import suppress
from pathlib import Path, PurePosixPath
from typing import Any

from ckptqual import __version__
from ckptqual.host.beneath import PlantedEntry, what_is
from ckptqual.host.guard import RUN_MARKER, TargetError, failure

FILE_LIST = ".ckptqual-files"
MANIFEST_FORMAT = "ckptqual-run-manifest"
MANIFEST_VERSION = 1
TEMP_INFIX = ".tmp-"  # `.ckptqual-run.tmp-PID`: a manifest or list being written, renamed into place when whole


def relative(text: str, what: str, root_ok: bool = False) -> str:
    """`text` as a clean path relative to the run directory; TargetError if absolute, with '..' or empty."""
    path = PurePosixPath(text) if isinstance(text, str) else None
    if path is None or path.is_absolute() or ".." in path.parts or RUN_MARKER in path.parts:
        raise TargetError(
            f"{what} {text!r}: must be a path relative to the run directory, without '..' or {RUN_MARKER}"
        )
    if not path.parts and not root_ok:
        raise TargetError(f"{what} {text!r}: must name a file; give its path relative to the directory")
    return str(path)


def write_json_atomically(directory_fd: int, path: Path, data: Any) -> None:
    """Writes `path`, whose directory is open as `directory_fd`, whole or not at all: a new temporary file (O_EXCL,
    O_NOFOLLOW), fsynced, renamed over it within that directory. An entry planted in the way raises PlantedEntry."""
    temporary = f"{path.name}{TEMP_INFIX}{os.getpid()}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(temporary, flags, 0o644, dir_fd=directory_fd)
    except FileExistsError:
        raise PlantedEntry(path.with_name(temporary), what_is(directory_fd, temporary)) from None
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(json.dumps(data, indent=1).encode())
            file.flush()
            os.fsync(file.fileno())
        if _planted(directory_fd, path.name):  # renamed over, it would be gone unreported
            raise PlantedEntry(path, what_is(directory_fd, path.name))
        os.replace(temporary, path.name, src_dir_fd=directory_fd, dst_dir_fd=directory_fd)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(temporary, dir_fd=directory_fd)
        raise


def _planted(directory_fd: int, name: str) -> bool:
    """Whether `name` in the directory `directory_fd` is there and not a regular file."""
    try:
        return not stat.S_ISREG(os.stat(name, dir_fd=directory_fd, follow_symlinks=False).st_mode)
    except FileNotFoundError:
        return False


def read_json(path: Path | str, dir_fd: int | None = None) -> Any:
    """A JSON file (relative to the directory open as `dir_fd`, if given), read without following a symlink."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    with os.fdopen(fd, "rb") as file:
        return json.loads(file.read())


def write_file_list(directory_fd: int, directory: Path, files: Iterable[str]) -> None:
    """Names, before they are written, more files of one directory (`directory`, open as `directory_fd`) of a group
    declared with listed=True."""
    names = [relative(name, "file") for name in files]
    try:
        write_json_atomically(directory_fd, directory / FILE_LIST, names)
    except OSError as error:
        raise failure("write", directory / FILE_LIST, error) from error


def new_manifest(holder: dict[str, Any]) -> dict[str, Any]:
    """The manifest of a new run directory: who made it, and no groups yet."""
    who = {key: holder[key] for key in ("pid", "host", "started", "started_unix")}
    return dict(format=MANIFEST_FORMAT, version=MANIFEST_VERSION, ckptqual=__version__, **who, kept=False, groups=[])


def add_group(manifest: dict[str, Any], pattern: str, files: Iterable[str], listed: bool) -> None:
    """Adds `files` to the group of `pattern` (a new group if there is none)."""
    group = _group({"pattern": pattern, "files": list(files), "listed": listed})
    old = next((old for old in manifest["groups"] if old["pattern"] == group["pattern"]), None)
    if old is None:
        manifest["groups"].append(group)
    else:
        old.update(files=list(dict.fromkeys([*old["files"], *group["files"]])), listed=old["listed"] or listed)


def read_manifest(path: Path | str, dir_fd: int | None = None) -> dict[str, Any]:
    """A manifest with its groups checked; OSError, or ValueError when it is no manifest this version reads."""
    try:
        manifest = read_json(path, dir_fd)
    except ValueError:
        manifest = None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise ValueError("not a ckptqual run manifest (an older ckptqual's marker?)")
    if manifest.get("version") != MANIFEST_VERSION:
        raise ValueError(f"manifest version {manifest.get('version')!r}, this ckptqual reads {MANIFEST_VERSION}")
    try:
        return {**manifest, "groups": [_group(group) for group in manifest["groups"]]}
    except (KeyError, TypeError, TargetError) as error:
        raise ValueError(f"malformed groups: {error}") from error


def _group(group: dict[str, Any]) -> dict[str, Any]:
    """A group with its pattern and files checked (TargetError) and made clean."""
    pattern = relative(group["pattern"], "pattern", root_ok=True)
    files = list(dict.fromkeys(relative(name, "file") for name in group["files"]))
    return {"pattern": pattern, "files": files, "listed": bool(group.get("listed", False))}
