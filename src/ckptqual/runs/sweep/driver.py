"""One session's read sweep: writes its files before the first cell that runs, measures cells, keeps the record.

Knows nothing of pytest: the plugin hands it `say` for progress, `on_change` to store the record, and a
`runner(fn, setup)` that times a cell as a pytest-benchmark round (setup = evict + check the page cache).
`run_cell` drives one cell through a read engine with gdsio's semantics (see ckptqual.runs.sweep.cells).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ckptqual.host import device_bytes
from ckptqual.host.cpu import HostSampler, HostUse, own_cpu_s
from ckptqual.host.device_bytes import DeviceBytes, Devices
from ckptqual.host.gpu import HostGpu
from ckptqual.host.waits import ThreadWatch
from ckptqual.io.readers import make_reader
from ckptqual.io.readers.base import CellReader, CheckBlock, Pending, Reader, ReadError, ReadShape
from ckptqual.limits.cache_served import cache_served_reason
from ckptqual.limits.host_bound import host_bound_reason
from ckptqual.runs.sweep import cells
from ckptqual.runs.sweep.cells import MAX_CACHED_FRACTION, Cell, CellStats, SweepConfig, cell_stats
from ckptqual.runs.sweep.files import ChangeRunner, SweepFiles, run_here

_CUFILE_LOG_LINES = 40
Runner = Callable[[Callable[[], None], Callable[[], None]], None]


def plain_runner(fn: Callable[[], None], setup: Callable[[], None]) -> None:
    setup()
    fn()


@dataclass(frozen=True)
class CellResult:
    """A measured cell: its statistics and everything it depended on (`record`, as stored in the results)."""

    cell: Cell
    stats: CellStats
    record: dict[str, Any]

    @property
    def invalid_reason(self) -> str | None:
        return self.record.get("invalid_reason")

    def extra_info(self) -> dict[str, Any]:
        """The cell for pytest-benchmark's extra_info: read GiB/s first, then what it depended on."""
        keep = ("GiBps", "GBps", "iops", "mean_latency_us", "p99_latency_us", "bytes", "seconds", "requests")
        info = {key: self.record[key] for key in keep}
        info |= {key: self.record[key] for key in ("transfer", "block_size", "threads", "jobs", "batch", "depth")}
        info |= {"engine": self.record["engine"], "cached_fraction_before": self.record["cached_fraction_before"]}
        return info | {"settings": self.record["settings"]}


