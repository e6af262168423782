"""ckptqual's own read engine for host memory: O_DIRECT preads into page-aligned buffers from `threads` threads.

Used for `cpu-only` where KvikIO cannot run (no CUDA driver library). Where the file system refuses O_DIRECT,
it reads buffered instead and says so in its settings; the sweep evicts the files before each cell either way.
Each worker runs one pread at a time, so `threads` workers keep at most `threads` reads in flight.

A cell runs psync-style, as fio's psync engine does (`read_cell`): each worker takes the next read of the cell's
schedule itself and reads it in its own thread. Handing each read to a pool and its result back (`submit`, the
driver's generic loop, which KvikIO's engine still takes) costs two thread wake-ups per read: 8K reads from tmpfs
ran at 4.3K IOPS that way and at 50K this way on this project's loaded 2-core machine (bench/read_sweep.py).

The workers are native threads (psync_cell.c, through ctypes, no GIL held while they read) where ckptqual's native
library was built at install and fits its sources (io/native); else Python threads keep the same rules, at several
microseconds of Python per read under one GIL. `settings()` says which ran, and why the native loop did not. The
two differ in one thing the rules leave open: a native worker passes over a job held at a batch boundary and takes
the next job's read, where a Python worker waits for it (psync_cell.c says why).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import itertools
import mmap
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from ckptqual.host.beneath import RunTree
from ckptqual.io.native import psync_kernel
from ckptqual.io.readers.base import ALIGN_BYTES, CellReads, CheckBlock, HostBuffers, ReadError, ReadShape

_O_DIRECT = getattr(os, "O_DIRECT", 0)
LOOPS = ("native", "python")
_WORKERS = "each thread reads the next read of the cell itself, one at a time"


class _Pending:
    def __init__(self, future: Future) -> None:
        self._future = future

    def wait(self) -> tuple[int, int, int]:
        return self._future.result()


def _pread_full(fd: int, view: np.ndarray, offset: int) -> tuple[int, int, int]:
    """Reads all of `view` from `offset` (looping over short reads); returns (bytes, issue ns, completion ns)."""
    issued = time.perf_counter_ns()
    done = 0
    size = view.nbytes
    while done < size:
        count = os.preadv(fd, [view[done:].data], offset + done)
        if count == 0:
            break
        done += count
    return done, issued, time.perf_counter_ns()


class PosixReader:
    """O_DIRECT (or, where refused, buffered) preads of host memory in a pool of `threads` threads."""

    engine = "posix"

    def __init__(self, transfer: str = "cpu-only", loop: str = "native") -> None:
        """`loop`: "native" runs cells with the native loop where it loaded, else with the Python loop (the reason
        is in `native_problem`); "python" always with the Python loop (to compare them)."""
        if transfer != "cpu-only":
            raise ValueError(f"the POSIX engine reads into host memory only (cpu-only), not {transfer}")
        if loop not in LOOPS:
            raise ValueError(f"loop must be one of {', '.join(LOOPS)}, not {loop!r}")
        self.transfer = transfer
        self._native, self.native_problem = (
            psync_kernel.load() if loop == "native" else (None, "the Python loop was asked for")
        )
        self._stack = contextlib.ExitStack()  # undoes what open() did, in reverse
        self._fds: list[int] = []
        self._buffers: HostBuffers | None = None
        self._pool: ThreadPoolExecutor | None = None
        self.direct_io = False
        self.direct_io_problem: str | None = None
        self._slots = self._threads = 0
        self._block = 0
        self.last_issued_ns: np.ndarray | None = None  # each read's issue time in the last native cell (jobs x reads)

    def open(self, tree: RunTree, paths: Sequence[Path], shape: ReadShape) -> None:
        self._slots, self._threads, self._block = shape.slots, shape.threads, shape.block_bytes
        self._buffers = self._stack.enter_context(
            contextlib.closing(HostBuffers(shape.jobs * shape.slots, shape.block_bytes))
        )
        # Each page of the buffers faulted in now, untimed, as a registered or pinned buffer would be: else a cell's
        # first reads pay for it (1M blocks from tmpfs: 64 MiB of buffers, about a third of the cell's time).
        self._buffers.array[:: mmap.PAGESIZE] = 0
        self.direct_io_problem = self._direct_io_problem(tree, paths[0])
        self.direct_io = self.direct_io_problem is None
        flags = os.O_RDONLY | (_O_DIRECT if self.direct_io else 0)
        for path in paths:
            self._fds.append(tree.open(path, flags))
            self._stack.callback(os.close, self._fds[-1])

    def _direct_io_problem(self, tree: RunTree, path: Path) -> str | None:
        """Why O_DIRECT reads do not work on `path`'s file system (None: they do); some refuse only at read."""
        if not _O_DIRECT:
            return "this platform has no O_DIRECT; reading buffered"
        try:
            fd = tree.open(path, os.O_RDONLY | _O_DIRECT)
        except OSError as error:
            if error.errno != errno.EINVAL:
                raise
            return f"O_DIRECT open refused on {path.parent} ({error.strerror}); reading buffered"
        try:
            os.preadv(fd, [self._opened().view(0)[:ALIGN_BYTES].data], 0)
        except OSError as error:
            if error.errno != errno.EINVAL:
                raise
            return f"O_DIRECT read refused on {path.parent} ({error.strerror}); reading buffered"
        finally:
            os.close(fd)
        return None

    def _opened(self) -> HostBuffers:
        """The read buffers, made by open()."""
        if self._buffers is None:
            raise RuntimeError("the posix reader reads only between open() and close()")
        return self._buffers

    def _start_pool(self) -> ThreadPoolExecutor:
        """The pool behind `submit`, started on first use with all its threads, so no read pays for their creation."""
        if self._pool is None:
            self._pool = self._stack.enter_context(
                ThreadPoolExecutor(self._threads, thread_name_prefix="ckptqual-posix")
            )
            barrier = threading.Barrier(self._threads)
            for future in [self._pool.submit(barrier.wait) for _ in range(self._threads)]:
                future.result()
        return self._pool

    def submit(self, job: int, slot: int, offset: int) -> _Pending:
        view = self._opened().view(job * self._slots + slot)
        return _Pending(self._start_pool().submit(_pread_full, self._fds[job], view, offset))

    def read_cell(self, offsets: Sequence[Sequence[int]], slots: int, check_block: CheckBlock | None) -> CellReads:
        """The cell psync-style: `threads` workers, released together, each reading the next read of the schedule."""
        if self._native is not None:
            return self._native_cell(offsets, slots, check_block)
        return self._python_cell(offsets, slots, check_block)

    def _native_cell(self, offsets: Sequence[Sequence[int]], slots: int, check_block: CheckBlock | None) -> CellReads:
        """The cell in psync_cell.c's threads. The call runs in a thread of its own, so that an interrupt (Ctrl-C,
        SIGTERM) still reaches this one at once: it asks the native workers to stop, waits for the reads in flight
        (no buffer or file may go away under them), and goes on."""
        native, buffers = self._native, self._opened()
        if native is None:
            raise RuntimeError(f"the native psync loop is not loaded: {self.native_problem}")
        jobs = len(offsets)
        counts = np.array([len(mine) for mine in offsets], dtype=np.int64)
        most = int(counts.max(initial=0))
        table = np.zeros((jobs, max(most, 1)), dtype=np.int64)  # offsets[job][index], padded to one stride
        for job, mine in enumerate(offsets):
            table[job, : len(mine)] = mine
        latencies, issued = np.zeros_like(table), np.zeros_like(table)
        fds = np.array(self._fds, dtype=np.int32)
        bytes_per_job = np.zeros(jobs, dtype=np.int64)
        result, stop_asked = psync_kernel.PsyncResult(), ctypes.c_int32(0)
        problems: list[BaseException] = []

        def batch_done(job: int, first: int, end: int) -> int:
            """Checks a job's finished batch (C calls it, ctypes takes the GIL); nonzero stops the cell."""
            try:
                for slot, offset in enumerate(offsets[job][first:end]):
                    if check_block is not None:  # else the callback is NULL: never called
                        check_block(job, offset, buffers.view(job * slots + slot))
            except BaseException as error:  # an exception must not end in ctypes' callback (it would be lost)
                problems.append(error)
                return 1
            return 0

        def call() -> None:
            try:
                int64 = psync_kernel.INT64_P
                outcome.append(
                    native.cell(
                        *(fds.ctypes.data_as(psync_kernel.INT32_P), table.ctypes.data_as(int64)),
                        *(counts.ctypes.data_as(int64), jobs, table.shape[1], slots, self._block),
                        *(buffers.array.ctypes.data, self._threads, latencies.ctypes.data_as(int64)),
                        *(issued.ctypes.data_as(int64), bytes_per_job.ctypes.data_as(int64), callback),
                        ctypes.byref(stop_asked),
                        ctypes.byref(result),
                    )
                )
            except BaseException as error:
                outcome.append(error)

        # Without check_block, a NULL callback: the native workers never take the GIL during the reads.
        callback = psync_kernel.BATCH_DONE(batch_done) if check_block is not None else psync_kernel.BATCH_DONE()
        outcome: list[int | BaseException] = []
        runner = threading.Thread(target=call, name="ckptqual-psync-native")
        runner.start()
        try:
            while runner.is_alive():  # in steps: a signal's handler runs here even if another thread took it
                runner.join(0.05)
        except BaseException:
            stop_asked.value = 1
            runner.join()
            raise
        (returned,) = outcome
        if isinstance(returned, BaseException):
            raise returned
        if returned != 0:
            raise OSError(returned, f"the native psync loop could not start its threads: {os.strerror(returned)}")
        if result.stopped_by == psync_kernel.CHECK_FAILED:
            raise problems[0]
        if result.stopped_by == psync_kernel.READ_FAILED:
            error = OSError(result.error, os.strerror(result.error))
            raise ReadError(f"job {result.job} offset {result.offset}: {error}") from error
        if result.stopped_by == psync_kernel.SHORT_READ:
            raise ReadError(f"job {result.job} offset {result.offset}: read {result.got} of {self._block} bytes")
        if result.stopped_by:
            raise ReadError(f"the native psync loop stopped the cell ({result.stopped_by})")
        self.last_issued_ns = issued[:, :most]
        per_job = [int(count) for count in bytes_per_job]
        return CellReads(per_job, latencies[:, :most], result.started_ns, result.finished_ns, result.verified)

    def _python_cell(self, offsets: Sequence[Sequence[int]], slots: int, check_block: CheckBlock | None) -> CellReads:
        """The cell in Python threads: each pread costs several microseconds of Python, under the one GIL."""
        schedule = _Schedule(offsets, slots)
        views = [self._opened().view(index) for index in range(len(offsets) * slots)]
        iovecs = [[view.data] for view in views]
        latencies = np.zeros((len(offsets), max(map(len, offsets), default=0)), dtype=np.int64)
        read_bytes = [[0] * len(offsets) for _ in range(self._threads)]  # per worker, so no two threads add to one
        finished, started = [0] * self._threads, []
        errors: list[BaseException] = []

        def work(worker: int) -> None:
            barrier.wait()
            fds, block, clock, preadv, mine = (
                self._fds,
                self._block,
                time.perf_counter_ns,
                os.preadv,
                read_bytes[worker],
            )
            try:
                while (taken := schedule.take()) is not None:
                    job, index = taken
                    offset, iovec = offsets[job][index], iovecs[job * slots + index % slots]
                    issued = clock()
                    try:
                        got = preadv(fds[job], iovec, offset)
                        if 0 < got < block:  # a short read: finish it as _pread_full does
                            got = _pread_full(fds[job], views[job * slots + index % slots], offset)[0]
                    except OSError as error:
                        raise ReadError(f"job {job} offset {offset}: {error}") from error
                    latencies[job, index] = clock() - issued
                    mine[job] += got
                    if got != block:
                        raise ReadError(f"job {job} offset {offset}: read {got} of {block} bytes")
                    batch = schedule.done(job)
                    if batch is not None:
                        if check_block is not None:
                            for slot, checked in enumerate(offsets[job][batch[0] : batch[1]]):
                                check_block(job, checked, views[job * slots + slot])
                        schedule.release(job, batch, checked=check_block is not None)
            except BaseException as error:
                errors.append(error)
                schedule.stop()
            finally:
                finished[worker] = clock()

        barrier = threading.Barrier(self._threads, action=lambda: started.append(time.perf_counter_ns()))
        workers = [threading.Thread(target=work, args=(n,), name=f"ckptqual-psync-{n}") for n in range(self._threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        if errors:
            raise errors[0]
        per_job = [sum(counts) for counts in zip(*read_bytes, strict=True)]
        return CellReads(per_job, latencies, started[0], max(finished), schedule.verified)

    def host_copy(self, job: int, slot: int) -> np.ndarray:
        return self._opened().view(job * self._slots + slot)

    def settings(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "threads": self._threads,
            "workers": f"psync ({'native C' if self._native else 'Python'} threads): {_WORKERS}",
            "native_loop_problem": self.native_problem,
            "direct_io": self.direct_io,
            "direct_io_problem": self.direct_io_problem,
            "buffer_alignment": ALIGN_BYTES,
        }

    def invalid_reason(self) -> str | None:
        return None

    def close(self) -> None:
        self._fds, self._buffers, self._pool = [], None, None
        self._stack.close()


class _Schedule:
    """Which read comes next: the jobs in turn, one read each, and a job's batch of `slots` reads all done before
    any read of its next batch goes out (a worker that takes one waits for that).

    Cheap per read, as the workers share it: the order is fixed up front and handed out by one iterator (atomic
    under the GIL), and each job counts its finished reads with its own itertools.count; only a batch's end takes
    the lock, to wake the worker waiting for it."""

    def __init__(self, offsets: Sequence[Sequence[int]], slots: int) -> None:
        counts = [len(mine) for mine in offsets]
        order = [
            (job, index) for index in range(max(counts, default=0)) for job in range(len(counts)) if index < counts[job]
        ]
        self._take = iter(order).__next__
        self._counts, self._slots = counts, slots
        self._finished = [itertools.count(1) for _ in counts]  # next() = this job's reads done, this one included
        self._released = [0] * len(counts)  # reads of the job whose batches have ended
        self._ready = threading.Condition(threading.Lock())
        self._stopped = False
        self.verified = 0

    def take(self) -> tuple[int, int] | None:
        """The next (job, read index), or None once every read is taken or the cell stopped."""
        try:
            job, index = self._take()
        except StopIteration:
            return None
        first = index - index % self._slots  # its batch's first read: every read before it must be done
        if self._released[job] < first:
            with self._ready:
                while self._released[job] < first and not self._stopped:
                    self._ready.wait()
        return None if self._stopped else (job, index)

    def done(self, job: int) -> tuple[int, int] | None:
        """Counts one read of `job` done; where that ends its batch, the batch's read indices [first, end), which
        the caller must `release` (after checking its buffers, if it does)."""
        count = next(self._finished[job])
        if count % self._slots and count != self._counts[job]:
            return None
        return (count - 1) // self._slots * self._slots, count

    def release(self, job: int, batch: tuple[int, int], checked: bool) -> None:
        """Ends `job`'s `batch` (read indices [first, end)): the first read of its next batch may go out."""
        with self._ready:
            self._released[job] = batch[1]
            self.verified += batch[1] - batch[0] if checked else 0
            self._ready.notify_all()

    def stop(self) -> None:
        with self._ready:
            self._stopped = True
            self._ready.notify_all()
