"""Early writeback: asks the kernel to start writing a file's dirty pages now (sync_file_range with
SYNC_FILE_RANGE_WRITE), without waiting and without a journal commit, so that the drive works while the rank makes
the rest of the file and its next file. What is durable is unchanged: the file is still fsynced before its
checkpoint counts as done."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import Any

SYNC_FILE_RANGE_WRITE = 2  # <fcntl.h>: start writeback of the range's dirty pages, do not wait


def _sync_file_range() -> Any:
    """libc's sync_file_range (Linux); None where this libc has none."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    function = getattr(libc, "sync_file_range", None)
    if function is not None:
        function.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
        function.restype = ctypes.c_int
    return function


_CALL = _sync_file_range()


def start_writeback(fd: int, offset: int = 0, nbytes: int = 0) -> None:
    """Starts writeback of the dirty pages of the open file `fd` in `nbytes` from `offset` (0: to the end of the
    file); does nothing where the kernel or libc has no sync_file_range. An error is raised as OSError, as fsync's
    would be."""
    if _CALL is None:
        return
    if _CALL(fd, offset, nbytes, SYNC_FILE_RANGE_WRITE) != 0:
        error = ctypes.get_errno()
        if error != 38:  # ENOSYS: a kernel without it (the fsync still makes the file durable)
            raise OSError(error, os.strerror(error))