class SweepRun:
    """The sweep of one session over `config`, reading files it keeps in `directory` (removed by close())."""

    def __init__(
        self,
        config: SweepConfig,
        directory: Path,
        seed: int,
        host: HostGpu,
        say: Callable[[str], None] = lambda line: None,
        on_change: Callable[[dict[str, Any]], None] = lambda data: None,
        verify: str = "last",
        cufile_log: Path | None = None,
        run: ChangeRunner = run_here,
        sampler: HostSampler | None = None,
        devices: Devices | None = None,
    ) -> None:
        """`devices`: whose counters show what the cells really read (default: those under `directory`'s parent)."""
        if verify not in ("last", "all", "none"):
            raise ValueError(f"verify must be last, all or none, got {verify!r}")
        self.config, self.host, self.say, self.verify, self.run = config, host, say, verify, run
        self._on_change = on_change
        self.cufile_log = cufile_log
        self.sampler = sampler or HostSampler()  # the reads run in this process (or a child): its CPU time is theirs
        self.files = SweepFiles(directory, config.jobs, config.file_bytes, seed)
        self.devices = devices if devices is not None else device_bytes.devices_under(directory.parent)
        self._starts = [0] * config.jobs
        self.data: dict[str, Any] = {
            "config": config.to_dict(),
            "host": host.to_dict(),
            "engines": {transfer: self._engine_text(transfer) for transfer in config.transfers},
            "files": {"directory": str(directory), "jobs": config.jobs, "file_bytes": config.file_bytes},
            "cells": [],
        }
        self._cells: dict[str, dict[str, Any]] = {}

    def _engine_text(self, transfer: str) -> str:
        problem = self.host.problem(transfer)
        if problem:
            return f"skipped: {problem}"
        invalid = self.host.invalid(transfer)
        if invalid:
            return f"INVALID: {invalid}"
        if transfer == "cpu-only":
            return self.host.cpu_only_reason
        return "KvikIO (GDS, compat mode off)" if transfer == "gpu-direct" else "KvikIO (compat mode, bounce buffers)"

    def cannot_run(self, cell: Cell) -> str | None:
        """Why this host cannot run `cell`'s transfer type (recorded as SKIPPED), or None."""
        problem = self.host.problem(cell.transfer)
        if problem:
            self._store(cell, {**cell.to_dict(), "outcome": "SKIPPED", "reason": problem})
        return problem

    def cannot_measure(self, cell: Cell) -> str | None:
        """Why `cell` would not measure its transfer type on this host (recorded as INVALID, not read), or None."""
        invalid = self.host.invalid(cell.transfer)
        if invalid:
            self._store(cell, {**cell.to_dict(), "outcome": "INVALID", "invalid_reason": invalid})
        return invalid

    def measure(self, cell: Cell, runner: Runner | None = None) -> CellResult:
        """Runs one cell on cold files and records it; the caller judges it."""
        self._ensure_files()
        reader = make_reader(cell.transfer, self.host)
        record: dict[str, Any] = {**cell.to_dict(), "engine": reader.engine, "outcome": "ERROR"}
        self._store(cell, record)
        try:
            with self.files.open_tree() as tree:
                reader.open(tree, self.files.paths, read_shape(cell))
            record["start_offsets"] = list(self._starts)
            run, cached_before, host, device = self._timed_read(reader, cell, runner or plain_runner)
            self._starts = run.next_starts
            record["cached_fraction_after"] = self.files.cached_fraction()
            verified = run.verified_requests + self._check_last_batches(reader, cell, run)
            stats = cell_stats(run.bytes, run.seconds, run.latencies_ns)
            record.update(
                stats.to_dict(),
                settings=reader.settings(),
                cached_fraction_before=cached_before,
                verified_requests=verified,
                host=host.to_dict(),
                cpu_s_per_GB=host.cpu_s_per_GB(stats.bytes),
                host_bound=host_bound_reason(host, "the sweep's process"),
                device=device.to_dict(),
                invalid_reason=self._invalid_reason(reader, cell, cached_before, device),
            )
        except BaseException as error:
            record["error"] = f"{type(error).__name__}: {error}"
            raise
        finally:
            reader.close()
            self._store(cell, record)
        record["outcome"] = "INVALID" if record["invalid_reason"] else "MEASURED"
        self._store(cell, record)
        self.say(
            f"ckptqual: sweep {cell.id}: {stats.GiBps:.2f} GiB/s, {stats.iops:,.0f} IOPS, latency mean "
            f"{stats.mean_latency_us:,.0f} us p99 {stats.p99_latency_us:,.0f} us ({reader.engine}, "
            f"{stats.bytes / 2**20:,.0f} MiB in {stats.seconds:.2f} s, cached before {cached_before:.1%})"
        )
        return CellResult(cell, stats, record)

    def _timed_read(self, reader: Reader, cell: Cell, runner: Runner) -> tuple[CellRun, float, HostUse, DeviceBytes]:
        """The cell's reads as `runner` times them, after evicting the files and the layer below them; the fraction
        cached before them; the host's use meanwhile (this process's CPU seconds and its children's: the reads run
        there); what the devices under the files read meanwhile."""
        box: dict[str, Any] = {}

        def setup() -> None:
            self.files.evict()
            box["cached_before"] = self.files.cached_fraction()
            box["below"] = self.devices.evict_below()

        def read() -> None:
            check = self.files.check if self.verify == "all" else None
            with device_bytes.counted(self.devices) as count:
                start, cpu_start, watch = self.sampler.mark(), own_cpu_s(), ThreadWatch()
                box["run"] = run_cell(reader, cell, self._starts, self.config.file_bytes, check_block=check)
                waits = watch.stop()  # the reading threads' own waits for a CPU (limits.host_bound)
                box["host"] = self.sampler.use(start, self.sampler.mark(), own_cpu_s() - cpu_start).waited([waits])
            box["device"] = count.of(box["run"].bytes, "read", layer_below=box["below"])

        runner(read, setup)
        return box["run"], box["cached_before"], box["host"], box["device"]

    def _check_last_batches(self, reader: Reader, cell: Cell, run: CellRun) -> int:
        """With verify="last", checks what every job's buffers hold after the cell (its last batch), untimed."""
        checked = 0
        for job in range(cell.jobs if self.verify == "last" else 0):
            for slot, offset in enumerate(run.last_batch(job, cell.slots)):
                self.files.check(job, offset, reader.host_copy(job, slot))
                checked += 1
        return checked

    def _invalid_reason(self, reader: Reader, cell: Cell, cached_before: float, device: DeviceBytes) -> str | None:
        if cached_before > MAX_CACHED_FRACTION:
            return (
                f"{cached_before:.1%} of the sweep files were in the page cache before the cell (eviction did not "
                f"work, at most {MAX_CACHED_FRACTION:.0%} allowed): reads would not all come from the drive"
            )
        return cache_served_reason(f"sweep cell {cell.id}", device) or reader.invalid_reason()

    def set_outcome(self, cell: Cell, outcome: str) -> None:
        """Records the verdict the caller reached for a measured cell."""
        record = self._cells.get(cell.id)
        if record is not None:
            record["outcome"] = outcome
            self._store(cell, record)

    def _ensure_files(self) -> None:
        if self.files.written:
            return
        size = self.config.files_bytes
        self.say(
            f"ckptqual: read sweep: writing {self.config.jobs} files of {self.config.file_bytes / 2**20:,.0f} MiB "
            f"({size / 1e9:,.2f} GB, untimed) in {self.files.directory}"
        )
        started = time.monotonic()
        self.files.write(self.run)
        self.data["files"].update(write_s=time.monotonic() - started, removed=False)
        self._changed()

    def _store(self, cell: Cell, record: dict[str, Any]) -> None:
        if cell.id not in self._cells:
            self._cells[cell.id] = record
            self.data["cells"].append(record)
        elif self._cells[cell.id] is not record:
            index = self.data["cells"].index(self._cells[cell.id])
            self._cells[cell.id] = self.data["cells"][index] = record
        self._changed()

    def _changed(self) -> None:
        self._on_change(self.data)

    def remove_files(self) -> None:
        """Removes the sweep's files (a later cell writes them again)."""
        had = self.files.written
        self.files.remove(self.run)  # also what a write that failed half-way left
        if had:
            self.data["files"]["removed"] = True
            self._changed()

    def close(self) -> None:
        """Removes the files and keeps the end of cuFile's log (if cuFile wrote one) in the record."""
        self.remove_files()
        if self.cufile_log is not None and self.cufile_log.is_file():
            lines = self.cufile_log.read_text(errors="replace").splitlines()
            self.data["cufile_log_tail"] = [line for line in lines if line.strip()][-_CUFILE_LOG_LINES:]
            self._changed()


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


