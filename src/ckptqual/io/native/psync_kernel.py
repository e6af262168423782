"""The psync cell loop (psync_cell.c) as the POSIX engine calls it through ctypes: its result structure, its batch
callback and its argument types, bound to ckptqual's native library where that is built and fits its sources."""

from __future__ import annotations

import ctypes
import functools

from ckptqual.io.native import library

# What stopped a cell (psync_result.stopped_by in psync_cell.c).
READ_FAILED, SHORT_READ, CHECK_FAILED, STOP_ASKED = 1, 2, 3, 4
BATCH_DONE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int32, ctypes.c_int64, ctypes.c_int64)  # (job, first, end)
INT32_P, INT64_P = ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_int64)


class PsyncResult(ctypes.Structure):
    """struct psync_result of psync_cell.c (all int64, so no padding)."""

    _fields_ = [
        (name, ctypes.c_int64)
        for name in ("started_ns", "finished_ns", "verified", "stopped_by", "job", "offset", "error", "got")
    ]


class Loaded:
    """ckptqual_psync_cell of a loaded library, with its argument types set."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.cell = lib.ckptqual_psync_cell
        self.cell.restype = ctypes.c_int
        self.cell.argtypes = [
            *(INT32_P, INT64_P, INT64_P, ctypes.c_int32, ctypes.c_int64, ctypes.c_int32, ctypes.c_int64),
            *(ctypes.c_void_p, ctypes.c_int32, INT64_P, INT64_P, INT64_P, BATCH_DONE, ctypes.POINTER(ctypes.c_int32)),
            ctypes.POINTER(PsyncResult),
        ]


def bind(found: tuple[ctypes.CDLL | None, str | None]) -> tuple[Loaded | None, str | None]:
    """The loop of a library as `library.load_from` gives it: (loop, None), or (None, why not)."""
    lib, problem = found
    return (Loaded(lib), None) if lib is not None else (None, problem)


@functools.cache
def load() -> tuple[Loaded | None, str | None]:
    """The loop of the installed library, once per process: (loop, None), or (None, why the Python loop runs)."""
    return bind(library.load())
