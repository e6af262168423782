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
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from ckptqual.faults import RunError, fault_of_errno, on_path, os_error_line
from ckptqual.host.beneath import PlantedEntry, RunRoot
from ckptqual.host.cpu import HostSampler, HostUse, Mark
from ckptqual.io.engines import make_engine
from ckptqual.io.engines.base import DEFAULT_CHUNK_BYTES, RankIO, fsync_directory, fsync_path
from ckptqual.io.payload import PayloadGenerator
from ckptqual.plan.model import RankPlan
from ckptqual.runs import raw, restore

_STOP_GRACE_S = 5.0
_TERM_WAIT_S = 0.5
_PARENT_POLL_S = 0.5  # how soon a rank notices that its run is gone
_KILL_WAIT_S = 2.0  # after SIGKILL: a process still alive then is stuck in the kernel and is abandoned
START_TIMEOUT_S = 300.0  # spawning ranks imports torch in each: slow on a loaded host


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
    node: int = 0  # the node it ran on (runs.cluster); its done_s runs from the common start of that node's ranks


@dataclass(frozen=True)
class NodeTiming:
    """One node's view of a checkpoint run over several nodes (runs.cluster): its host's use over its ranks' timed
    region and, for a read, the node whose files its ranks read."""

    node: int
    hostname: str
    host: HostUse
    read_from: int | None = None


@dataclass(frozen=True)
class CheckpointTiming:
    """When the ranks of one checkpoint finished; the slowest decides the checkpoint time. `host`: what the host's
    CPUs and the drive did meanwhile, the ranks' CPU seconds included."""

    ranks: tuple[RankTiming, ...]
    host: HostUse
    nodes: tuple[NodeTiming, ...] = ()  # where the ranks ran on several nodes; empty on one host

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
        """How fast the ranks could make payload together on their hosts' cores, had they done nothing else (each
        node makes its ranks' share on its own cores at once)."""
        cores = {node.node: node.host.cores for node in self.nodes} or {0: len(os.sched_getaffinity(0))}
        wall = max(
            sum(r.payload_cpu_s for r in ranks) / min(cores[node], len(ranks))
            for node, ranks in self._by_node().items()
        )
        return self.bytes / wall / 1e9 if wall > 0 else float("inf")

    def _by_node(self) -> dict[int, list[RankTiming]]:
        by_node: dict[int, list[RankTiming]] = {}
        for rank in self.ranks:
            by_node.setdefault(rank.node, []).append(rank)
        return by_node

    def node_figures(self) -> list[dict[str, Any]]:
        """Per node (none on one host): its ranks, bytes, slowest rank and time on its own clock, its host's use and,
        for a read, whose files it read."""
        figures, by_node = [], self._by_node()
        for timing in self.nodes:
            ranks = by_node[timing.node]
            slowest = max(ranks, key=lambda r: r.done_s)
            nbytes = sum(r.bytes for r in ranks)
            figures.append(
                {
                    "node": timing.node,
                    "hostname": timing.hostname,
                    "ranks": [r.rank for r in ranks],
                    "bytes": nbytes,
                    "seconds": slowest.done_s,
                    "slowest_rank": slowest.rank,
                    "GBps": nbytes / slowest.done_s / 1e9 if slowest.done_s > 0 else None,
                    "host": timing.host.to_dict(),
                    "cpu_s_per_GB": timing.host.cpu_s_per_GB(nbytes),
                    "read_files_of_node": timing.read_from,
                }
            )
        return figures


@dataclass
class Task:
    """What every rank does next: an operation of `_OPERATIONS` (or "stop") on its plan in `directory`, which lies in
    the run directory `root` (without one: the deepest existing directory above it); every entry is reached from
    there."""

    op: str
    checkpoint: int = 0
    directory: str = ""
    plan: RankPlan | None = None
    options: dict[str, Any] = field(default_factory=dict)
    sampler: HostSampler | None = None
    root: RunRoot | None = None

    def run_root(self) -> RunRoot:
        """`root`, or else the deepest directory above `directory` that exists."""
        if self.root is not None:
            return self.root
        above = Path(self.directory).parent
        while not above.is_dir():
            above = above.parent
        return RunRoot(str(above))


def directories_to_sync(directory: Path, file_paths: list[str]) -> list[Path]:
    """Every directory a checkpoint's files create or change: each file's parent up to the checkpoint directory,
    and the directory that holds the checkpoint directory (it gains its entry); deepest first."""
    chain = {directory, directory.parent}
    for relative in file_paths:
        chain.update((directory / relative).parents)
    return sorted((d for d in chain if d == directory.parent or directory in (d, *d.parents)), key=_depth, reverse=True)


