"""The sweep's data files: one per job, written once (untimed) with ckptqual's payload, evicted before each cell.

Every 4 KiB block carries the payload's self-describing header (checkpoint field = SWEEP_CHECKPOINT, rank and
file = the job), so a block read back can be checked against what was written at that offset.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ckptqual.host import cache
from ckptqual.io.payload import PayloadGenerator, find_mismatches

SWEEP_CHECKPOINT = 0xFFFFFFFF  # marks sweep data in the payload header; fill checkpoints count from 0
_CHUNK_BYTES = 8 << 20
ChangeRunner = Callable[..., Any]  # run(what, function, *args): where changes to the target are made


def run_here(what: str, function: Callable[..., Any], *args: Any) -> Any:
    """The plain runner: `function(*args)` in this process."""
    return function(*args)


class DataMismatch(RuntimeError):
    """A block read back is not the block written there."""


class SweepFiles:
    """`jobs` files of `file_bytes` in `directory`, which this object creates and removes."""

    def __init__(self, directory: Path, jobs: int, file_bytes: int, seed: int) -> None:
        self.directory, self.jobs, self.file_bytes = directory, jobs, file_bytes
        self.paths = [directory / name for name in file_names(jobs)]
        self._payload = PayloadGenerator(seed)
        self.written = False

    def write(self, run: ChangeRunner = run_here) -> None:
        """Writes every file with its payload, fsyncs it and drops it from the page cache; `run(what, function,
        *args)` decides where (the qualification runs it in a helper process with a deadline)."""
        what = f"writing the sweep files in {self.directory}"
        run(what, write_files, self.paths, self.file_bytes, self._payload.seed)
        self.written = True

    def evict(self) -> None:
        for path in self.paths:
            cache.evict(path)

    def cached_fraction(self) -> float:
        return cache.cached_fraction(self.paths)

    def check(self, job: int, offset: int, data: np.ndarray) -> None:
        """Raises DataMismatch unless `data` is what job `job`'s file holds at `offset`."""
        bad = find_mismatches(self._payload, np.asarray(data), SWEEP_CHECKPOINT, job, job, 0, offset, limit=1)
        if bad:
            raise DataMismatch(f"{self.paths[job].name}: block read at offset {offset} holds {bad[0].describe()}")

    def remove(self, run: ChangeRunner = run_here) -> None:
        """Removes the files (those that exist) and the directory once empty; `run` as for `write`."""
        run(f"removing the sweep files in {self.directory}", remove_files, self.paths, self.directory)
        self.written = False


def file_names(jobs: int) -> list[str]:
    """The sweep's file names, one per job."""
    return [f"sweep-job{job:03d}.bin" for job in range(jobs)]


def write_files(paths: list[Path], file_bytes: int, seed: int) -> None:
    """Writes each job's file with its payload, fsyncs it and drops it from the page cache."""
    payload = PayloadGenerator(seed)
    paths[0].parent.mkdir(exist_ok=True)
    chunk = np.empty(min(_CHUNK_BYTES, file_bytes), dtype=np.uint8)
    for job, path in enumerate(paths):
        with open(path, "wb", buffering=0) as file:
            for offset in range(0, file_bytes, chunk.nbytes):
                part = chunk[: min(chunk.nbytes, file_bytes - offset)]
                payload.fill(part, SWEEP_CHECKPOINT, job, job, 0, offset)
                file.write(part)
            os.fsync(file.fileno())
        cache.evict(path)


def remove_files(paths: list[Path], directory: Path) -> None:
    """Removes the sweep's files that exist, and their directory once empty."""
    for path in paths:
        path.unlink(missing_ok=True)
    if directory.is_dir() and not any(directory.iterdir()):
        directory.rmdir()
