"""The ranks of a run over several nodes on one shared filesystem, seen from the controller (the pytest process on
node 0): NodePool does what RankPool does, with rank workers that torchrun started on every node (runs.node).

The controller hosts a torch.distributed TCPStore: each rank takes its tasks from its queue there and posts its
replies; the ranks of all nodes start each task together at a gloo barrier. Timing is MLPerf Storage's: the checkpoint
time is the slowest rank's of all nodes (each node's ranks timed on that node's clock from their common start), the
throughput the aggregate, and each node's own figures are kept (CheckpointTiming.node_figures). Reads are shifted by
one node (node i reads what node i+1 wrote), so that no node reads back from the page cache that wrote the files.
A node that dies breaks the gloo group: the ranks left say so, the controller names the ranks whose heartbeat stopped
(Pulse) and fails the checkpoint, and every worker is told to stop; one that hangs fails it at --rank-timeout, as on one
host. A message taken from a queue by another process that reaches the store (a task, or a worker's event) fails the
run at once, naming the queue and the message's number: the heartbeats carry the last number sent on each queue.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist

from ckptqual.host.cpu import HostSampler, at_once
from ckptqual.io.engines.base import DEFAULT_CHUNK_BYTES
from ckptqual.plan.model import RankPlan
from ckptqual.runs.failure import RankFailure, failure_of
from ckptqual.runs.node import (
    BEAT_S,
    CONNECT_TIMEOUT_S,
    EVENTS,
    RUN,
    STOP,
    beat_key,
    split_address,
    starttime,
    task_queue,
)
from ckptqual.runs.pool import START_TIMEOUT_S, Pool
from ckptqual.runs.processes import late_reason, process_state
from ckptqual.runs.secret import write_secret
from ckptqual.runs.task import Task
from ckptqual.runs.timing import CheckpointTiming, NodeTiming, host_use, rank_timings
from ckptqual.runs.wire import CONTROLLER, Message, Missing, Refused, Wire, missing_line, reply_of, task_body

READS = ("read", "raw-read")  # operations whose ranks read what the next node wrote
_POLL_S = 0.05
SILENT_S = 10 * BEAT_S  # a rank whose heartbeat has not moved for this long is gone (or its host is)
SILENT_WITH_PEERS_S = 4 * BEAT_S  # so is one silent this long once other ranks are gone
_STOP_GRACE_S = 5.0  # after the stop at the end of a run: time for the workers to go
_LEAVE_WAIT_S = 2.0  # after any stop: more time for the workers to go
_LATE_WAIT_S = 30.0  # after a stop before every rank had joined: time for the late ones to come and be told
_GONE_WAIT_S = 2.0  # after the store's server ended: time for a worker here still connected to see it and end
EVENT_KINDS = ("ready", "unable", "reply", "lost", "refused", "missing", "gone")


@dataclass(frozen=True)
class Worker:
    """One rank's process, as it introduced itself: its node, place there, host and process, and its node's sampler."""

    rank: int
    node: int
    local_rank: int
    hostname: str
    pid: int
    starttime: str
    sampler: HostSampler

    @property
    def here(self) -> bool:
        """Whether it runs on the controller's host, where its process can be seen."""
        return self.hostname == socket.gethostname()

    def state(self) -> str:
        """Its process's state letter where it runs here ("gone" once it ended), else that it did not answer."""
        if not self.here:
            return f"no answer from node {self.node} (host {self.hostname})"
        state = process_state(self.pid)
        return state if state not in ("?", "Z") and starttime(self.pid) == self.starttime else "gone"

    def gone(self, said: set[int]) -> bool:
        """Whether it has ended: as its process shows where it runs here, else as it said (`said`: ranks that did)."""
        return self.state() == "gone" if self.here else self.rank in said

    def __str__(self) -> str:
        return f"rank {self.rank} on node {self.node} (host {self.hostname}, PID {self.pid})"


