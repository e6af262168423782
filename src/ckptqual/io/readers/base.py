"""The one small interface every sweep read engine implements, and the loop that drives a cell through it.

An engine owns files, buffers and a pool of `threads` workers; the loop owns the gdsio semantics (see
ckptqual.runs.sweep.cells): one submitter per job, `batch` reads submitted then all waited on, sequential offsets.
"""

from __future__ import annotations

import contextlib
import mmap
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ckptqual.runs.sweep.cells import Cell, job_offsets, next_start


class ReadError(RuntimeError):
    """A read returned fewer bytes than asked, or failed; the message names file, offset and error."""


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

    def open(self, paths: Sequence[Path], cell: Cell) -> None:
        """Opens the jobs' files, allocates `cell.jobs x cell.slots` buffers of a block, starts `cell.threads`
        workers."""
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


@dataclass
class CellRun:
    """What the loop measured: bytes, wall time from first submit to last completion, each request's latency."""

    bytes: int
    seconds: float
    latencies_ns: np.ndarray
    offsets: list[list[int]]  # per job, every offset read, in order
    next_starts: list[int]
    verified_requests: int = 0

    def last_batch(self, job: int, slots: int) -> list[int]:
        """Offsets of job `job`'s last batch, in slot order: what its buffers hold after the cell."""
        offsets = self.offsets[job]
        size = len(offsets) % slots or slots
        return offsets[-size:]


CheckBlock = Callable[[int, int, np.ndarray], None]


def run_cell(
    reader: Reader,
    cell: Cell,
    starts: Sequence[int],
    file_bytes: int,
    check_block: CheckBlock | None = None,
) -> CellRun:
    """Drives one cell: each job in its own submitter thread, all released at once, `cell.slots` reads per
    batch and the next batch only when the whole batch is done; a semaphore of `cell.threads` permits keeps at
    most `threads` reads in flight across the jobs, so the engine's `threads` workers never queue a read.

    A job that cannot get a permit collects its own oldest read and frees that permit; one that has nothing in
    flight waits for a permit, so the jobs cannot starve each other. A read's latency is the engine's: from
    issue to completion (see Pending.wait). `check_block(job, offset, data)`, if given, checks every block
    after its batch, inside the timed loop (for tests)."""
    count = cell.requests_per_job
    offsets = [job_offsets(starts[job], count, cell.block_bytes, file_bytes) for job in range(cell.jobs)]
    latencies = np.zeros((cell.jobs, count), dtype=np.int64)
    read_bytes = [0] * cell.jobs
    finished = [0] * cell.jobs
    verified = [0] * cell.jobs
    errors: list[BaseException] = []
    started: list[int] = []
    permits = threading.Semaphore(cell.threads)
    barrier = threading.Barrier(cell.jobs, action=lambda: started.append(time.perf_counter_ns()))

    def job_loop(job: int) -> None:
        mine = offsets[job]
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            return
        try:
            for first in range(0, len(mine), cell.slots):
                batch = mine[first : first + cell.slots]
                in_flight: deque[tuple[int, Pending]] = deque()
                problem: BaseException | None = None
                slot = 0
                while slot < len(batch) or in_flight:
                    if problem is None and slot < len(batch) and permits.acquire(blocking=not in_flight):
                        try:
                            in_flight.append((slot, reader.submit(job, slot, batch[slot])))
                        except Exception as error:  # stop submitting, but collect what is in flight
                            permits.release()
                            problem = ReadError(f"job {job} offset {batch[slot]}: could not submit: {error}")
                        slot += 1
                        continue
                    if not in_flight:
                        break
                    index, pending = in_flight.popleft()
                    try:
                        got, issued, done = pending.wait()
                    except Exception as error:  # collect the rest of the batch before giving up
                        problem = problem or ReadError(f"job {job} offset {batch[index]}: {error}")
                        continue
                    finally:
                        permits.release()
                    if got != cell.block_bytes and problem is None:
                        problem = ReadError(f"job {job} offset {batch[index]}: read {got} of {cell.block_bytes} bytes")
                    latencies[job, first + index] = done - issued
                    read_bytes[job] += got
                if problem is not None:
                    raise problem
                if check_block is not None:
                    for index, offset in enumerate(batch):
                        check_block(job, offset, reader.host_copy(job, index))
                        verified[job] += 1
        except BaseException as error:
            errors.append(error)
        finally:
            finished[job] = time.perf_counter_ns()

    workers = [
        threading.Thread(target=job_loop, args=(job,), name=f"ckptqual-sweep-job-{job}") for job in range(cell.jobs)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if errors:
        raise errors[0]
    return CellRun(
        bytes=sum(read_bytes),
        seconds=(max(finished) - started[0]) / 1e9,
        latencies_ns=latencies.reshape(-1),
        offsets=offsets,
        next_starts=[next_start(mine, cell.block_bytes, file_bytes) for mine in offsets],
        verified_requests=sum(verified),
    )
