"""Rank workers: one process per simulated GPU, released together at a barrier, timed on one clock.

A checkpoint's time runs from the common start until the slowest rank has its files written and
fsynced, directories included. A rank that dies or hangs fails the checkpoint within a bounded time,
and every worker is stopped; none is left behind, and none can hold the main process: a rank stuck in
the kernel on a drive that stopped answering is killed and abandoned, not waited for.
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

from ckptqual.faults import RunError, fault_of_errno, on_path, os_error_line
from ckptqual.host.cpu import HostSampler, HostUse, Mark
from ckptqual.io.engines import make_engine
from ckptqual.io.engines.base import DEFAULT_CHUNK_BYTES, RankIO, fsync_directory, fsync_path
from ckptqual.io.payload import PayloadGenerator
from ckptqual.plan.model import RankPlan
from ckptqual.runs import raw, restore

_STOP_GRACE_S = 5.0
_TERM_WAIT_S = 0.5
_KILL_WAIT_S = 2.0  # after SIGKILL: a process still alive then is stuck in the kernel and is abandoned
_START_TIMEOUT_S = 300.0  # spawning ranks imports torch in each: slow on a loaded host


class RankFailure(RunError):
    """A rank could not finish its part: it raised, died, or ran past the timeout; `fault` says whose fault."""


@dataclass(frozen=True)
class RankTiming:
    """One rank's share of a checkpoint, on the common clock, relative to the common start."""

    rank: int
    done_s: float
    bytes: int
    files: int
    payload_cpu_s: float
    cpu_s: float  # user+system CPU seconds of the rank's process over its timed part (all its threads)


@dataclass(frozen=True)
class CheckpointTiming:
    """When the ranks of one checkpoint finished; the slowest decides the checkpoint time. `host`: what the host's
    CPUs and the drive did meanwhile, the ranks' CPU seconds included."""

    ranks: tuple[RankTiming, ...]
    host: HostUse

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
    sampler: HostSampler | None = None


def directories_to_sync(directory: Path, file_paths: list[str]) -> list[Path]:
    """Every directory a checkpoint's files create or change: each file's parent up to the checkpoint directory,
    and the directory that holds the checkpoint directory (it gains its entry); deepest first."""
    chain = {directory, directory.parent}
    for relative in file_paths:
        chain.update((directory / relative).parents)
    return sorted((d for d in chain if d == directory.parent or directory in (d, *d.parents)), key=_depth, reverse=True)


def _depth(path: Path) -> int:
    return len(path.parts)


def _write_files(io: RankIO, task: _Task) -> int:
    """Writes the rank's files of one checkpoint with the task's engine, then fsyncs files and directories.

    The rank creates the directories it needs, so that the main process never waits on the drive. Syncing
    once all files are written, not after each, lets the filesystem batch the journal commits of a rank's
    many small files; the rank is done only when everything it wrote is durable, every directory whose
    entries changed included (the checkpoint's own and the one that holds it).
    """
    engine = make_engine(task.options["engine"])
    directory, plan = Path(task.directory), task.plan
    paths = [directory / spec.path for spec in plan.files]
    io.stage = "mkdir"
    directory.mkdir(parents=True, exist_ok=True)
    for parent in sorted({path.parent for path in paths}):
        parent.mkdir(parents=True, exist_ok=True)
    io.stage = "write"
    for index, (path, spec) in enumerate(zip(paths, plan.files, strict=True)):
        try:
            engine.write(path, spec, index, io)
        except OSError as error:
            raise on_path(error, path) from None
    io.stage = "fsync"
    for path in paths:
        fsync_path(path)
    for parent in directories_to_sync(directory, [spec.path for spec in plan.files]):
        fsync_directory(parent)
    return plan.nbytes


_OPERATIONS: dict[str, Callable[[RankIO, _Task], int]] = {
    "write": _write_files,
    "raw-write": raw.write_sequential,
    "raw-read": raw.read_sequential,
    "read": restore.read_checkpoint_files,
}
# Checks that follow an operation outside its timed region; their reply fields join the operation's.
_AFTER_TIMING: dict[str, Callable[[RankIO, _Task], dict[str, Any]]] = {"read": restore.load_sample}


