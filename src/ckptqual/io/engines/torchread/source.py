"""A checkpoint file's bytes by offset, for the archive checks and the read-back."""

from __future__ import annotations

import os
from collections.abc import Generator, Iterable
from pathlib import Path

import numpy as np

from ckptqual.io.engines.base import IntegrityError, ReadBackError
from ckptqual.io.lanes import Lanes


class FileSource:
    """A file's bytes by offset: read whole into `buffer` in one request where it fits, else by offset
    (structures into small buffers, tensor chunks into `buffer`)."""

    def __init__(self, fd: int, label: str, buffer: np.ndarray) -> None:
        self._fd, self._label = fd, label
        self.size = os.fstat(fd).st_size
        self._whole = buffer[: self.size] if self.size <= buffer.nbytes else None
        self._buffer = buffer
        if self._whole is not None:
            pread_exactly(fd, self._whole, 0, label)

    def read(self, offset: int, length: int) -> bytes:
        if self._whole is not None:
            return self._whole[offset : offset + length].tobytes()
        data = np.empty(length, dtype=np.uint8)
        pread_exactly(self._fd, data, offset, self._label)
        return data.tobytes()

    def chunk(self, offset: int, length: int) -> np.ndarray:
        """`length` bytes from `offset`, a view of `buffer` (valid until the next chunk)."""
        if self._whole is not None:
            return self._whole[offset : offset + length]
        chunk = self._buffer[:length]
        pread_exactly(self._fd, chunk, offset, self._label)
        return chunk

    def chunks(self, spans: Iterable[tuple[int, int]], ahead: tuple[np.ndarray, Lanes] | None) -> Generator[np.ndarray]:
        """The bytes of each (offset, length) span in turn, each a view valid until the next. `ahead`: a spare
        buffer like `buffer` and lanes whose helper reads the next span into one while the other is checked."""
        if ahead is None or ahead[1].count == 1 or self._whole is not None:
            for offset, length in spans:
                yield self.chunk(offset, length)
            return
        spare, helpers = ahead
        buffers = (self._buffer, spare[: self._buffer.nbytes])
        pending = iter(spans)
        nxt = next(pending, None)
        in_flight = None
        turn = 0
        try:
            if nxt is not None:
                in_flight = helpers.submit(pread_exactly, self._fd, buffers[turn][: nxt[1]], nxt[0], self._label)
            while nxt is not None:
                length = nxt[1]
                if in_flight is None:
                    raise RuntimeError(f"{self._label}: the span at {nxt[0]} was taken before its read was submitted")
                in_flight.result()  # raises the read's error
                ready, in_flight = buffers[turn][:length], None
                nxt, turn = next(pending, None), 1 - turn
                if nxt is not None:
                    chunk = buffers[turn][: nxt[1]]
                    in_flight = helpers.submit(pread_exactly, self._fd, chunk, nxt[0], self._label)
                yield ready
        finally:  # stopped early or failed: the read in flight must end before its buffer or descriptor is reused
            if in_flight is not None:
                in_flight.exception()


def pread_exactly(fd: int, chunk: np.ndarray, file_offset: int, path: Path | str) -> None:
    """Fills `chunk` from `file_offset`; a failed read is a ReadBackError, an early end of file an IntegrityError."""
    done = 0
    view = chunk.data
    while done < chunk.nbytes:
        try:
            count = os.preadv(fd, [view[done:]], file_offset + done)
        except OSError as error:
            raise ReadBackError(
                error.errno, f"{path}: I/O error at file offset {file_offset + done}: {error.strerror}"
            ) from error
        if count == 0:
            raise IntegrityError(
                f"{path}: truncated: the file is {file_offset + done} bytes, "
                f"the plan needs at least {file_offset + chunk.nbytes}"
            )
        done += count
