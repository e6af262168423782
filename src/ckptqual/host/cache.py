"""Page-cache control for cold reads: evict a file's pages and measure how much of it is cached, each file reached
through the run's tree (never through a symlink)."""

from __future__ import annotations

import ctypes
import mmap
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from ckptqual.host.beneath import RunTree

_libc = ctypes.CDLL(None, use_errno=True)
_PAGE = mmap.PAGESIZE


def evict(tree: RunTree, path: Path) -> None:
    """Writes back and drops the file's cached pages (posix_fadvise DONTNEED)."""
    fd = tree.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def cached_bytes(tree: RunTree, path: Path) -> tuple[int, int]:
    """(bytes of the file in the page cache, file size), from mincore(2) over a private mapping."""
    fd = tree.open(path, os.O_RDONLY)
    try:
        return resident_bytes(fd, str(path))
    finally:
        os.close(fd)


def resident_bytes(fd: int, name: str) -> tuple[int, int]:
    """(bytes of the open file `fd` in memory, file size), from mincore(2) over a private mapping; `name` names it
    in an error."""
    size = os.fstat(fd).st_size
    if size == 0:
        return 0, 0
    pages = (size + _PAGE - 1) // _PAGE
    vector = (ctypes.c_ubyte * pages)()
    with mmap.mmap(fd, size, access=mmap.ACCESS_COPY) as mapped:
        window = (ctypes.c_char * size).from_buffer(mapped)
        try:
            status = _libc.mincore(ctypes.c_void_p(ctypes.addressof(window)), ctypes.c_size_t(size), vector)
        finally:
            del window
    if status != 0:
        raise OSError(ctypes.get_errno(), f"mincore failed on {name}")
    resident = int(np.count_nonzero(np.ctypeslib.as_array(vector) & 1))
    return min(resident * _PAGE, size), size


def evict_all(tree: RunTree, paths: Iterable[Path]) -> float:
    """Evicts every file of `paths`; returns the fraction of their bytes still cached afterwards."""
    paths = list(paths)
    for path in paths:
        evict(tree, path)
    return cached_fraction(tree, paths)


def cached_fraction(tree: RunTree, paths: Iterable[Path]) -> float:
    """The fraction of the files' bytes that sit in the page cache (0 for no bytes)."""
    cached = total = 0
    for path in paths:
        in_cache, size = cached_bytes(tree, path)
        cached += in_cache
        total += size
    return cached / total if total else 0.0
