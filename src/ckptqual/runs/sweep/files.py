"""The sweep's data files: one per job, written once (untimed) with ckptqual's payload, evicted before each cell.

Every 4 KiB block carries the payload's self-describing header (checkpoint field = SWEEP_CHECKPOINT, rank and
file = the job), so a block read back can be checked against what was written at that offset.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ckptqual.host import cache
from ckptqual.host.beneath import RunRoot, RunTree
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
    """`jobs` files of `file_bytes` in `directory`, which this object creates and removes; each is reached from the
    directory that holds `directory` (the run directory) as it was when this object was made, never via a symlink."""

    def __init__(self, directory: Path, jobs: int, file_bytes: int, seed: int) -> None:
        self.directory, self.jobs, self.file_bytes = directory, jobs, file_bytes
        self.root = RunRoot.of(directory.parent)
        self.paths = [directory / name for name in file_names(jobs)]
        self._payload = PayloadGenerator(seed)
        self.written = False

    def write(self, run: ChangeRunner = run_here) -> None:
        """Writes every file with its payload, fsyncs it and drops it from the page cache; `run(what, function,
        *args)` decides where (the qualification runs it in a helper process with a deadline)."""
        what = f"writing the sweep files in {self.directory}"
        run(what, write_files, self.root, self.paths, self.file_bytes, self._payload.seed)
        self.written = True

    def open_tree(self) -> RunTree:
        """A handle of the directory the files are reached from; the caller closes it."""
        return self.root.open()

    def evict(self) -> None:
        with self.open_tree() as tree:
            for path in self.paths:
                cache.evict(tree, path)

    def cached_fraction(self) -> float:
        with self.open_tree() as tree:
            return cache.cached_fraction(tree, self.paths)

    def check(self, job: int, offset: int, data: np.ndarray) -> None:
        """Raises DataMismatch unless `data` is what job `job`'s file holds at `offset`."""
        bad = find_mismatches(self._payload, np.asarray(data), SWEEP_CHECKPOINT, job, job, 0, offset, limit=1)
        if bad:
            raise DataMismatch(f"{self.paths[job].name}: block read at offset {offset} holds {bad[0].describe()}")

    def remove(self, run: ChangeRunner = run_here) -> None:
        """Removes the files (those that exist) and the directory once empty; `run` as for `write`."""
        run(f"removing the sweep files in {self.directory}", remove_files, self.root, self.paths, self.directory)
        self.written = False


def file_names(jobs: int) -> list[str]:
    """The sweep's file names, one per job."""
    return [f"sweep-job{job:03d}.bin" for job in range(jobs)]


def write_files(root: RunRoot, paths: list[Path], file_bytes: int, seed: int) -> None:
    """Writes each job's file anew (reached from `root`) with its payload, fsyncs it and drops it from the page
    cache."""
    payload = PayloadGenerator(seed)
    chunk = np.empty(min(_CHUNK_BYTES, file_bytes), dtype=np.uint8)
    with root.open() as tree:
        tree.makedirs(paths[0].parent)
        for job, path in enumerate(paths):
            with open(tree.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL), "wb", buffering=0) as file:
                for offset in range(0, file_bytes, chunk.nbytes):
                    part = chunk[: min(chunk.nbytes, file_bytes - offset)]
                    payload.fill(part, SWEEP_CHECKPOINT, job, job, 0, offset)
                    file.write(part.data)
                os.fsync(file.fileno())
            cache.evict(tree, path)


def remove_files(root: RunRoot, paths: list[Path], directory: Path) -> None:
    """Removes the sweep's files that exist (reached from `root`), and their directory once empty."""
    with root.open() as tree:
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                tree.unlink(path)
        with contextlib.suppress(FileNotFoundError):
            with tree.directory(directory) as fd:
                empty = not os.listdir(fd)
            if empty:
                tree.rmdir(directory)
