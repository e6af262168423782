"""Raw sequential write and read of one file per rank: the yardstick that relative limits compare with.

The same ranks, chunk size, buffered writes and fsync as the checkpoint engines, without the file
format or payload making: one buffer is filled once and written again and again.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

from ckptqual.faults import on_path
from ckptqual.io.engines.base import RankIO, fsync_directory


class _Task(Protocol):
    directory: str
    options: dict


def raw_path(directory: Path, rank: int) -> Path:
    """The raw file of `rank`."""
    return directory / f"raw-{rank:03d}.bin"


def write_sequential(io: RankIO, task: _Task) -> int:
    """Writes `options["bytes_per_rank"]` bytes sequentially, then fsyncs file and directory."""
    directory, size = Path(task.directory), int(task.options["bytes_per_rank"])
    io.generate(io.buffer, file=0, tensor=0, offset=0)
    io.stage = "mkdir"
    with io.directory(directory, create=True):
        pass
    io.stage = "write"
    path = raw_path(directory, io.rank)
    try:
        with open(io.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL), "wb", buffering=0) as file:
            for offset in range(0, size, io.chunk_bytes):
                file.write(io.buffer[: min(io.chunk_bytes, size - offset)].data)
            io.stage = "fsync"
            os.fsync(file.fileno())
    except OSError as error:
        raise on_path(error, path) from None
    fsync_directory(io, directory)
    return size


def read_sequential(io: RankIO, task: _Task) -> int:
    """Reads the rank's raw file sequentially to the end; returns the bytes read."""
    total = 0
    view = io.buffer.data
    with open(io.open(raw_path(Path(task.directory), io.rank), os.O_RDONLY), "rb", buffering=0) as file:
        while count := file.readinto(view):
            total += count
    return total