InFlight = deque[tuple[int, Pending]]


def read_shape(cell: Cell) -> ReadShape:
    """What a read engine sets up for `cell`."""
    return ReadShape(cell.jobs, cell.slots, cell.block_bytes, cell.threads)


def run_cell(
    reader: Reader, cell: Cell, starts: Sequence[int], file_bytes: int, check_block: CheckBlock | None = None
) -> CellRun:
    """Drives one cell: each job in its own submitter thread, all released at once, `cell.slots` reads per
    batch and the next batch only when the whole batch is done; a semaphore of `cell.threads` permits keeps at
    most `threads` reads in flight across the jobs, so the engine's `threads` workers never queue a read.

    A job that cannot get a permit collects its own oldest read and frees that permit; one that has nothing in
    flight waits for a permit, so the jobs cannot starve each other. A read's latency is the engine's: from
    issue to completion (see Pending.wait). `check_block(job, offset, data)`, if given, checks every block
    after its batch, inside the timed loop (for tests). An engine that runs cells itself (`CellReader`) gets the
    same schedule and rules."""
    if isinstance(reader, CellReader):
        return _engine_cell(reader, cell, starts, file_bytes, check_block)
    loop = _CellLoop(reader, cell, starts, file_bytes, check_block)
    workers = [
        threading.Thread(target=loop.run_job, args=(job,), name=f"ckptqual-sweep-job-{job}") for job in range(cell.jobs)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if loop.errors:
        raise loop.errors[0]
    return loop.result(file_bytes)


def _engine_cell(
    reader: CellReader, cell: Cell, starts: Sequence[int], file_bytes: int, check_block: CheckBlock | None
) -> CellRun:
    offsets = [
        cells.job_offsets(starts[job], cell.requests_per_job, cell.block_bytes, file_bytes) for job in range(cell.jobs)
    ]
    reads = reader.read_cell(offsets, cell.slots, check_block)
    return CellRun(
        bytes=sum(reads.bytes_per_job),
        seconds=(reads.finished_ns - reads.started_ns) / 1e9,
        latencies_ns=reads.latencies_ns.reshape(-1),
        offsets=offsets,
        next_starts=[cells.next_start(mine, cell.block_bytes, file_bytes) for mine in offsets],
        verified_requests=reads.verified,
    )


class _CellLoop:
    """The state a cell's job threads share, and the steps each job runs."""

    def __init__(
        self, reader: Reader, cell: Cell, starts: Sequence[int], file_bytes: int, check_block: CheckBlock | None
    ) -> None:
        self.reader, self.cell, self.check_block = reader, cell, check_block
        count = cell.requests_per_job
        self.offsets = [cells.job_offsets(starts[job], count, cell.block_bytes, file_bytes) for job in range(cell.jobs)]
        self.latencies = np.zeros((cell.jobs, count), dtype=np.int64)
        self.read_bytes, self.verified, self.finished = [0] * cell.jobs, [0] * cell.jobs, [0] * cell.jobs
        self.errors: list[BaseException] = []
        self.started: list[int] = []
        self.permits = threading.Semaphore(cell.threads)
        self.barrier = threading.Barrier(cell.jobs, action=lambda: self.started.append(time.perf_counter_ns()))

    def run_job(self, job: int) -> None:
        """One job's thread: waits at the barrier with the others, then runs its batches; keeps its error."""
        try:
            self.barrier.wait()
        except threading.BrokenBarrierError:
            return
        try:
            for first in range(0, len(self.offsets[job]), self.cell.slots):
                self._run_batch(job, first)
        except BaseException as error:
            self.errors.append(error)
        finally:
            self.finished[job] = time.perf_counter_ns()

    def _run_batch(self, job: int, first: int) -> None:
        """Submits the job's batch from request `first` and collects all of it, then raises its first problem or
        checks its blocks."""
        batch = self.offsets[job][first : first + self.cell.slots]
        in_flight: InFlight = deque()
        problem: BaseException | None = None
        slot = 0
        while slot < len(batch) or in_flight:
            if problem is None and slot < len(batch) and self.permits.acquire(blocking=not in_flight):
                problem = self._submit(job, slot, batch[slot], in_flight)
                slot += 1
            elif in_flight:
                found = self._collect(job, first, batch, in_flight.popleft())
                problem = problem or found  # the first problem is the one reported
            else:
                break
        if problem is not None:
            raise problem
        if self.check_block is not None:
            for slot, offset in enumerate(batch):
                self.check_block(job, offset, self.reader.host_copy(job, slot))
                self.verified[job] += 1

    def _submit(self, job: int, slot: int, offset: int, in_flight: InFlight) -> ReadError | None:
        """Submits one read under the permit just taken; a refusal frees the permit and stops the batch's submits."""
        try:
            in_flight.append((slot, self.reader.submit(job, slot, offset)))
        except Exception as error:
            self.permits.release()
            return ReadError(f"job {job} offset {offset}: could not submit: {error}")
        return None

    def _collect(self, job: int, first: int, batch: list[int], read: tuple[int, Pending]) -> ReadError | None:
        """Waits for one read, frees its permit and records its latency; a failed or short read is a problem."""
        slot, pending = read
        try:
            got, issued, done = pending.wait()
        except Exception as error:  # the rest of the batch is still collected before giving up
            return ReadError(f"job {job} offset {batch[slot]}: {error}")
        finally:
            self.permits.release()
        self.latencies[job, first + slot] = done - issued
        self.read_bytes[job] += got
        if got != self.cell.block_bytes:
            return ReadError(f"job {job} offset {batch[slot]}: read {got} of {self.cell.block_bytes} bytes")
        return None

    def result(self, file_bytes: int) -> CellRun:
        block = self.cell.block_bytes
        return CellRun(
            bytes=sum(self.read_bytes),
            seconds=(max(self.finished) - self.started[0]) / 1e9,
            latencies_ns=self.latencies.reshape(-1),
            offsets=self.offsets,
            next_starts=[cells.next_start(mine, block, file_bytes) for mine in self.offsets],
            verified_requests=sum(self.verified),
        )
