"""Plain reads and writes of a file descriptor for the engines that lay files out themselves (dcp, safetensors):
whole writes, reads at an offset, and a byte-for-byte check that names the first differing offset."""

from __future__ import annotations

import os
from typing import Any

from ckptqual.io.engines.base import IntegrityError, ReadBackError


def first_difference(found: bytes, expected: bytes) -> int:
    """The offset of the first byte where `found` and `expected` differ (the shorter's length if one is a prefix)."""
    shorter = min(len(found), len(expected))
    return next((i for i in range(shorter) if found[i] != expected[i]), shorter)


def expect_bytes(fd: int, offset: int, expected: bytes, label: str, what: str) -> None:
    """Raises IntegrityError unless the file holds `expected` at `offset`; the message names `what` and where."""
    found = read_at(fd, offset, len(expected), label)
    if found != expected:
        at = first_difference(found, expected)
        raise IntegrityError(f"{label}: {what} differs from what was written at file offset {offset + at}")


def read_at(fd: int, offset: int, size: int, label: str) -> bytes:
    """Up to `size` bytes at `offset` (fewer at the end of the file); a failed read names the file and offset."""
    try:
        return os.pread(fd, size, offset)
    except OSError as error:
        raise ReadBackError(error.errno, f"{error.strerror} reading {size} bytes at offset {offset}", label) from None


def read_into(fd: int, out: Any, offset: int, label: str) -> None:
    """Fills `out` (a uint8 array) from `offset`; a file that ends first is an IntegrityError."""
    done = 0
    while done < out.nbytes:
        try:
            count = os.preadv(fd, [out[done:]], offset + done)
        except OSError as error:
            raise ReadBackError(error.errno, f"{error.strerror} at offset {offset + done}", label) from None
        if count == 0:
            raise IntegrityError(f"{label}: ends at offset {offset + done}, {offset + out.nbytes} bytes written")
        done += count
