"""The one small interface every sweep read engine implements, and the host buffers they share.

An engine owns files, buffers and a pool of `threads` workers; the sweep's driver (ckptqual.runs.sweep.driver)
decides which reads to submit and when.
"""

from __future__ import annotations

import contextlib
import mmap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

ALIGN_BYTES = 4096  # O_DIRECT and GDS both want 4 KiB-aligned offsets, sizes and buffers


@dataclass(frozen=True)
class ReadShape:
    """What an engine sets up for one cell: `jobs` files, `slots` buffers of `block_bytes` each, `threads` workers."""

    jobs: int
    slots: int
    block_bytes: int
    threads: int


class Pending(Protocol):
    """One submitted read."""

    def wait(self) -> tuple[int, int, int]:
        """Blocks until the read is done; returns (bytes read, issue and completion times in perf_counter_ns).

        The POSIX engine times the pread itself in its worker; KvikIO's futures show no start, so its reads run
        from submit (a permit guarantees a free worker) to when the future is collected: an upper bound."""
        ...


class Reader(Protocol):
    """A read engine for one transfer type; opened for one cell at a time."""

    engine: str
    transfer: str

    def open(self, paths: Sequence[Path], shape: ReadShape) -> None:
        """Opens one file per job, allocates `jobs x slots` buffers of a block, starts `threads` workers."""
        ...

    def submit(self, job: int, slot: int, offset: int) -> Pending:
        """Starts reading one block of job `job`'s file at `offset` into buffer `slot` of that job."""
        ...

    def host_copy(self, job: int, slot: int) -> np.ndarray:
        """The bytes buffer `slot` of job `job` holds now, in host memory (uint8)."""
        ...

    def settings(self) -> dict[str, Any]:
        """What the engine ran with, as it took effect (threads, task size, compat mode, direct I/O)."""
        ...

    def invalid_reason(self) -> str | None:
        """Why the cell's result must not count (e.g. GPU Direct fell back to POSIX); None if it counts."""
        ...

    def close(self) -> None: ...


class HostBuffers:
    """`count` page-aligned host buffers of `block_bytes` in one anonymous mapping (O_DIRECT needs alignment)."""

    def __init__(self, count: int, block_bytes: int) -> None:
        self.block_bytes = block_bytes
        self._map = mmap.mmap(-1, count * block_bytes)
        self.array = np.frombuffer(self._map, dtype=np.uint8)

    def view(self, index: int) -> np.ndarray:
        start = index * self.block_bytes
        return self.array[start : start + self.block_bytes]

    def close(self) -> None:
        del self.array
        with contextlib.suppress(BufferError):  # a view still held elsewhere: the mapping goes with it
            self._map.close()
