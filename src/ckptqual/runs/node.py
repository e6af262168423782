"""A node's rank workers, started by torchrun on every node (`ckptqual node --controller HOST:PORT --secret-file F`).

Each worker is one global rank of the plan: it joins the torchrun job's gloo group, takes its tasks from the
controller's TCPStore (the pytest process on node 0, runs.cluster), meets every rank of every node at a gloo barrier,
does the rank operation of runs.worker and posts its reply. A worker ends when the controller says stop or is gone, and
when the gloo group breaks (a node died): it then says which rank lost its peers, so that the controller fails the
checkpoint at once, and exits, so that torchrun's agent on its node stops too. Every message it reads or puts in the
store is signed with the run's secret (runs.wire); one that does not verify is refused and told, never acted on. A task
the controller's heartbeat says it sent, but that is no longer in the worker's queue, was taken by another process: the
worker tells the controller at once, naming the queue and the task's number.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import sys
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn

import torch.distributed as dist

from ckptqual.host.beneath import PlantedEntry, RunTree
from ckptqual.host.cpu import HostSampler
from ckptqual.io.engines.base import RankIO
from ckptqual.io.payload import PayloadGenerator
from ckptqual.runs.failure import RankFailure
from ckptqual.runs.secret import SecretError, read_secret
from ckptqual.runs.task import Task
from ckptqual.runs.wire import CONTROLLER, Missing, Refused, Wire, missing_line, reply_data, task_of
from ckptqual.runs.worker import run_task

# Keys of the controller's store.
RUN, STOP, EVENTS = "ckptqual/run", "ckptqual/stop", "ckptqual/events"
CONNECT_TIMEOUT_S = 300.0  # how long a worker waits for the controller to come up
_POLL_S = 0.05  # how often a worker looks for its next task
BEAT_S = 0.5  # how often a worker tells the controller it is alive (and looks for the stop)


def task_queue(rank: int) -> str:
    """The key of the queue of `rank`'s tasks."""
    return f"ckptqual/tasks/{rank}"


def beat_key(rank: int) -> str:
    """The key of `rank`'s heartbeat (CONTROLLER: the controller's): the last number it sent on each queue."""
    return "ckptqual/beat/controller" if rank == CONTROLLER else f"ckptqual/beat/{rank}"


def split_address(address: str) -> tuple[str, int]:
    """("host", port) of "host:port"."""
    host, _, port = address.rpartition(":")
    return host, int(port)


def connect(address: str, timeout_s: float) -> dist.TCPStore:
    """A client of the controller's store at `address`, waiting up to `timeout_s` for it to come up."""
    host, port = split_address(address)
    return dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout_s))


class Link:
    """This worker's side of one connection to the controller's store: every message it puts there sealed by `wire`
    (its number taken and the value put under one lock, and an event known to be in the store before the lock is let
    go, so that the numbers reach the controller in order and a heartbeat never counts an event not yet there)."""

    def __init__(self, store: dist.Store, wire: Wire, rank: int) -> None:
        self.store, self.wire, self.rank = store, wire, rank

    def post(self, kind: str, body: dict[str, Any]) -> None:
        """Tells the controller a `kind` event: ready, unable, reply, lost, refused or gone."""
        with self.wire.lock:
            self.store.queue_push(EVENTS, self.wire.seal(EVENTS, kind, body))
            self.store.queue_len(EVENTS)  # a reply on this connection: the store has the event

    def beat(self) -> None:
        """Tells the controller this rank is alive, and the number of the last event it posted."""
        key = beat_key(self.rank)
        with self.wire.lock:
            beat = self.wire.seal(key, "beat", {"sent": {EVENTS: self.wire.sent(EVENTS)}})
            self.store.set(key, beat)  # type: ignore[arg-type]  # torch's stub says str; the store holds bytes

    def refused(self, refusal: Refused) -> None:
        """Tells the controller what this worker refused, naming itself, so that the run fails with it."""
        where = f"rank {self.rank} on node {os.environ.get('GROUP_RANK', '?')} (host {socket.gethostname()})"
        self.post("refused", {"line": f"{where} refused {refusal}"})


