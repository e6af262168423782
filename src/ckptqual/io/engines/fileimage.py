"""A window onto a file being written: bytes are placed in one reused, page-aligned buffer at their file offsets
and written out in whole 4 KiB blocks, so that a file's many small records cost one write() and the payload is
generated in place. With `direct`, the file is opened O_DIRECT and every write is aligned in offset, length and
memory, as a direct-I/O (or GDS) checkpoint writer's is. Given a spare window and lanes with a helper, a full
window is written behind, on the helper, while the payload is generated into the other. With `writeback` (a number
of bytes), the writeback of every that many bytes written out is started at once (io.writeback), so that the drive
writes the file while the rest of it is generated rather than at its fsync."""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

import numpy as np

from ckptqual.io.lanes import Lanes
from ckptqual.io.writeback import start_writeback

BLOCK = 4096


def aligned_buffer(size: int) -> np.ndarray:
    """`size` bytes (rounded up to BLOCK) of page-aligned anonymous memory, as uint8."""
    return np.frombuffer(mmap.mmap(-1, -(-size // BLOCK) * BLOCK), dtype=np.uint8)


class FileImage:
    """Writes one new file through `window` (page-aligned, a multiple of BLOCK, at least two blocks); `open_file(path,
    flags)` opens it (RankIO.open: never through a symlink). `behind`: a spare window like `window` and the lanes
    whose helper writes one window while the other fills (one write in flight at a time; its error is raised by
    the next write, patch or close). `writeback`: start the writeback of every `writeback` bytes written out
    once they are (buffered only; 0: never); larger than a window, it takes fewer calls and makes larger extents."""

    def __init__(
        self,
        path: Path,
        window: np.ndarray,
        open_file: Callable[[Path, int], int],
        direct: bool = False,
        behind: tuple[np.ndarray, Lanes] | None = None,
        writeback: int = 0,
    ) -> None:
        for buffer in (window, *(behind[:1] if behind else ())):
            if buffer.nbytes % BLOCK or buffer.nbytes < 2 * BLOCK or buffer.nbytes != window.nbytes:
                raise ValueError(
                    f"window of {buffer.nbytes} bytes: must be a multiple of {BLOCK}, at least {2 * BLOCK}, and both "
                    "windows alike"
                )
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | (os.O_DIRECT if direct else 0)
        try:
            self.fd = open_file(path, flags)
        except OSError as error:
            if direct and error.errno == 22:  # EINVAL: the filesystem refuses O_DIRECT (tmpfs before Linux 6.6)
                raise OSError(
                    error.errno, f'{error.strerror}: O_DIRECT is not supported here; set engine = "stream"', str(path)
                ) from None
            raise
        self.window, self.direct = window, direct
        self.writeback = 0 if direct else writeback  # direct I/O leaves no dirty pages
        self._unstarted = 0  # the file offset from which no writeback was started yet
        self._behind = behind if behind is not None and behind[1].count > 1 else None
        self._in_flight: Future | None = None
        self.base = 0  # file offset of window[0]; a multiple of BLOCK
        self.fill = 0  # bytes placed in the window
        self._pinned: tuple[int, bytes] = (0, b"")  # (offset, bytes before it in its block) of what `patch` replaces

    @property
    def position(self) -> int:
        """The file offset of the next byte placed."""
        return self.base + self.fill

    def put(self, data: bytes) -> None:
        """Places `data` at `position`."""
        view = memoryview(data)
        while view.nbytes:
            if self.fill == self.window.nbytes:
                self._flush()
            count = min(view.nbytes, self.window.nbytes - self.fill)
            self.window[self.fill : self.fill + count] = np.frombuffer(view[:count], dtype=np.uint8)
            self.fill += count
            view = view[count:]

    def space(self) -> np.ndarray:
        """The free part of the window (at least one block: writes out what is full first), to fill in place."""
        if self.window.nbytes - self.fill < BLOCK:
            self._flush()
        return self.window[self.fill :]

    def advance(self, count: int) -> None:
        """Counts `count` bytes filled in at the start of `space()` as placed."""
        self.fill += count

    def pin(self) -> None:
        """Marks `position` as the start of bytes that `patch` will replace once they are placed; under direct
        I/O keeps the bytes before it in its block, which a rewrite of the block needs."""
        start = self.position // BLOCK * BLOCK
        self._pinned = (self.position, self.window[start - self.base : self.fill].tobytes() if self.direct else b"")

    def patch(self, data: bytes) -> None:
        """Replaces the bytes placed from the pinned offset on with `data`, in the window or in the file; under
        direct I/O they must end on a block boundary (a tensor's header ends where its aligned data starts)."""
        offset, before = self._pinned
        start = offset - len(before)
        if self.direct and (offset + len(data)) % BLOCK:
            raise ValueError(f"patch at {offset} of {len(data)} bytes must end on a {BLOCK}-byte boundary")
        if offset >= self.base:
            self.window[offset - self.base : offset - self.base + len(data)] = np.frombuffer(data, dtype=np.uint8)
            return
        self._settle()  # the bytes replaced may be in the write in flight
        if not self.direct:
            os.pwrite(self.fd, data, offset)
        else:  # rewrite whole blocks: direct I/O writes no less; those from `base` on are still in the window
            blocks = aligned_buffer(len(before) + len(data))
            blocks[: len(before) + len(data)] = np.frombuffer(before + data, dtype=np.uint8)
            written = min(self.base, start + blocks.nbytes) - start
            self._pwrite(blocks[:written], start)
            rest = len(before) + len(data) - written
            if rest > 0:
                self.window[:rest] = blocks[written : written + rest]

    def _flush(self) -> None:
        """Writes out the window's whole blocks (behind, where it can) and keeps the rest (under a block) at the
        start of the window that fills next."""
        whole = self.fill // BLOCK * BLOCK
        rest = self.fill - whole
        if self._behind is None:
            self._write_out(self.window[:whole], self.base)
            self.window[:rest] = self.window[whole : self.fill]
        else:
            self._settle()  # the spare window's write is done: it may fill again
            spare, helpers = self._behind
            full, self.window = self.window, spare
            self._behind = (full, helpers)
            self.window[:rest] = full[whole : self.fill]
            self._in_flight = helpers.submit(self._write_out, full[:whole], self.base)
        self.base, self.fill = self.base + whole, rest

    def _settle(self) -> None:
        """Waits for the write in flight; raises its error."""
        if self._in_flight is not None:
            in_flight, self._in_flight = self._in_flight, None
            in_flight.result()

    def _write_out(self, data: np.ndarray, offset: int) -> None:
        """Writes a full window's blocks at `offset` and, with `writeback`, starts the writeback of what is written
        and not under way once it is `writeback` bytes or more (one write out at a time: no lock)."""
        self._pwrite(data, offset)
        end = offset + data.nbytes
        if self.writeback and end - self._unstarted >= self.writeback:
            start_writeback(self.fd, self._unstarted, end - self._unstarted)
            self._unstarted = end

    def _pwrite(self, data: np.ndarray, offset: int) -> None:
        view = data.data
        while view.nbytes:
            written = os.pwrite(self.fd, view, offset)
            view, offset = view[written:], offset + written

    def close(self) -> None:
        """Writes out what is left and closes; under direct I/O the last block is padded, then cut to size."""
        try:
            self._settle()
            size = self.position
            if self.direct:
                tail = -self.fill % BLOCK
                self.window[self.fill : self.fill + tail] = 0
                self._pwrite(self.window[: self.fill + tail], self.base)
                os.ftruncate(self.fd, size)
            else:
                self._pwrite(self.window[: self.fill], self.base)
        finally:
            self.abandon()

    def abandon(self) -> None:
        """Closes without writing more, once the write in flight (whose error is moot now) has ended."""
        with contextlib.suppress(OSError):
            self._settle()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
