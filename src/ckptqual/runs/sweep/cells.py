"""The read sweep's matrix (gdsio-like, docs/facts.md): cells and per-cell arithmetic.

Pure: no I/O and no pytest. How a cell maps onto gdsio's knobs:

- `jobs` files, one per job (gdsio -D): each job reads its own file sequentially, one block per request,
  starting where that job's previous cell stopped and wrapping at the end of the file.
- `threads` is the I/O depth of the whole cell: the engine runs `threads` workers (KvikIO's thread pool or
  ckptqual's own), so at most `threads` requests are in flight at once.
- `batch`: each job submits `batch` reads, waits for all of them, then submits the next batch (gdsio -B; the
  Python KvikIO API has no batch call, so a batch is `batch` preads and a wait on all). The depth actually
  reached is therefore min(threads, jobs x batch): the review's 16 jobs x 16 = 256 keep 128 threads busy.
- A cell issues at most `requests` reads per job (default 2048), and never more than the file holds, so it
  reads jobs x min(file_bytes, requests x block) bytes: big blocks read whole files, small blocks at one
  thread stay short (8K x 2048 = 16 MiB a job), and every cell has thousands of latency samples for p99.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ckptqual.config.run_settings import SweepConfig
from ckptqual.limits.units import format_size

MAX_CACHED_FRACTION = 0.01  # more of the files than this in the page cache before a cell makes it INVALID


@dataclass(frozen=True)
class Cell:
    """One point of the matrix: a transfer type, a block size and a thread count (I/O depth)."""

    transfer: str
    block_bytes: int
    threads: int
    jobs: int
    batch: int
    requests_per_job: int

    @property
    def block_size(self) -> str:
        return format_size(self.block_bytes)

    @property
    def id(self) -> str:
        """The test ID: no drive name, so that runs on different drives compare in pytest-benchmark."""
        return f"{self.transfer}-{self.block_size}-{self.threads}"

    @property
    def slots(self) -> int:
        """Buffers per job: one per request of a batch."""
        return min(self.batch, self.requests_per_job)

    @property
    def depth(self) -> int:
        """Requests in flight at most: the engine's workers, unless the jobs' batches are fewer."""
        return min(self.threads, self.jobs * self.slots)

    @property
    def bytes_per_job(self) -> int:
        return self.requests_per_job * self.block_bytes

    @property
    def total_bytes(self) -> int:
        return self.jobs * self.bytes_per_job

    def context(self) -> dict[str, Any]:
        """The keys a threshold file's `where` selects sweep limits by."""
        return {"transfer": self.transfer, "block_size": self.block_size, "threads": self.threads}

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "transfer": self.transfer,
            "block_size": self.block_size,
            "block_bytes": self.block_bytes,
            "threads": self.threads,
            "jobs": self.jobs,
            "batch": self.batch,
            "depth": self.depth,
            "requests_per_job": self.requests_per_job,
            "planned_bytes": self.total_bytes,
        }


def requests_per_job(config: SweepConfig, block_bytes: int) -> int:
    """Reads each job issues in a cell: `config.requests`, but no more than one pass over its file."""
    return max(1, min(config.requests, config.file_bytes // block_bytes))


def plan_cells(config: SweepConfig) -> list[Cell]:
    """Every cell, transfer type outermost, then block sizes and threads in the order given."""
    return [
        Cell(transfer, block, threads, config.jobs, config.batch, requests_per_job(config, block))
        for transfer in config.transfers
        for block in config.block_sizes_bytes
        for threads in config.threads
    ]


def job_offsets(start: int, count: int, block_bytes: int, file_bytes: int) -> list[int]:
    """`count` sequential block offsets from `start`, wrapping to 0 where a block would pass the file's end."""
    if block_bytes > file_bytes:
        raise ValueError(f"block {block_bytes} is larger than the file ({file_bytes} bytes)")
    offsets, offset = [], start
    for _ in range(count):
        if offset + block_bytes > file_bytes:
            offset = 0
        offsets.append(offset)
        offset += block_bytes
    return offsets


def next_start(offsets: Sequence[int], block_bytes: int, file_bytes: int) -> int:
    """Where the next cell of a job starts: after its last block, or 0 at the end of the file."""
    if not offsets:
        return 0
    end = offsets[-1] + block_bytes
    return end if end < file_bytes else 0


def percentile(values: Iterable[float], q: float) -> float:
    """The nearest-rank percentile (the smallest value with at least q % of values at or below it)."""
    ordered = np.sort(np.asarray(list(values) if not isinstance(values, np.ndarray) else values, dtype=np.float64))
    if ordered.size == 0:
        raise ValueError("percentile of no values")
    if not 0 < q <= 100:
        raise ValueError(f"percentile q must be in (0, 100], got {q}")
    rank = math.ceil(q / 100 * ordered.size)
    return float(ordered[rank - 1])


@dataclass(frozen=True)
class CellStats:
    """What one cell measured: bytes and time of the whole cell, and per-request latency."""

    bytes: int
    seconds: float
    requests: int
    mean_latency_us: float
    p99_latency_us: float
    max_latency_us: float

    @property
    def GiBps(self) -> float:
        return self.bytes / self.seconds / 2**30

    @property
    def GBps(self) -> float:
        return self.bytes / self.seconds / 1e9

    @property
    def iops(self) -> float:
        return self.requests / self.seconds

    def to_dict(self) -> dict[str, Any]:
        return {
            "bytes": self.bytes,
            "seconds": self.seconds,
            "requests": self.requests,
            "GiBps": self.GiBps,
            "GBps": self.GBps,
            "iops": self.iops,
            "mean_latency_us": self.mean_latency_us,
            "p99_latency_us": self.p99_latency_us,
            "max_latency_us": self.max_latency_us,
        }


def cell_stats(bytes_read: int, seconds: float, latencies_ns: Sequence[int] | np.ndarray) -> CellStats:
    """GiB/s, IOPS and latency of a cell from its bytes, its wall time and each request's latency."""
    latencies = np.asarray(latencies_ns, dtype=np.float64)
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ValueError(f"a cell's time must be > 0 seconds, got {seconds!r}")
    if latencies.size == 0:
        raise ValueError("a cell without requests has no statistics")
    return CellStats(
        bytes=int(bytes_read),
        seconds=float(seconds),
        requests=int(latencies.size),
        mean_latency_us=float(latencies.mean() / 1e3),
        p99_latency_us=percentile(latencies, 99) / 1e3,
        max_latency_us=float(latencies.max() / 1e3),
    )
