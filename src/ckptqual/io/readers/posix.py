"""ckptqual's own read engine for host memory: O_DIRECT preads into page-aligned buffers from a thread pool.

Used for `cpu-only` where KvikIO cannot run (no CUDA driver library). Where the file system refuses O_DIRECT,
it reads buffered instead and says so in its settings; the sweep evicts the files before each cell either way.
Each worker runs one pread at a time, so `threads` workers keep at most `threads` reads in flight.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from ckptqual.io.readers.base import ALIGN_BYTES, HostBuffers, ReadShape

_O_DIRECT = getattr(os, "O_DIRECT", 0)


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
        count = os.preadv(fd, [view[done:]], offset + done)
        if count == 0:
            break
        done += count
    return done, issued, time.perf_counter_ns()


class PosixReader:
    """O_DIRECT (or, where refused, buffered) preads of host memory in a pool of `threads` threads."""

    engine = "posix"

    def __init__(self, transfer: str = "cpu-only") -> None:
        if transfer != "cpu-only":
            raise ValueError(f"the POSIX engine reads into host memory only (cpu-only), not {transfer}")
        self.transfer = transfer
        self._stack = contextlib.ExitStack()  # undoes what open() did, in reverse
        self._fds: list[int] = []
        self._buffers: HostBuffers | None = None
        self._pool: ThreadPoolExecutor | None = None
        self.direct_io = False
        self.direct_io_problem: str | None = None
        self._slots = self._threads = 0

    def open(self, paths: Sequence[Path], shape: ReadShape) -> None:
        self._slots, self._threads = shape.slots, shape.threads
        self._buffers = self._stack.enter_context(
            contextlib.closing(HostBuffers(shape.jobs * shape.slots, shape.block_bytes))
        )
        self.direct_io_problem = self._direct_io_problem(paths[0])
        self.direct_io = self.direct_io_problem is None
        flags = os.O_RDONLY | (_O_DIRECT if self.direct_io else 0)
        for path in paths:
            self._fds.append(os.open(path, flags))
            self._stack.callback(os.close, self._fds[-1])
        self._pool = self._stack.enter_context(ThreadPoolExecutor(shape.threads, thread_name_prefix="ckptqual-posix"))
        self._start_workers(shape.threads)

    def _direct_io_problem(self, path: Path) -> str | None:
        """Why O_DIRECT reads do not work on `path`'s file system (None: they do); some refuse only at read."""
        if not _O_DIRECT:
            return "this platform has no O_DIRECT; reading buffered"
        try:
            fd = os.open(path, os.O_RDONLY | _O_DIRECT)
        except OSError as error:
            if error.errno != errno.EINVAL:
                raise
            return f"O_DIRECT open refused on {path.parent} ({error.strerror}); reading buffered"
        try:
            os.preadv(fd, [self._buffers.view(0)[:ALIGN_BYTES]], 0)
        except OSError as error:
            if error.errno != errno.EINVAL:
                raise
            return f"O_DIRECT read refused on {path.parent} ({error.strerror}); reading buffered"
        finally:
            os.close(fd)
        return None

    def _start_workers(self, count: int) -> None:
        """Starts all `count` worker threads now, so that the first reads do not pay for thread creation."""
        barrier = threading.Barrier(count)
        for future in [self._pool.submit(barrier.wait) for _ in range(count)]:
            future.result()

    def submit(self, job: int, slot: int, offset: int) -> _Pending:
        view = self._buffers.view(job * self._slots + slot)
        return _Pending(self._pool.submit(_pread_full, self._fds[job], view, offset))

    def host_copy(self, job: int, slot: int) -> np.ndarray:
        return self._buffers.view(job * self._slots + slot)

    def settings(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "threads": self._threads,
            "direct_io": self.direct_io,
            "direct_io_problem": self.direct_io_problem,
            "buffer_alignment": ALIGN_BYTES,
        }

    def invalid_reason(self) -> str | None:
        return None

    def close(self) -> None:
        self._fds, self._buffers, self._pool = [], None, None
        self._stack.close()
