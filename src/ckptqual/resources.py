"""Where the packaged data lives (`fixtures/` and `thresholds/` of a checkout, or their copies in a wheel), and the
one way a data file, packaged or the user's, is read: a bounded read of a regular file."""

from __future__ import annotations

import os
import stat
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
_CHECKOUT = _PACKAGE.parents[1]


def data_dir(name: str) -> Path:
    """The directory `name` ("fixtures/workloads" or "thresholds") of a checkout, else of the installed wheel."""
    for base in (_CHECKOUT, _PACKAGE / "data"):
        candidate = base / name
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"ckptqual data directory {name!r} not found under {_CHECKOUT} or {_PACKAGE / 'data'}")


def named_files(name: str) -> dict[str, Path]:
    """The `*.toml` files of data directory `name`, by stem."""
    return {p.stem: p for p in sorted(data_dir(name).glob("*.toml"))}


def resolve(name_or_path: str, directory: str, what: str) -> Path:
    """A file given by its name in `directory` or by a path; an unknown name lists the available ones."""
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.parent != Path("."):
        if not os.path.lexists(path):
            raise FileNotFoundError(f"{what} file {name_or_path!r} does not exist")
        return path
    available = named_files(directory)
    if name_or_path not in available:
        names = ", ".join(available) or "(none)"
        raise LookupError(f"unknown {what} {name_or_path!r}; available: {names} (or give a path to a .toml file)")
    return available[name_or_path]


_KINDS = {
    stat.S_IFREG: "a regular file",
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


def kind_of(mode: int) -> str:
    """The kind of file an st_mode says, in words ("a FIFO")."""
    return _KINDS.get(stat.S_IFMT(mode), "an unknown kind of file")


def read_text_file(path: Path, max_bytes: int) -> str:
    """The UTF-8 text of the regular file `path` (a user's own symlink to one is followed), at most `max_bytes` of it,
    judged by what the opened descriptor is, never waiting on a FIFO; ValueError (one line, with the fix) otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        raise ValueError(f"cannot be opened ({error.strerror}); give a readable file") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ValueError(f"is {kind_of(mode)}, not a regular file; give a regular file")
        chunks, size = [], 0
        while size <= max_bytes and (chunk := os.read(fd, max_bytes + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > max_bytes:
        raise ValueError(f"is larger than {max_bytes:,} bytes, more than such a file ever holds; give the right file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"is not UTF-8 text (byte {error.start} is {data[error.start]:#04x}); fix its encoding"
        ) from None