def _depth(path: Path) -> int:
    return len(path.parts)


def _write_files(io: RankIO, task: Task) -> int:
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
    for parent in sorted({directory} | {path.parent for path in paths}):
        with io.directory(parent, create=True):
            pass
    io.stage = "write"
    for index, (path, spec) in enumerate(zip(paths, plan.files, strict=True)):
        try:
            engine.write(path, spec, index, io)
        except OSError as error:
            raise on_path(error, path) from None
    io.stage = "fsync"
    for path in paths:
        fsync_path(io, path)
    for parent in directories_to_sync(directory, [spec.path for spec in plan.files]):
        fsync_directory(io, parent)
    return plan.nbytes


_OPERATIONS: dict[str, Callable[[RankIO, Task], int]] = {
    "write": _write_files,
    "raw-write": raw.write_sequential,
    "raw-read": raw.read_sequential,
    "read": restore.read_checkpoint_files,
}
OPERATIONS = tuple(_OPERATIONS)  # the operations a task may name
# Checks that follow an operation outside its timed region; their reply fields join the operation's.
_AFTER_TIMING: dict[str, Callable[[RankIO, Task], dict[str, Any]]] = {"read": restore.load_sample}


def _worker(rank: int, seed: int, chunk_bytes: int, conn: Connection, barrier: Any) -> None:
    """A rank's loop: wait for a task, meet the others at the barrier, do it, report; ends with its parent."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides what an interrupt stops
    threading.Thread(target=_end_with, args=(os.getppid(),), name="ckptqual-parent-watch", daemon=True).start()
    io = RankIO(PayloadGenerator(seed), rank=rank, chunk_bytes=chunk_bytes)
    with contextlib.suppress(EOFError, OSError):  # the parent is gone: nothing left to report to
        conn.send({"ready": True})
        while (task := conn.recv()).op != "stop":
            conn.send(run_task(io, task, barrier))


def _end_with(parent: int) -> None:
    """Ends this rank once `parent` is gone (a run killed by SIGKILL): the pipe's end of file reaches a rank only
    between tasks, and one waiting at the barrier for a rank that never comes would wait forever."""
    while os.getppid() == parent:
        time.sleep(_PARENT_POLL_S)
    os._exit(1)


def run_task(io: RankIO, task: Task, barrier: Any) -> dict[str, Any]:
    """Meets the other ranks at `barrier` (anything with `wait()`), does the task timed and reports it; a failure is
    reported, never raised."""
    io.checkpoint, io.payload_cpu_s, io.generated_bytes, io.stage = task.checkpoint, 0.0, 0, task.op
    try:
        barrier.wait()
        with task.run_root().open() as io.tree:  # opened untimed, before the common start
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
    finally:
        io.tree = None


def _failure_reply(error: Exception, stage: str) -> dict[str, Any]:
    """What a rank reports of an exception: one line, whose fault it is, and the errno of an I/O error."""
    if isinstance(error, RunError):
        return {"error": str(error), "fault": error.fault, "errno": error.errno}
    if isinstance(error, PlantedEntry):
        return {"error": f"{stage}: {error}", "fault": "planted", "errno": error.errno}
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


def rank_timings(
    replies: list[dict[str, Any]], plans: tuple[RankPlan | None, ...], nodes: list[int] | None = None
) -> tuple[RankTiming, ...]:
    """Each rank's share from its reply; `nodes[rank]`: the node it ran on. Each node's ranks are timed on that node's
    clock from their common start (clocks of different nodes are not compared)."""
    nodes = nodes or [0] * len(replies)
    starts: dict[int, float] = {}
    for node, reply in zip(nodes, replies, strict=True):
        starts[node] = min(starts.get(node, reply["start"]), reply["start"])
    return tuple(
        RankTiming(
            rank,
            r["end"] - starts[node],
            r["bytes"],
            len(plan.files) if plan else 0,
            r["payload_cpu_s"],
            r["cpu_s"],
            node,
        )
        for rank, (r, plan, node) in enumerate(zip(replies, plans, nodes, strict=True))
    )


def host_use(sampler: HostSampler, replies: list[dict[str, Any]]) -> HostUse:
    """The host's use over the ranks' common timed region: from the first rank's start to the last rank's end."""
    first: Mark = min((r["marks"][0] for r in replies), key=lambda mark: mark.wall)
    last: Mark = max((r["marks"][1] for r in replies), key=lambda mark: mark.wall)
    return sampler.use(first, last, sum(r["cpu_s"] for r in replies))


def failure_of(replies: list[dict[str, Any]], what: str) -> RankFailure | None:
    """The failure of the first rank that reported one (naming how many more failed), or None."""
    failed = [(rank, r) for rank, r in enumerate(replies) if "error" in r]
    if not failed:
        return None
    rank, reply = failed[0]
    others = f" (and {len(failed) - 1} more rank(s) failed)" if len(failed) > 1 else ""
    return RankFailure(
        f"rank {rank} failed during {what}: {reply['error']}{others}", reply["fault"], reply.get("errno")
    )


def late_reason(states: dict[int, str], what: str, timeout_s: float) -> tuple[str, str]:
    """(reason, fault) for ranks that ran past the timeout, by their process state letters: ranks stuck in the kernel
    mean an unresponsive drive."""
    shown = ", ".join(f"{rank} ({_STATES.get(state, state)})" for rank, state in states.items())
    if "D" in states.values():
        reason = (
            f"the drive did not respond: rank(s) {shown} did not finish {what} within {timeout_s:g} s "
            f"(--rank-timeout), waiting in the kernel on I/O"
        )
        return reason, "unresponsive"
    return (
        f"rank(s) {shown} did not finish {what} within {timeout_s:g} s; raise --rank-timeout for a slow drive",
        "stopped",
    )


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
    """SIGTERM, then SIGKILL, each with a short wait for all at once, sent only to processes this one started. A
    process still there after that is stuck in the kernel: it is no longer tracked, so that neither this call nor
    interpreter exit waits for it. Returns one line per process abandoned."""
    for end, wait_s in ((mp.process.BaseProcess.terminate, _TERM_WAIT_S), (mp.process.BaseProcess.kill, _KILL_WAIT_S)):
        for proc in procs:  # through the process's own record: never a PID that may have passed to another process
            with contextlib.suppress(ProcessLookupError, AttributeError):
                end(proc)
        deadline = time.monotonic() + wait_s
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        procs = [proc for proc in procs if proc.is_alive()]
    for proc in procs:
        mp.process._children.discard(proc)  # multiprocessing joins its children at exit; this one may never end
    return [f"{p.name} (PID {p.pid}, {_STATES.get(process_state(p.pid), '?')}) did not end on SIGKILL" for p in procs]


class Pool(ABC):
    """What runs the ranks: every rank does an operation of `_OPERATIONS` from a common start, timed (`run`); RankPool
    on this host, runs.cluster.NodePool on several nodes. `stopped`: why it was stopped; `abandoned`: processes left."""

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
        plans = plans if plans is not None else (None,) * self.ranks
        if len(plans) != self.ranks:
            raise ValueError(f"plan has {len(plans)} ranks, pool has {self.ranks}")
        return plans

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RankPool(Pool):
    """A fixed set of rank processes that write checkpoints on command; `sampler` watches the host meanwhile (its
    device: the drive the ranks write to, where known); `root`: the run directory every task's entries are reached
    from (without one, each task's from the deepest existing directory above its own)."""

    def __init__(
        self,
        ranks: int,
        seed: int,
        timeout_s: float = 600.0,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        sampler: HostSampler | None = None,
        root: RunRoot | None = None,
    ) -> None:
        self.ranks, self.seed, self.timeout_s, self.root = ranks, seed, timeout_s, root
        self.sampler = sampler or HostSampler()
        context = mp.get_context("spawn")
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
        plans = self._plans(plans)
        with self._lock:
            try:
                tasks = [
                    Task(op, checkpoint, str(directory), plan, options or {}, self.sampler, self.root) for plan in plans
                ]
                self._send_all(what, tasks)
                replies = self._collect(what)
            except (KeyboardInterrupt, SystemExit):
                self.close(grace_s=0)
                raise
        return CheckpointTiming(rank_timings(replies, plans), host_use(self.sampler, replies))

    def _send_all(self, what: str, tasks: list[Task]) -> None:
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
        self._barrier.abort()
        deadline = time.monotonic() + grace_s
        for proc in self._procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        self.abandoned += end_processes([proc for proc in self._procs if proc.is_alive()])
        for conn in self._conns:
            conn.close()
        self._conns = []
