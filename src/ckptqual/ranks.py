"""Rank workers: one process per simulated GPU, released together at a barrier, timed on one clock.

A checkpoint's time runs from the common start until the slowest rank has its files written and
fsynced, directories included. A rank that dies or hangs fails the checkpoint within a bounded time,
and every worker is stopped; none is left behind.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from ckptqual import raw, restore
from ckptqual.engines import make_engine
from ckptqual.engines.base import DEFAULT_CHUNK_BYTES, RankIO, fsync_directory, fsync_path
from ckptqual.payload import PayloadGenerator
from ckptqual.plan import RankPlan

_STOP_GRACE_S = 5.0
_START_TIMEOUT_S = 300.0  # spawning ranks imports torch in each: slow on a loaded host


class RankFailure(RuntimeError):
    """A rank could not finish its part: it raised, died, or ran past the timeout."""


@dataclass(frozen=True)
class RankTiming:
    """One rank's share of a checkpoint, on the common clock, relative to the common start."""

    rank: int
    done_s: float
    bytes: int
    files: int
    payload_cpu_s: float


@dataclass(frozen=True)
class CheckpointTiming:
    """When the ranks of one checkpoint finished; the slowest decides the checkpoint time."""

    ranks: tuple[RankTiming, ...]

    @property
    def seconds(self) -> float:
        return max(r.done_s for r in self.ranks)

    @property
    def first_done_s(self) -> float:
        return min(r.done_s for r in self.ranks)

    @property
    def bytes(self) -> int:
        return sum(r.bytes for r in self.ranks)

    @property
    def generated_GBps(self) -> float:
        """How fast the ranks could make payload together on this host's cores, had they done nothing else."""
        cores = min(len(os.sched_getaffinity(0)), len(self.ranks))
        wall = sum(r.payload_cpu_s for r in self.ranks) / cores
        return self.bytes / wall / 1e9 if wall > 0 else float("inf")


@dataclass
class _Task:
    op: str
    checkpoint: int = 0
    directory: str = ""
    plan: RankPlan | None = None
    options: dict[str, Any] = field(default_factory=dict)


def _write_files(io: RankIO, task: _Task) -> int:
    """Writes the rank's files of one checkpoint with the task's engine, then fsyncs files and directories.

    Syncing once all files are written, not after each, lets the filesystem batch the journal commits of a
    rank's many small files; the rank is done only when everything it wrote is durable.
    """
    engine = make_engine(task.options["engine"])
    directory, plan = Path(task.directory), task.plan
    paths = [directory / spec.path for spec in plan.files]
    parents = sorted({path.parent for path in paths})
    for parent in parents:
        parent.mkdir(parents=True, exist_ok=True)
    for index, (path, spec) in enumerate(zip(paths, plan.files, strict=True)):
        engine.write(path, spec, index, io)
    for path in paths:
        fsync_path(path)
    for parent in parents:
        fsync_directory(parent)
    return plan.nbytes


_OPERATIONS: dict[str, Callable[[RankIO, _Task], int]] = {
    "write": _write_files,
    "raw-write": raw.write_sequential,
    "raw-read": raw.read_sequential,
    "read": restore.read_checkpoint_files,
}


