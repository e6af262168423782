"""The one small interface every sweep read engine implements, and the host buffers they share.

An engine owns files, buffers and a pool of `threads` workers; the sweep's driver (ckptqual.runs.sweep.driver)
decides which reads to submit and when, unless the engine runs a whole cell itself (`CellReader`): then its own
workers take the reads in the driver's order, with the same batch and depth rules, and no read is handed from
one thread to another.
"""

from __future__ import annotations

import contextlib
import mmap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ckptqual.host.beneath import RunTree

ALIGN_BYTES = 4096  # O_DIRECT and GDS both want 4 KiB-aligned offsets, sizes and buffers
TRANSFERS = ("gpu-direct", "cpu-gpu", "cpu-only")  # how read data reaches the GPU, as the sweep names them


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

    def open(self, tree: RunTree, paths: Sequence[Path], shape: ReadShape) -> None:
        """Opens one file per job (each reached through `tree`, never via a symlink), allocates `jobs x slots`
        buffers of a block, starts `threads` workers."""
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


class ReadError(RuntimeError):
    """A read returned fewer bytes than asked, or failed; the message names job, offset and error."""


CheckBlock = Callable[[int, int, np.ndarray], None]  # check(job, offset, bytes read there)


@dataclass
class CellReads:
    """What an engine that ran a whole cell measured: bytes per job, each read's latency (jobs x requests, ns),
    the common start and the last completion (perf_counter_ns), and the blocks checked inside the cell."""

    bytes_per_job: list[int]
    latencies_ns: np.ndarray
    started_ns: int
    finished_ns: int
    verified: int


@runtime_checkable
class CellReader(Protocol):
    """An engine that runs a cell's reads itself: `offsets[job]` in order, `slots` a batch, every read of a batch
    done before the job's next batch starts, at most `threads` (the engine's workers) in flight."""

    def read_cell(self, offsets: Sequence[Sequence[int]], slots: int, check_block: CheckBlock | None) -> CellReads:
        """Reads every offset into its job's buffer `index % slots`; `check_block`, if given, checks each batch
        once it is complete, before the job's next batch reuses its buffers. Raises ReadError naming job and
        offset for a failed or short read (the other workers stop taking reads)."""
        ...


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
