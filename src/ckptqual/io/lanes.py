"""The threads one rank may use beside its own: helpers for native work that releases the GIL (AES-CTR keystream,
memcmp, pwrite, pread), so that one rank's payload, checks and I/O run on as many cores as the host gives it."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from ckptqual.host.cpu import usable_cores

MAX_LANES = 4  # beyond this, one rank's page-cache copies and syscalls, not its CPU work, set its pace
MIN_PIECE_BYTES = 1 << 20  # a smaller piece costs more in handing over than a helper saves


class Lanes:
    """`count` lanes: this thread and `count - 1` helper threads. `map` spreads one job's pieces over them; `submit`
    hands a background job (a write behind, a read ahead) to a helper."""

    def __init__(self, count: int = 1) -> None:
        if count < 1:
            raise ValueError(f"lanes {count}: must be at least 1")
        self.count = count
        self._pool = ThreadPoolExecutor(count - 1, thread_name_prefix="ckptqual-lane") if count > 1 else None
        self._lock = threading.Lock()
        self.helper_cpu_s = 0.0  # CPU seconds the helpers spent on `map` pieces

    def pieces(self, nbytes: int, align: int) -> list[tuple[int, int]]:
        """[start, stop) byte ranges that split `nbytes` over the lanes, each start a multiple of `align`, none
        under MIN_PIECE_BYTES (one range where the job is small or there is one lane)."""
        count = min(self.count, max(1, nbytes // MIN_PIECE_BYTES))
        step = -(-nbytes // count // align) * align
        return [(start, min(start + step, nbytes)) for start in range(0, nbytes, step)] if nbytes else []

    def map(self, work: Callable[[int, int], None], pieces: Sequence[tuple[int, int]]) -> None:
        """Runs `work(start, stop)` for every piece: the first here, the rest on helpers or, where a helper is busy
        (a write behind), here too; returns once all are done and raises the first error."""
        if self._pool is None or len(pieces) < 2:
            for start, stop in pieces:
                work(start, stop)
            return
        futures = [self._pool.submit(self._timed, work, start, stop) for start, stop in pieces[1:]]
        error: BaseException | None = None
        try:
            work(*pieces[0])
        except BaseException as raised:  # every piece is waited for before the error goes on: they share buffers
            error = raised
        for future, piece in zip(futures, pieces[1:], strict=True):
            try:
                if future.cancel():  # no helper took it yet: do it here
                    work(*piece)
                else:
                    future.result()
            except BaseException as raised:
                error = error or raised
        if error is not None:
            raise error

    def submit(self, work: Callable[..., object], *args: object) -> Future | None:
        """Starts `work(*args)` on a helper; None where there is no helper (the caller then does it itself)."""
        return self._pool.submit(work, *args) if self._pool is not None else None

    def _timed(self, work: Callable[[int, int], None], start: int, stop: int) -> None:
        began = time.thread_time()
        try:
            work(start, stop)
        finally:
            with self._lock:
                self.helper_cpu_s += time.thread_time() - began

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)


def share_of(processes: int, cores: float | None = None) -> int:
    """Lanes for each of `processes` ranks on `cores` cores (default: this host's usable cores): the cores split
    evenly, at least 1, at most MAX_LANES."""
    return max(1, min(MAX_LANES, int(usable_cores() if cores is None else cores) // max(1, processes)))


_shared = Lanes(1)


def shared() -> Lanes:
    """This process's lanes (one, this thread alone, until `use` sets more)."""
    return _shared


def use(count: int) -> Lanes:
    """Gives this process `count` lanes from now on."""
    global _shared
    if count != _shared.count:
        _shared.close()
        _shared = Lanes(count)
    return _shared


def _reset_in_child() -> None:
    """A forked child has none of its parent's helper threads: it starts with one lane."""
    global _shared
    _shared = Lanes(1)


os.register_at_fork(after_in_child=_reset_in_child)