def starttime(pid: int) -> str:
    """The start time of a process in clock ticks since boot (/proc/PID/stat), which tells it from a later one that got
    the same PID; "" where it cannot be read."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19]
    except (OSError, IndexError):
        return ""


class GroupBarrier:
    """The common start: a barrier of every rank of every node over gloo. Once it fails (a peer is gone), the group is
    broken for good and `broken` says how."""

    def __init__(self) -> None:
        self.broken: str | None = None

    def wait(self) -> None:
        try:
            dist.barrier()
        except Exception as error:  # gloo's errors are RuntimeErrors of several kinds
            self.broken = f"gloo: {_first_sentence(str(error))}"
            raise RankFailure(f"the ranks lost each other at the barrier ({self.broken})", "crash") from None


def _first_sentence(message: str) -> str:
    """The first sentence of an error without gloo's source location: `Read error [10.0.0.2]:2785: Connection reset by
    peer` of `[.../pair.cc:537] Read error [10.0.0.2]:2785: Connection reset by peer. This is typically ...`."""
    return re.sub(r"^\[[^\]]*\]\s*", "", message.strip().splitlines()[0]).split(". ")[0]


def serve(controller: str, secret_file: Path) -> NoReturn:
    """Runs this process's rank until the controller stops it, which ends the process (`_watch`: 0 when the run ended as
    planned); one that cannot start tells the controller why and ends (2). The secret file is read once the controller
    listens: it writes the run's secret before it does."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = connect(controller, CONNECT_TIMEOUT_S)
    try:
        run_id, secret = read_secret(secret_file)
    except SecretError as error:  # nothing can be said to the controller without the secret
        print(f"ckptqual node: rank {rank}: {error}", file=sys.stderr, flush=True)
        os._exit(2)
    link = Link(store, Wire(secret, run_id, rank, world), rank)
    threading.Thread(target=_watch, args=(controller, link.wire, rank), name="ckptqual-watch", daemon=True).start()
    try:
        _serve(link, world)
    except BaseException:  # said here; the process ends at once, never in interpreter exit beside the watch
        traceback.print_exc()
        _leave(link, 1)


def _serve(link: Link, world: int) -> NoReturn:
    """The rank's life once it reaches the controller: checks, the gloo group, then task after task."""
    try:
        run = link.wire.open(RUN, link.store.get(RUN), {"run"}, {CONTROLLER}).body
    except Refused as refusal:
        link.refused(refusal)
        _leave(link, 2)
    run_dir = Path(run["run_dir"])
    tree, problem = _run_tree(world, run, run_dir)
    if tree is None:
        link.post("unable", {"error": str(problem), "world": world})
        _leave(link, 2)
    dist.init_process_group("gloo", timeout=timedelta(seconds=run["timeout_s"]))
    sampler = HostSampler(run_dir)  # this node's CPUs and the block device under the target here
    seed = link.wire.mask(run["seed_masked"])
    io = RankIO(PayloadGenerator(seed), rank=link.rank, chunk_bytes=run["chunk_bytes"])
    link.post("ready", _identity(sampler))
    barrier = GroupBarrier()
    while True:
        number, acting, task = _next_task(link, tree)
        io.rank, task.sampler = acting, sampler  # a shifted read acts as the rank whose files it reads
        task.root = tree.reference  # every entry reached from the run directory this worker opened and checked
        link.post("reply", {"task": number, "reply": reply_data(run_task(io, task, barrier))})
        if barrier.broken is None:
            with contextlib.suppress(RankFailure):
                barrier.wait()  # every rank has replied: the group is whole, or a node was lost during the task
        if barrier.broken is not None:  # said, then left to the stop that follows: the others can say so too
            link.post("lost", {"line": barrier.broken})
            threading.Event().wait()


def _run_tree(world: int, run: dict[str, Any], run_dir: Path) -> tuple[RunTree | None, str | None]:
    """The run directory the controller announced, opened without following a symlink; or why this rank cannot serve
    the run: torchrun started another number of ranks, or the target is not here."""
    ranks, nodes = run["ranks"], run["nodes"]
    if world != ranks:
        return None, (
            f"torchrun started {world} ranks in all (--nnodes x --nproc-per-node) but the plan has {ranks}; start it "
            f"with --nnodes {nodes} --nproc-per-node {ranks // nodes} on every node"
        )
    try:
        if not run_dir.is_absolute():
            raise FileNotFoundError
        return RunTree(run_dir), None
    except PlantedEntry as planted:
        return None, f"the run directory {planted} on host {socket.gethostname()}"
    except OSError:
        return None, (
            f"cannot see the run directory {run_dir} on host {socket.gethostname()}: the target must be one "
            f"filesystem shared by every node, mounted at the same path"
        )


def _identity(sampler: HostSampler) -> dict[str, Any]:
    """What the controller keeps of a worker: where it runs and how to tell its process, and its node's sampler."""
    pid = os.getpid()
    return {
        "node": int(os.environ["GROUP_RANK"]),
        "local_rank": int(os.environ["LOCAL_RANK"]),
        "hostname": socket.gethostname(),
        "pid": pid,
        "starttime": starttime(pid),
        "sampler": sampler.to_data(),
    }


def _next_task(link: Link, tree: RunTree) -> tuple[int, int, Task]:
    """The next (task number, rank to act as, task) for this rank; waits as long as the controller is there. A task
    that does not verify, or names a directory outside the run directory, is refused and told, never done; a task taken
    from the queue by another process is told as missing, and none comes after it."""
    key = task_queue(link.rank)
    looked = -BEAT_S
    while True:
        if link.store.queue_len(key) == 0:  # only this thread pops this queue
            if time.monotonic() - looked >= BEAT_S:
                looked = time.monotonic()
                _tell_missing(link, key)
            time.sleep(_POLL_S)
            continue
        try:
            value = link.store.queue_pop(key, False)
        except dist.QueueEmptyError:  # another process took it meanwhile: the next look at the heartbeat tells
            continue
        try:
            body = link.wire.open(key, value, {"task"}, {CONTROLLER}, queue=True).body
            task = task_of(body)
            inside(tree, Path(task.directory))
        except Refused as refusal:
            link.refused(refusal)
            continue
        except Missing as missing:
            _missing(link, str(missing))
        return body["number"], body["as_rank"], task


def _tell_missing(link: Link, key: str) -> None:
    """Compares the controller's heartbeat (the last task it sent on `key`) with the last task this rank took, while
    the queue is empty: a task sent but not there was taken by another process (a heartbeat that does not verify is
    refused and told)."""
    beat = beat_key(CONTROLLER)
    if not link.store.check([beat]):
        return
    try:
        sent = link.wire.open(beat, link.store.get(beat), {"beat"}, {CONTROLLER}, same_ok=True).body["sent"].get(key, 0)
    except Refused as refusal:
        link.refused(refusal)
        return
    taken = link.wire.received(CONTROLLER, key)
    if sent > taken and link.store.queue_len(key) == 0:  # looked at after the heartbeat: a task sent is there by now
        _missing(link, missing_line(key, CONTROLLER, taken + 1, f"rank {link.rank}"))


def _missing(link: Link, line: str) -> NoReturn:
    """Tells the controller a task never came, then waits for its stop (which ends the process)."""
    link.post("missing", {"line": line})
    while True:  # the controller's stop ends this process (_watch)
        time.sleep(BEAT_S)


def inside(tree: RunTree, directory: Path) -> None:
    """Raises Refused unless `directory` lies in the run directory (no '..') and no entry on the way to it that is there
    already is a symlink or other planted entry."""
    try:
        tree.parts(directory)
    except ValueError:
        raise Refused(f"a task naming {directory}: it is outside the run directory {tree.root}") from None
    for reached in (directory, *directory.parents):
        try:
            with tree.directory(reached):
                return
        except PlantedEntry as planted:
            raise Refused(f"a task naming {directory}: {planted}") from None
        except FileNotFoundError:  # made by the task itself (a new checkpoint directory)
            continue


def _watch(controller: str, wire: Wire, rank: int) -> None:
    """Beats for this rank every BEAT_S, so that the controller tells a live rank from a dead one, and ends this process
    once the controller's signed stop comes (0 when the run ended as planned) or it is gone (1). A stop that does not
    verify is refused and told, once per value, and the watch goes on."""
    link = Link(connect(controller, CONNECT_TIMEOUT_S), wire, rank)
    code, refused = 1, b""
    try:
        while True:
            if link.store.check([STOP]) and (value := link.store.get(STOP)) != refused:
                try:
                    stop = wire.open(STOP, value, {"stop"}, {CONTROLLER}).body
                except Refused as refusal:
                    link.refused(refusal)
                    refused = value
                else:
                    code = 0 if stop["planned"] else 1
                    break
            link.beat()
            time.sleep(BEAT_S)
    finally:
        _leave(link, code)


def _leave(link: Link, code: int) -> NoReturn:
    """Tells the controller this rank is going, then ends the process at once (whatever its other thread is doing)."""
    try:
        link.post("gone", {})
    finally:
        os._exit(code)