class Pulse:
    """Which ranks' workers have stopped beating (runs.node._watch), and the last event each says it posted, as seen
    from the controller's store; a beat that does not verify raises Refused."""

    def __init__(self, store: dist.Store, wire: Wire, ranks: int) -> None:
        self._store, self._wire, self._ranks = store, wire, ranks
        self._beats: dict[int, tuple[bytes, float]] = {}  # rank: (its last beat, when the controller saw it change)
        self._looked = -BEAT_S
        self.sent: dict[int, int] = {}  # rank: the number of the last event it posted, as its last beat says

    def restart(self) -> None:
        """Counts silence from the next look on (at the start of each task)."""
        self._beats, self._looked = {}, -BEAT_S

    def look(self) -> bool:
        """Reads every rank's beat, at most once per BEAT_S; whether it did."""
        now = time.monotonic()
        if now - self._looked < BEAT_S:
            return False
        self._looked = now
        for rank in range(self._ranks):
            key = beat_key(rank)
            beat = self._store.get(key) if self._store.check([key]) else b""
            if self._beats.get(rank, (None, 0.0))[0] != beat:
                if beat:
                    body = self._wire.open(key, beat, {"beat"}, {rank}, same_ok=True).body
                    self.sent[rank] = body["sent"].get(EVENTS, 0)
                self._beats[rank] = (beat, now)
        return True

    def silent(self, seconds: float = SILENT_S) -> set[int]:
        """The ranks whose heartbeat has not moved for `seconds` since the first look."""
        self.look()
        now = time.monotonic()
        return {rank for rank, (_, changed) in self._beats.items() if now - changed > seconds}


def shifted_readers(workers: list[Worker], nodes: int) -> list[int]:
    """For each rank, the rank whose files it reads: the same local rank on the next node, so that no node reads back
    what it wrote (MLPerf Storage's rule: not from the writer's page cache)."""
    place = {(w.node, w.local_rank): w.rank for w in workers}
    return [place[(w.node + 1) % nodes, w.local_rank] for w in workers]


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on `port` of `host`'s address only (torch's TCPStore would listen on every interface)."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    listener = socket.socket(family, kind, proto)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
        listener.listen(socket.SOMAXCONN)
    except OSError:
        listener.close()
        raise
    return listener