def _worker(rank: int, seed: int, chunk_bytes: int, conn: Connection, barrier: Any) -> None:
    """A rank's loop: wait for a task, meet the others at the barrier, do it, report; ends with its parent."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides what an interrupt stops
    io = RankIO(PayloadGenerator(seed), rank=rank, chunk_bytes=chunk_bytes)
    with contextlib.suppress(EOFError, OSError):  # the parent is gone: nothing left to report to
        conn.send({"ready": True})
        while (task := conn.recv()).op != "stop":
            conn.send(_run_task(io, task, barrier))


def _run_task(io: RankIO, task: _Task, barrier: Any) -> dict[str, Any]:
    io.checkpoint, io.payload_cpu_s, io.generated_bytes = task.checkpoint, 0.0, 0
    try:
        barrier.wait()
        start = time.monotonic()
        moved = _OPERATIONS[task.op](io, task)
        return {"start": start, "end": time.monotonic(), "bytes": moved, "payload_cpu_s": io.payload_cpu_s}
    except Exception as error:
        return {
            "error": f"{type(error).__name__}: {error}",
            "errno": getattr(error, "errno", None),
            "trace": traceback.format_exc(),
        }


class RankPool:
    """A fixed set of rank processes that write checkpoints on command."""

    def __init__(self, ranks: int, seed: int, timeout_s: float = 600.0, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> None:
        self.ranks, self.seed, self.timeout_s = ranks, seed, timeout_s
        context = mp.get_context("spawn")
        self._barrier = context.Barrier(ranks)
        self._conns: list[Connection] = []
        self._procs: list[mp.process.BaseProcess] = []
        self._lock = threading.Lock()
        self.stopped: str | None = None
        for rank in range(ranks):
            parent, child = context.Pipe()
            proc = context.Process(
                target=_worker,
                args=(rank, seed, chunk_bytes, child, self._barrier),
                name=f"ckptqual-rank{rank}",
                daemon=True,
            )
            proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)
        try:
            self._collect("start-up", max(timeout_s, _START_TIMEOUT_S))
        except BaseException:
            self.close()
            raise

    def write_checkpoint(
        self, directory: Path, checkpoint: int, plans: tuple[RankPlan, ...], engine: str
    ) -> CheckpointTiming:
        """Every rank writes its files of one checkpoint into `directory`; raises RankFailure on any failure."""
        make_engine(engine)  # an unknown name fails here, not in every worker
        return self.run("write", directory, plans, f"checkpoint {checkpoint}", checkpoint, {"engine": engine})

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
        if self.stopped:
            raise RankFailure(f"not run: the ranks were stopped after {self.stopped}")
        plans = plans if plans is not None else (None,) * self.ranks
        if len(plans) != self.ranks:
            raise ValueError(f"plan has {len(plans)} ranks, pool has {self.ranks}")
        with self._lock:
            try:
                for conn, plan in zip(self._conns, plans, strict=True):
                    conn.send(_Task(op, checkpoint, str(directory), plan, options or {}))
                replies = self._collect(what)
            except (KeyboardInterrupt, SystemExit):
                self.close(grace_s=0)
                raise
        start = min(r["start"] for r in replies)
        timings = tuple(
            RankTiming(
                rank, r["end"] - start, r["bytes"], len(plans[rank].files) if plans[rank] else 0, r["payload_cpu_s"]
            )
            for rank, r in enumerate(replies)
        )
        return CheckpointTiming(timings)

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
                    raise self._stop(f"rank {rank} died during {what} (exit code {proc.exitcode})")
            if time.monotonic() > deadline:
                late = [rank for rank, r in enumerate(replies) if r is None]
                raise self._stop(
                    f"rank(s) {late} did not finish {what} within {timeout_s:g} s; "
                    f"raise --rank-timeout if the drive is that slow"
                )
        failed = [(rank, r) for rank, r in enumerate(replies) if "error" in r]
        if failed:
            rank, reply = failed[0]
            error = RankFailure(f"rank {rank} failed during {what}: {reply['error']}")
            error.errno = reply.get("errno")  # type: ignore[attr-defined]
            raise error
        return replies  # type: ignore[return-value]

    def _stop(self, reason: str) -> RankFailure:
        """Stops every rank at once after `reason`; later calls fail with it instead of touching dead ranks."""
        self.stopped = reason
        self.close(grace_s=0)
        return RankFailure(reason)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs if p.pid is not None]

    def close(self, grace_s: float = _STOP_GRACE_S) -> None:
        """Stops every rank: politely for `grace_s`, then by force; no process outlives this call."""
        for conn in self._conns:
            with contextlib.suppress(OSError, ValueError):
                conn.send(_Task("stop"))
        self._barrier.abort()
        deadline = time.monotonic() + grace_s
        for proc in self._procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in self._procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(1.0)
            if proc.is_alive():
                os.kill(proc.pid, signal.SIGKILL)
                proc.join()
        for conn in self._conns:
            conn.close()

    def __enter__(self) -> RankPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
