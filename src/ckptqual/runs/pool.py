"""Rank pools: one process per simulated GPU, released together at a barrier, timed on one clock.

A checkpoint's time runs from the common start until the slowest rank has its files written and
fsynced, directories included. A rank that dies or hangs fails the checkpoint within a bounded time,
and every worker is stopped; none is left behind, and none can hold the main process: a rank stuck in
the kernel on a drive that stopped answering is killed and abandoned, not waited for.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import threading
import time
from abc import ABC, abstractmethod
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from ckptqual.host.beneath import RunRoot
from ckptqual.host.cpu import HostSampler
from ckptqual.io.engines import make_engine
from ckptqual.io.engines.base import DEFAULT_CHUNK_BYTES
from ckptqual.io.lanes import share_of
from ckptqual.plan.model import RankPlan
from ckptqual.runs.failure import RankFailure, failure_of
from ckptqual.runs.processes import death, end_processes, late_reason, process_state
from ckptqual.runs.task import Task
from ckptqual.runs.timing import CheckpointTiming, host_use, rank_timings
from ckptqual.runs.worker import serve

_STOP_GRACE_S = 5.0
START_TIMEOUT_S = 300.0  # the fork server first imports torch: slow on a loaded host


class Pool(ABC):
    """What runs the ranks: every rank does an operation of `runs.worker.OPERATIONS` from a common start, timed
    (`run`); RankPool on this host, runs.cluster.NodePool on several nodes. `stopped`: why it was stopped;
    `abandoned`: processes left."""

    ranks: int
    sampler: HostSampler
    stopped: str | None
    abandoned: list[str]

    @abstractmethod
    def run(
        self,
        op: str,
        directory: Path,
        plans: tuple[RankPlan, ...] | None,
        what: str,
        checkpoint: int = 0,
        options: dict[str, Any] | None = None,
    ) -> CheckpointTiming:
        """Every rank does `op` (on its plan, if any) from a common start; the slowest rank's end is the time."""

    @abstractmethod
    def close(self) -> None:
        """Stops every rank; a process that cannot be ended is named in `abandoned`."""

    @property
    @abstractmethod
    def pids(self) -> list[int]:
        """The PIDs of the rank processes on this host."""

    def write_checkpoint(
        self, directory: Path, checkpoint: int, plans: tuple[RankPlan, ...], engine: str, what: str | None = None
    ) -> CheckpointTiming:
        """Every rank writes its files of one checkpoint into `directory` (`what` names it in messages); raises
        RankFailure on any failure."""
        make_engine(engine)  # an unknown name fails here, not in every worker
        what = what or f"checkpoint {checkpoint}"
        return self.run("write", directory, plans, what, checkpoint, {"engine": engine})

    def _plans(self, plans: tuple[RankPlan, ...] | None) -> tuple[RankPlan | None, ...]:
        """The plan of every rank for a new task (None each where the task has none); fails once stopped."""
        if self.stopped:
            raise RankFailure(f"not run: the ranks were stopped after {self.stopped}", "not-run")
        per_rank: tuple[RankPlan | None, ...] = plans if plans is not None else (None,) * self.ranks
        if len(per_rank) != self.ranks:
            raise ValueError(f"plan has {len(per_rank)} ranks, pool has {self.ranks}")
        return per_rank

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RankPool(Pool):
    """A fixed set of rank processes that write checkpoints on command; `sampler` watches the host meanwhile (its
    device: the drive the ranks write to, where known); `root`: the run directory every task's entries are reached
    from (without one, each task's from the deepest existing directory above its own); `lanes`: the threads each rank
    may use (default: its share of this host's usable cores)."""

    def __init__(
        self,
        ranks: int,
        seed: int,
        timeout_s: float = 600.0,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        sampler: HostSampler | None = None,
        root: RunRoot | None = None,
        lanes: int | None = None,
    ) -> None:
        self.ranks, self.seed, self.timeout_s, self.root = ranks, seed, timeout_s, root
        self.sampler = sampler or HostSampler()
        # The ranks fork from multiprocessing's fork server, which imports the worker (torch with it) once for the
        # process: a rank starts in milliseconds, not in the 1.5 CPU-seconds a fresh interpreter spends importing.
        # The server's socket is a file of mode 0600 in a private directory: no other user can ask it for a process.
        context = mp.get_context("forkserver")
        context.set_forkserver_preload([serve.__module__])
        self._barrier = context.Barrier(ranks)
        self._conns: list[Connection] = []
        self._procs: list[mp.process.BaseProcess] = []
        self._lock = threading.Lock()
        self.stopped: str | None = None
        self.abandoned: list[str] = []
        self._closed = False
        for rank in range(ranks):
            parent, child = context.Pipe()
            proc = context.Process(
                target=serve,
                args=(rank, seed, chunk_bytes, lanes or share_of(ranks), child, self._barrier, os.getpid()),
                name=f"ckptqual-rank{rank}",
                daemon=True,
            )
            proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)
        try:
            self._collect("start-up", max(timeout_s, START_TIMEOUT_S))
        except BaseException:
            self.close()
            raise

    def run(
        self,
        op: str,
        directory: Path,
        plans: tuple[RankPlan, ...] | None,
        what: str,
        checkpoint: int = 0,
        options: dict[str, Any] | None = None,
    ) -> CheckpointTiming:
        """Every rank does `op` (on its plan, if any) from a common start; the slowest rank's end is the time."""
        per_rank = self._plans(plans)
        with self._lock:
            if self._barrier.broken:  # a rank broke it to release the others after its task failed (runs.save)
                self._barrier.reset()
            try:
                tasks = [
                    Task(op, checkpoint, str(directory), plan, options or {}, self.sampler, self.root)
                    for plan in per_rank
                ]
                self._send_all(what, tasks)
                replies = self._collect(what)
            except (KeyboardInterrupt, SystemExit):
                self.close(grace_s=0)
                raise
        return CheckpointTiming(rank_timings(replies, per_rank), host_use(self.sampler, replies))

    def _send_all(self, what: str, tasks: list[Task]) -> None:
        """Hands every rank its task; a rank that died while idle stops the pool with its rank, PID and exit code."""
        for rank, proc in enumerate(self._procs):
            if not proc.is_alive():
                raise self._stop(f"rank {rank} {death(proc)} while idle, before {what}", "crash")
        for rank, (conn, task) in enumerate(zip(self._conns, tasks, strict=True)):
            try:
                conn.send(task)
            except OSError:  # BrokenPipeError: the rank is gone
                self._procs[rank].join(1.0)
                reason = f"rank {rank} {death(self._procs[rank])} while idle, before {what}"
                raise self._stop(reason, "crash") from None

    def _collect(self, what: str, timeout_s: float | None = None) -> list[dict[str, Any]]:
        timeout_s = timeout_s or self.timeout_s
        deadline = time.monotonic() + timeout_s
        replies: list[dict[str, Any] | None] = [None] * self.ranks
        while any(r is None for r in replies):
            for rank, (conn, proc) in enumerate(zip(self._conns, self._procs, strict=True)):
                if replies[rank] is not None:
                    continue
                try:
                    if conn.poll(0.05):
                        replies[rank] = conn.recv()
                        continue
                except (EOFError, OSError):
                    proc.join(1.0)
                if not proc.is_alive():
                    raise self._stop(f"rank {rank} {death(proc)} during {what}", "crash")
            if time.monotonic() > deadline:
                raise self._late([rank for rank, r in enumerate(replies) if r is None], what, timeout_s)
        failure = failure_of(replies, what)  # type: ignore[arg-type]
        if failure is not None:
            raise failure
        return replies  # type: ignore[return-value]

    def _late(self, late: list[int], what: str, timeout_s: float) -> RankFailure:
        """Stops the pool after ranks ran past the timeout."""
        return self._stop(*late_reason({rank: process_state(self._procs[rank].pid) for rank in late}, what, timeout_s))

    def _stop(self, reason: str, fault: str) -> RankFailure:
        """Stops every rank at once after `reason`; later calls fail with it instead of touching dead ranks."""
        self.stopped = reason
        self.close(grace_s=0)
        return RankFailure(reason, fault)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs if p.pid is not None]

    def close(self, grace_s: float = _STOP_GRACE_S) -> None:
        """Stops every rank: politely for `grace_s`, then by force. A rank that SIGKILL cannot end (stuck in the
        kernel on an unresponsive drive) is abandoned, not waited for, and named in `abandoned` once: a second call
        (the run's own close after a stop) does nothing."""
        if self._closed:
            return
        self._closed = True
        for conn in self._conns:
            with contextlib.suppress(OSError, ValueError):
                conn.send(Task("stop"))
        # Releases the ranks waiting at the barrier, so that they read the stop. multiprocessing's abort waits until
        # every waiting rank has woken, which a stopped (SIGSTOP) or dead one never does: on a thread of its own,
        # never waited for, so that such a rank cannot hold this process.
        threading.Thread(target=self._barrier.abort, name="ckptqual-barrier-abort", daemon=True).start()
        deadline = time.monotonic() + grace_s
        for proc in self._procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        self.abandoned += end_processes([proc for proc in self._procs if proc.is_alive()])
        for conn in self._conns:
            conn.close()
        self._conns = []