class NodePool(Pool):
    """Rank workers on `nodes` nodes, started there by torchrun with `ckptqual node --controller ADDRESS --secret-file
    FILE`; this process writes the run's secret to FILE, then listens at ADDRESS only. Every message both ways is signed
    and checked (runs.wire); one that is not refused fails the run. `sampler` watches the controller's host (the read
    sweep runs here). The workers end themselves on the signed stop or once this process is gone: it starts none of
    them, so it signals none."""

    def __init__(
        self,
        controller: str,
        nodes: int,
        ranks: int,
        seed: int,
        run_dir: Path,
        secret_file: Path,
        timeout_s: float = 600.0,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        sampler: HostSampler | None = None,
    ) -> None:
        self.ranks, self.nodes, self.seed, self.timeout_s = ranks, nodes, seed, timeout_s
        self.controller, self.secret_file = controller, secret_file
        self.sampler = sampler or HostSampler()
        self.stopped: str | None = None
        self.abandoned: list[str] = []
        self.workers: list[Worker] = []
        self._gone: set[int] = set()
        self._never: set[int] = set()  # ranks torchrun did not start (it started fewer than the plan has)
        self._refusals: list[str] = []  # what was refused, in order; the first fails the run
        self._tasks = 0
        run_id, secret = write_secret(secret_file)  # before listening: a worker reads it once it reaches this process
        self._wire = Wire(secret, run_id, CONTROLLER, ranks)
        host, port = split_address(controller)
        try:
            listener = listen(host, port)
        except OSError as error:
            raise RankFailure(
                f"--controller {controller}: cannot listen there: {error.strerror}; give an address of this host and "
                f"a free port",
                "crash",
            ) from None
        try:  # the store's server takes the listening socket over, and closes it when it ends
            self._store: dist.TCPStore | None = dist.TCPStore(
                host, port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60),
                master_listen_fd=listener.fileno(),
            )  # fmt: skip
            listener.detach()
        except (RuntimeError, ValueError) as error:
            listener.close()
            raise RankFailure(
                f"--controller {controller}: cannot listen there: {error}; give an address of this host and a free "
                f"port",
                "crash",
            ) from None
        run = {"ranks": ranks, "nodes": nodes, "seed_masked": self._wire.mask(seed), "run_dir": str(run_dir)}
        self._run = self._wire.seal(RUN, "run", run | {"timeout_s": timeout_s, "chunk_bytes": chunk_bytes})
        self._store.set(RUN, self._run)  # type: ignore[arg-type]  # torch's stub says str; the store holds bytes
        self._pulse: Pulse | None = Pulse(self._store, self._wire, ranks)
        try:
            self._await_workers(max(timeout_s, START_TIMEOUT_S))
        except (KeyboardInterrupt, SystemExit):  # Ctrl-C, SIGTERM: answered now, the late ranks not waited for
            self.stopped = "the run was interrupted"
            self._shut_down(grace_s=0, late_s=0)
            raise
        except BaseException:
            self._shut_down()
            raise
        self._readers = shifted_readers(self.workers, nodes)

    def _await_workers(self, timeout_s: float) -> None:
        """Waits until every rank's worker has joined the gloo group (`workers`, by rank); fails naming what is missing
        or wrong."""
        deadline = time.monotonic() + timeout_s
        while len(self.workers) < self.ranks:
            for event in self._events():
                if event.kind == "unable":
                    self._never = set(range(event.body["world"], self.ranks))  # not waited for: they never come
                    raise self._stop(f"rank {event.sender} could not start: {event.body['error']}", "crash")
                if event.kind == "ready":
                    sampler = HostSampler.from_data(event.body["sampler"])
                    worker = Worker(event.sender, **(event.body | {"sampler": sampler}))
                    self.workers = sorted([*self.workers, worker], key=lambda w: w.rank)
            if time.monotonic() > deadline:
                raise self._stop(
                    f"only {len(self.workers)} of {self.ranks} ranks joined within {timeout_s:g} s; start "
                    f"`torchrun --nnodes {self.nodes} --nproc-per-node {self.ranks // self.nodes} ... ckptqual node "
                    f"--controller {self.controller} --secret-file {self.secret_file}` on every node "
                    "(docs/many-nodes.md)",
                    "crash",
                )
            time.sleep(_POLL_S)
        counts = Counter(w.node for w in self.workers)
        if sorted(counts) != list(range(self.nodes)) or len(set(counts.values())) != 1:
            raise self._stop(
                f"the ranks came from nodes {dict(sorted(counts.items()))} (node: ranks), but the run has --nodes "
                f"{self.nodes}; start torchrun with --nnodes {self.nodes} --nproc-per-node {self.ranks // self.nodes}",
                "crash",
            )

    def _events(self) -> list[Message]:
        """What the workers posted since the last look, each verified; notes who has gone. A message that does not
        verify, a worker's report that it refused one, or the run's settings replaced in the store stop the run; so
        does a message missing from a queue (a gap in a rank's events, one its heartbeat counts that never came, or a
        task a worker says never came)."""
        store, pulse = self._store, self._pulse
        if store is None or pulse is None:  # closed: nothing more comes
            return []
        refusals, missing, events = [], [], []
        try:
            looked = pulse.look()  # before the queue is read: every event a beat counts is in it by then
        except Refused as refusal:
            looked = False
            refusals.append(f"the controller refused {refusal}")
        values = []
        for _ in range(store.queue_len(EVENTS)):
            try:
                values.append(store.queue_pop(EVENTS, False))
            except dist.QueueEmptyError:  # another process took one meanwhile: its number shows the gap
                break
        if not store.check([RUN]) or store.get(RUN) != self._run:
            refusals.append(f"the controller found the run's settings in {RUN} replaced by an unknown sender")
        for value in values:
            try:
                event = self._wire.open(EVENTS, value, EVENT_KINDS, range(self.ranks), queue=True)
            except Refused as refusal:
                refusals.append(f"the controller refused {refusal}")
                continue
            except Missing as gap:
                missing.append(str(gap))
                continue
            if event.kind == "refused":
                refusals.append(event.body["line"])
            elif event.kind == "missing":
                missing.append(event.body["line"])
            events.append(event)
        if looked:
            missing += [
                missing_line(EVENTS, rank, self._wire.received(rank, EVENTS) + 1, "the controller")
                for rank, sent in sorted(pulse.sent.items())
                if sent > self._wire.received(rank, EVENTS)
            ]
        self._gone |= {event.sender for event in events if event.kind == "gone"}
        if refusals:
            raise self._refused(refusals[0])
        if missing:
            raise self._stop(missing[0], "stopped") if self.stopped is None else Missing(missing[0])
        return events

    def _refused(self, line: str) -> RankFailure:
        """Stops the run after a refused message (`line` says who refused what); the first refusal is its failure."""
        self._refusals.append(line)
        stopped = f"{line}; nothing in it was acted on, and the run was stopped"
        return self._stop(stopped, "stopped") if self.stopped is None else Refused(line)

    def run(
        self,
        op: str,
        directory: Path,
        plans: tuple[RankPlan, ...] | None,
        what: str,
        checkpoint: int = 0,
        options: dict[str, Any] | None = None,
    ) -> CheckpointTiming:
        """Every rank of every node does `op` from a common start; a read's ranks act as the ranks of the next node."""
        planned = self._plans(plans)
        store = self._store
        assert store is not None  # a closed pool is stopped, and _plans refuses it
        acting = self._readers if op in READS else list(range(self.ranks))
        self._tasks += 1
        try:
            self._events()  # anything refused while no task ran stops the run before the next one
            for rank, as_rank in enumerate(acting):
                task = Task(op, checkpoint, str(directory), planned[as_rank], options or {})
                key = task_queue(rank)
                store.queue_push(key, self._wire.seal(key, "task", task_body(self._tasks, as_rank, task)))
            self._beat(store)
            replies = self._collect(what)
        except (KeyboardInterrupt, SystemExit):
            self.stopped = "the run was interrupted"
            self._shut_down(grace_s=0)
            raise
        nodes = tuple(self._node_timing(node, replies, op) for node in range(self.nodes))
        ranks = rank_timings(replies, tuple(planned[rank] for rank in acting), [w.node for w in self.workers])
        return CheckpointTiming(ranks, at_once([(node.hostname, node.host) for node in nodes]), nodes)

    def _beat(self, store: dist.Store) -> None:
        """Tells the workers the number of the last task put in each one's queue (after the tasks are in the store)."""
        key = beat_key(CONTROLLER)
        sent = {task_queue(rank): self._wire.sent(task_queue(rank)) for rank in range(self.ranks)}
        store.set(key, self._wire.seal(key, "beat", {"sent": sent}))  # type: ignore[arg-type]

    def _node_timing(self, node: int, replies: list[dict[str, Any]], op: str) -> NodeTiming:
        members = [w for w in self.workers if w.node == node]
        use = host_use(members[0].sampler, [replies[w.rank] for w in members])
        return NodeTiming(node, members[0].hostname, use, (node + 1) % self.nodes if op in READS else None)

    def _collect(self, what: str) -> list[dict[str, Any]]:
        """Every rank's reply to the task just given. Once a rank lost its peers, the ranks whose heartbeat stopped are
        named and the pool stops; if every rank lost its peers, or at the timeout, it stops too."""
        deadline = time.monotonic() + self.timeout_s
        replies: dict[int, dict[str, Any]] = {}
        lost: dict[int, str] = {}
        pulse = self._pulse
        assert pulse is not None  # a pool is closed only after its last task
        pulse.restart()
        while len(replies) < self.ranks or lost:
            for event in self._events():
                if event.kind == "reply" and event.body["task"] != self._tasks:
                    task = event.body["task"]
                    raise self._refused(
                        f"the controller refused rank {event.sender}'s reply to task {task}: it is not the task given"
                    )
                if event.kind == "reply":
                    replies[event.sender] = reply_of(event.body["reply"])
                elif event.kind == "lost":
                    lost[event.sender] = event.body["line"]
            try:
                silent = pulse.silent() - set(lost) if lost else set()
            except Refused as refusal:
                raise self._refused(f"the controller refused {refusal}") from None
            if silent or len(lost) == self.ranks:
                # the ranks of a host that went at once stop beating within a beat of each other: name them together
                silent |= pulse.silent(SILENT_WITH_PEERS_S) - set(lost) if silent else set()
                raise self._stop(self._lost_reason(what, lost, silent), "crash")
            if time.monotonic() > deadline:
                if lost:  # the rest are alive but did not say: waiting on a peer
                    raise self._stop(self._lost_reason(what, lost, set(range(self.ranks)) - set(lost)), "crash")
                late = [w for w in self.workers if w.rank not in replies]
                raise self._stop(*late_reason({w.rank: w.state() for w in late}, what, self.timeout_s))
            time.sleep(_POLL_S)
        failure = failure_of([replies[rank] for rank in range(self.ranks)], what)
        if failure is not None:
            raise failure
        return [replies[rank] for rank in range(self.ranks)]

    def _lost_reason(self, what: str, lost: dict[int, str], silent: set[int]) -> str:
        """Which ranks fell `silent` (whole nodes named as such) and which rank saw its peers go, and how."""
        witness, line = min(lost.items())
        told = f"rank {witness} on node {self.workers[witness].node} lost its peers ({line})"
        if not silent:
            return f"the ranks lost each other during {what}: {told}"
        parts = []
        for node in sorted({self.workers[rank].node for rank in silent}):
            ranks = [w for w in self.workers if w.node == node and w.rank in silent]
            if len(ranks) == sum(w.node == node for w in self.workers):
                parts.append(f"node {node} (host {ranks[0].hostname}, all its {len(ranks)} ranks)")
            else:
                parts.append(", ".join(str(w) for w in ranks))
        return f"{'; '.join(parts)} stopped answering during {what}; {told}"

    def _stop(self, reason: str, fault: str) -> RankFailure:
        """Stops every worker after `reason`; later calls fail with it."""
        self.stopped = reason
        self._shut_down(grace_s=0)
        return RankFailure(reason, fault)

    @property
    def pids(self) -> list[int]:
        """The PIDs of the workers on this host, as they said (read, never signalled)."""
        return [w.pid for w in self.workers if w.here]

    def close(self, grace_s: float = _STOP_GRACE_S) -> None:
        """Stops every worker (see _shut_down); a message refused meanwhile, after the run's last task, fails the run
        here, since no task is left to fail."""
        refused = len(self._refusals)
        self._shut_down(grace_s)
        if len(self._refusals) > refused and refused == 0:
            raise RankFailure(f"{self._refusals[0]}; nothing in it was acted on, and the run was stopped", "stopped")

    def _shut_down(self, grace_s: float = _STOP_GRACE_S, late_s: float = _LATE_WAIT_S) -> None:
        """Tells every worker to stop (a signed stop) and waits for them to go (`late_s` more for ranks that had not
        joined yet), then ends the store's server, which ends any worker still connected to it. A worker that did not
        say it went (or, here, is still in the process table) is named in `abandoned`, with the command to find it."""
        if self._store is None:
            return
        stop = {"reason": self.stopped or "", "planned": self.stopped is None}
        with contextlib.suppress(RuntimeError):
            self._store.set(STOP, self._wire.seal(STOP, "stop", stop))  # type: ignore[arg-type]
        self.stopped = self.stopped or "they were closed"
        deadline = time.monotonic() + grace_s + (_LEAVE_WAIT_S if len(self.workers) == self.ranks else late_s)
        while not self._all_gone() and time.monotonic() < deadline:
            time.sleep(_POLL_S)
        unheard = sorted(set(range(self.ranks)) - {w.rank for w in self.workers} - self._gone - self._never)
        if unheard:
            self.abandoned.append(
                f"rank(s) {', '.join(map(str, unheard))} never reached this process; they end by themselves once they "
                f"find it gone (within {CONNECT_TIMEOUT_S:g} s)"
            )
        self._store = self._pulse = None  # the store's server ends with them: a worker still waiting on it ends too
        left = [w for w in self.workers if not w.gone(self._gone)]
        deadline = time.monotonic() + _GONE_WAIT_S
        while any(w.here and w.state() != "gone" for w in left) and time.monotonic() < deadline:
            time.sleep(_POLL_S)
        self.abandoned += [self._abandoned(w) for w in left if not w.here or w.state() != "gone"]

    def _all_gone(self) -> bool:
        with contextlib.suppress(RuntimeError):  # a refusal is noted in _refusals; the others go on being told to stop
            self._events()
        awaited = set(range(self.ranks)) - {w.rank for w in self.workers} - self._never
        return all(w.gone(self._gone) for w in self.workers) and awaited <= self._gone

    def _abandoned(self, worker: Worker) -> str:
        find = f"find it on host {worker.hostname} with `pgrep -af 'ckptqual node --controller {self.controller}'`"
        return f"{worker} did not end when told to stop ({worker.state()}); {find}"
