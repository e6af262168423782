"""Who waited for what during a timed figure: each of the figure's own threads' time on a CPU and time runnable but
waiting on a run queue (/proc/PID/task/TID/schedstat: ns on a CPU, ns waiting, slices), and, where the kernel keeps
it (kernel.task_delayacct = 1), time blocked on block I/O (/proc/PID/task/TID/stat field 42, in clock ticks).

A rank snapshots its own threads at the edges of its timed part (`own_threads`); the sweep, whose reading threads
start and end within a cell, is watched by a thread that snapshots them as they run (`ThreadWatch`).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

PROC = Path("/proc")
_WATCH_INTERVAL_S = 0.05  # a thread that ends between two looks loses at most this much of its counts
# (ns on a CPU, ns waiting for one, clock ticks blocked on block I/O or -1 where not kept), by thread id
Threads = dict[int, tuple[int, int, int]]


def _delayacct_on(proc: Path = PROC) -> bool:
    try:
        return (proc / "sys/kernel/task_delayacct").read_text().strip() == "1"
    except OSError:
        return False


def threads_of(pid: int, proc: Path = PROC, blkio: bool | None = None) -> Threads:
    """Every live thread of process `pid` with its counts; threads that end while being read are left out."""
    blkio = _delayacct_on(proc) if blkio is None else blkio
    found: Threads = {}
    try:
        tids = [int(entry.name) for entry in (proc / str(pid) / "task").iterdir() if entry.name.isdigit()]
    except OSError:
        return found
    for tid in tids:
        task = proc / str(pid) / "task" / str(tid)
        try:
            run_ns, wait_ns = (int(value) for value in (task / "schedstat").read_text().split()[:2])
            ticks = int((task / "stat").read_text().rpartition(")")[2].split()[39]) if blkio else -1
        except (OSError, ValueError, IndexError):
            continue
        found[tid] = (run_ns, wait_ns, ticks)
    return found


def own_threads() -> Threads:
    """This process's threads and their counts now."""
    return threads_of(os.getpid())


@dataclass(frozen=True)
class Waits:
    """What one process's threads did over `elapsed_s` of a figure: `run_s` on a CPU, `wait_s` runnable but waiting
    for one (summed over threads), `io_blocked_s` blocked on block I/O (None where the kernel does not keep it)."""

    elapsed_s: float
    run_s: float
    wait_s: float
    io_blocked_s: float | None
    threads: int

    @property
    def wait_share(self) -> float:
        """Thread-seconds waiting for a CPU per second of the figure (above 1 where several threads waited at once)."""
        return self.wait_s / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Waits:
        return cls(**{name: data[name] for name in ("elapsed_s", "run_s", "wait_s", "io_blocked_s", "threads")})


def between(before: Threads, after: Threads, elapsed_s: float) -> Waits:
    """The counts of the threads of `after` since `before` (a thread new since then counts from its start)."""
    run = wait = ticks = 0
    blkio = bool(after) and all(values[2] >= 0 for values in after.values())
    for tid, (run_ns, wait_ns, blocked) in after.items():
        old = before.get(tid, (0, 0, 0))
        run, wait, ticks = run + run_ns - old[0], wait + wait_ns - old[1], ticks + blocked - max(0, old[2])
    io = ticks / os.sysconf("SC_CLK_TCK") if blkio else None
    return Waits(elapsed_s, run / 1e9, wait / 1e9, io, len(after))


class ThreadWatch:
    """Watches this process's threads from a thread of its own, so that threads that start and end inside the
    figure are counted too (up to their last look); `stop()` gives their Waits."""

    def __init__(self, interval_s: float = _WATCH_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._blkio = _delayacct_on()
        self._first = threads_of(os.getpid(), blkio=self._blkio)
        self._last: Threads = dict(self._first)
        self._start = time.monotonic()
        self._done = threading.Event()
        self._watcher: int | None = None
        self._thread = threading.Thread(target=self._watch, name="ckptqual-thread-watch", daemon=True)
        self._thread.start()

    def _look(self) -> None:
        now = threads_of(os.getpid(), blkio=self._blkio)
        now.pop(self._watcher or -1, None)  # the watcher itself is no part of the figure
        self._last.update(now)

    def _watch(self) -> None:
        self._watcher = threading.get_native_id()
        while not self._done.wait(self.interval_s):
            self._look()

    def stop(self) -> Waits:
        self._done.set()
        self._thread.join()
        self._look()
        return between(self._first, self._last, time.monotonic() - self._start)