def _worker(rank: int, seed: int, chunk_bytes: int, conn: Connection, barrier: Any) -> None:
    """A rank's loop: wait for a task, meet the others at the barrier, do it, report; ends with its parent."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides what an interrupt stops
    io = RankIO(PayloadGenerator(seed), rank=rank, chunk_bytes=chunk_bytes)
    with contextlib.suppress(EOFError, OSError):  # the parent is gone: nothing left to report to
        conn.send({"ready": True})
        while (task := conn.recv()).op != "stop":
            conn.send(_run_task(io, task, barrier))


def _run_task(io: RankIO, task: _Task, barrier: Any) -> dict[str, Any]:
    io.checkpoint, io.payload_cpu_s, io.generated_bytes, io.stage = task.checkpoint, 0.0, 0, task.op
    try:
        barrier.wait()
        first = task.sampler.mark()
        cpu_start = time.process_time()
        moved = _OPERATIONS[task.op](io, task)
        cpu_s = time.process_time() - cpu_start
        last = task.sampler.mark()
        reply = {"start": first.wall, "end": last.wall, "bytes": moved, "payload_cpu_s": io.payload_cpu_s}
        reply |= {"cpu_s": cpu_s, "marks": (first, last)}
        return reply | (_AFTER_TIMING[task.op](io, task) if task.op in _AFTER_TIMING else {})
    except Exception as error:
        return _failure_reply(error, io.stage)


def _failure_reply(error: Exception, stage: str) -> dict[str, Any]:
    """What a rank reports of an exception: one line, whose fault it is, and the errno of an I/O error."""
    if isinstance(error, RunError):
        return {"error": str(error), "fault": error.fault, "errno": error.errno}
    if isinstance(error, OSError):
        return {"error": os_error_line(error, stage), "fault": fault_of_errno(error.errno), "errno": error.errno}
    if isinstance(error, restore.IntegrityError):
        return {"error": f"{type(error).__name__}: {error}", "fault": "integrity", "errno": None}
    return {
        "error": f"{type(error).__name__}: {error}",
        "fault": "crash",
        "errno": None,
        "trace": traceback.format_exc(),
    }


_STATES = {"D": "waiting in the kernel", "T": "stopped", "t": "stopped", "Z": "exited", "R": "running", "S": "sleeping"}


def process_state(pid: int | None) -> str:
    """The state letter of a process from /proc (R, S, D, T, Z, ...), or "?" where it cannot be read."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, TypeError):
        return "?"
    return stat.rpartition(")")[2].split()[0]


def _death(proc: mp.process.BaseProcess) -> str:
    """How a rank process ended, e.g. "(PID 123) was killed by SIGKILL"."""
    code = proc.exitcode
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"(PID {proc.pid}) was killed by {signal.Signals(-code).name}"
    return f"(PID {proc.pid}) died (exit code {code})"


def end_processes(procs: list[mp.process.BaseProcess]) -> list[str]:
    """SIGTERM, then SIGKILL, each with a short wait for all at once. A process still there after that is stuck in
    the kernel: it is no longer tracked, so that neither this call nor interpreter exit waits for it. Returns one
    line per process abandoned."""
    for sig, wait_s in ((signal.SIGTERM, _TERM_WAIT_S), (signal.SIGKILL, _KILL_WAIT_S)):
        for proc in procs:
            with contextlib.suppress(ProcessLookupError, TypeError):
                os.kill(proc.pid, sig)
        deadline = time.monotonic() + wait_s
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        procs = [proc for proc in procs if proc.is_alive()]
    for proc in procs:
        mp.process._children.discard(proc)  # multiprocessing joins its children at exit; this one may never end
    return [f"{p.name} (PID {p.pid}, {_STATES.get(process_state(p.pid), '?')}) did not end on SIGKILL" for p in procs]


class RankPool:
    """A fixed set of rank processes that write checkpoints on command; `sampler` watches the host meanwhile (its
    device: the drive the ranks write to, where known)."""

    def __init__(
        self,
        ranks: int,
        seed: int,
        timeout_s: float = 600.0,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        sampler: HostSampler | None = None,
    ) -> None:
        self.ranks, self.seed, self.timeout_s = ranks, seed, timeout_s
        self.sampler = sampler or HostSampler()
        context = mp.get_context("spawn")
        self._barrier = context.Barrier(ranks)
        self._conns: list[Connection] = []
        self._procs: list[mp.process.BaseProcess] = []
        self._lock = threading.Lock()
        self.stopped: str | None = None
        self.abandoned: list[str] = []
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
        self, directory: Path, checkpoint: int, plans: tuple[RankPlan, ...], engine: str, what: str | None = None
    ) -> CheckpointTiming:
        """Every rank writes its files of one checkpoint into `directory` (`what` names it in messages); raises
        RankFailure on any failure."""
        make_engine(engine)  # an unknown name fails here, not in every worker
        what = what or f"checkpoint {checkpoint}"
        return self.run("write", directory, plans, what, checkpoint, {"engine": engine})

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
            raise RankFailure(f"not run: the ranks were stopped after {self.stopped}", "not-run")
        plans = plans if plans is not None else (None,) * self.ranks
        if len(plans) != self.ranks:
            raise ValueError(f"plan has {len(plans)} ranks, pool has {self.ranks}")
        with self._lock:
            try:
                tasks = [_Task(op, checkpoint, str(directory), plan, options or {}, self.sampler) for plan in plans]
                self._send_all(what, tasks)
                replies = self._collect(what)
            except (KeyboardInterrupt, SystemExit):
                self.close(grace_s=0)
                raise
        start = min(r["start"] for r in replies)
        timings = tuple(
            RankTiming(
                rank,
                r["end"] - start,
                r["bytes"],
                len(plans[rank].files) if plans[rank] else 0,
                r["payload_cpu_s"],
                r["cpu_s"],
            )
            for rank, r in enumerate(replies)
        )
        return CheckpointTiming(timings, self._host_use(replies))

    def _host_use(self, replies: list[dict[str, Any]]) -> HostUse:
        """The host's use over the common timed region: from the first rank's start to the last rank's end."""
        first: Mark = min((r["marks"][0] for r in replies), key=lambda mark: mark.wall)
        last: Mark = max((r["marks"][1] for r in replies), key=lambda mark: mark.wall)
        return self.sampler.use(first, last, sum(r["cpu_s"] for r in replies))

    def _send_all(self, what: str, tasks: list[_Task]) -> None:
        """Hands every rank its task; a rank that died while idle stops the pool with its rank, PID and exit code."""
        for rank, proc in enumerate(self._procs):
            if not proc.is_alive():
                raise self._stop(f"rank {rank} {_death(proc)} while idle, before {what}", "crash")
        for rank, (conn, task) in enumerate(zip(self._conns, tasks, strict=True)):
            try:
                conn.send(task)
            except OSError:  # BrokenPipeError: the rank is gone
                self._procs[rank].join(1.0)
                reason = f"rank {rank} {_death(self._procs[rank])} while idle, before {what}"
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
                    raise self._stop(f"rank {rank} {_death(proc)} during {what}", "crash")
            if time.monotonic() > deadline:
                raise self._late([rank for rank, r in enumerate(replies) if r is None], what, timeout_s)
        failed = [(rank, r) for rank, r in enumerate(replies) if "error" in r]
        if failed:
            rank, reply = failed[0]
            others = f" (and {len(failed) - 1} more rank(s) failed)" if len(failed) > 1 else ""
            raise RankFailure(
                f"rank {rank} failed during {what}: {reply['error']}{others}", reply["fault"], reply.get("errno")
            )
        return replies  # type: ignore[return-value]

    def _late(self, late: list[int], what: str, timeout_s: float) -> RankFailure:
        """Stops the pool after ranks ran past the timeout; ranks stuck in the kernel mean an unresponsive drive."""
        states = {rank: process_state(self._procs[rank].pid) for rank in late}
        stuck = [rank for rank, state in states.items() if state == "D"]
        shown = ", ".join(f"{rank} ({_STATES.get(state, state)})" for rank, state in states.items())
        if stuck:
            reason = (
                f"the drive did not respond: rank(s) {shown} did not finish {what} within {timeout_s:g} s "
                f"(--rank-timeout), waiting in the kernel on I/O"
            )
            return self._stop(reason, "unresponsive")
        reason = f"rank(s) {shown} did not finish {what} within {timeout_s:g} s; raise --rank-timeout for a slow drive"
        return self._stop(reason, "stopped")

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
        kernel on an unresponsive drive) is abandoned, not waited for, and named in `abandoned`."""
        for conn in self._conns:
            with contextlib.suppress(OSError, ValueError):
                conn.send(_Task("stop"))
        self._barrier.abort()
        deadline = time.monotonic() + grace_s
        for proc in self._procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        self.abandoned += end_processes([proc for proc in self._procs if proc.is_alive()])
        for conn in self._conns:
            conn.close()
        self._conns = []

    def __enter__(self) -> RankPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
