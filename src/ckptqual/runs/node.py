"""A node's rank workers, started by torchrun on every node (`ckptqual node --controller HOST:PORT`).

Each worker is one global rank of the plan: it joins the torchrun job's gloo group, takes its tasks from the
controller's TCPStore (the pytest process on node 0, runs.cluster), meets every rank of every node at a gloo barrier,
does the rank operation of runs.ranks and posts its reply. A worker ends when the controller says stop or is gone, and
when the gloo group breaks (a node died): it then says which rank lost its peers, so that the controller fails the
checkpoint at once, and exits, so that torchrun's agent on its node stops too.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import re
import socket
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn

import torch.distributed as dist

from ckptqual.host.cpu import HostSampler
from ckptqual.io.engines.base import RankIO
from ckptqual.io.payload import PayloadGenerator
from ckptqual.runs.ranks import RankFailure, Task, run_task

# Keys of the controller's store.
RUN, STOP, EVENTS = "ckptqual/run", "ckptqual/stop", "ckptqual/events"
CONNECT_TIMEOUT_S = 300.0  # how long a worker waits for the controller to come up
_IDLE_WAIT_S = 3600.0  # one blocking wait for the next task; repeated while the controller is there
BEAT_S = 0.5  # how often a worker tells the controller it is alive (and looks for the stop)


def task_queue(rank: int) -> str:
    """The key of the queue of `rank`'s tasks."""
    return f"ckptqual/tasks/{rank}"


def beat_key(rank: int) -> str:
    """The key of `rank`'s heartbeat counter."""
    return f"ckptqual/beat/{rank}"


def split_address(address: str) -> tuple[str, int]:
    """("host", port) of "host:port"."""
    host, _, port = address.rpartition(":")
    return host, int(port)


def connect(address: str, timeout_s: float) -> dist.TCPStore:
    """A client of the controller's store at `address`, waiting up to `timeout_s` for it to come up."""
    host, port = split_address(address)
    return dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout_s))


def post(store: dist.Store, *event: Any) -> None:
    """Tells the controller `event`: ("ready", rank, info), ("reply", rank, reply), ("lost", rank, line), ("gone",
    rank)."""
    store.queue_push(EVENTS, pickle.dumps(event))


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


def serve(controller: str) -> NoReturn:
    """Runs this process's rank until the controller stops it, which ends the process (`_watch`: 0 when the run ended as
    planned); one that cannot start tells the controller why and ends (2)."""
    rank = int(os.environ["RANK"])
    store = connect(controller, CONNECT_TIMEOUT_S)
    threading.Thread(target=_watch, args=(controller, rank), name="ckptqual-watch", daemon=True).start()
    try:
        _serve(store, rank)
    except BaseException:  # said here; the process ends at once, never in interpreter exit beside the watch
        traceback.print_exc()
        _leave(store, rank, 1)


def _serve(store: dist.Store, rank: int) -> NoReturn:
    """The rank's life once it reaches the controller: checks, the gloo group, then task after task."""
    world = int(os.environ["WORLD_SIZE"])
    run = pickle.loads(store.get(RUN))
    run_dir = Path(run["run_dir"])
    problem = _problem(world, run, run_dir)
    if problem:
        post(store, "ready", rank, {"error": problem})
        _leave(store, rank, 2)
    dist.init_process_group("gloo", timeout=timedelta(seconds=run["timeout_s"]))
    sampler = HostSampler(run_dir)  # this node's CPUs and the block device under the target here
    io = RankIO(PayloadGenerator(run["seed"]), rank=rank, chunk_bytes=run["chunk_bytes"])
    post(store, "ready", rank, _identity(sampler))
    barrier = GroupBarrier()
    while True:
        acting, task = _next_task(store, rank)
        io.rank, task.sampler = acting, sampler  # a shifted read acts as the rank whose files it reads
        post(store, "reply", rank, run_task(io, task, barrier))
        if barrier.broken is None:
            with contextlib.suppress(RankFailure):
                barrier.wait()  # every rank has replied: the group is whole, or a node was lost during the task
        if barrier.broken is not None:  # said, then left to the stop that follows: the others can say so too
            post(store, "lost", rank, barrier.broken)
            threading.Event().wait()


def _problem(world: int, run: dict[str, Any], run_dir: Path) -> str | None:
    """Why this rank cannot serve the run: torchrun started another number of ranks, or the target is not here."""
    ranks, nodes = run["ranks"], run["nodes"]
    if world != ranks:
        return (
            f"torchrun started {world} ranks in all (--nnodes x --nproc-per-node) but the plan has {ranks}; start it "
            f"with --nnodes {nodes} --nproc-per-node {ranks // nodes} on every node"
        )
    if not run_dir.is_dir():
        return (
            f"cannot see the run directory {run_dir} on host {socket.gethostname()}: the target must be one "
            f"filesystem shared by every node, mounted at the same path"
        )
    return None


def _identity(sampler: HostSampler) -> dict[str, Any]:
    """What the controller keeps of a worker: where it runs and how to tell its process, and its node's sampler."""
    pid = os.getpid()
    return {
        "node": int(os.environ["GROUP_RANK"]),
        "local_rank": int(os.environ["LOCAL_RANK"]),
        "hostname": socket.gethostname(),
        "pid": pid,
        "starttime": starttime(pid),
        "sampler": sampler,
    }


def _next_task(store: dist.Store, rank: int) -> tuple[int, Task]:
    """The next (rank to act as, task) for `rank`; waits as long as the controller is there."""
    store.set_timeout(timedelta(seconds=_IDLE_WAIT_S))
    while True:
        try:
            return pickle.loads(store.queue_pop(task_queue(rank)))
        except dist.DistStoreError:  # no task yet: the wait timed out (a lost controller raises DistNetworkError)
            continue


def _watch(controller: str, rank: int) -> None:
    """Beats for this rank every BEAT_S, so that the controller tells a live rank from a dead one, and ends this process
    once the controller says stop (0 when the run ended as planned) or is gone (1)."""
    store = connect(controller, CONNECT_TIMEOUT_S)
    code = 1
    try:
        while not store.check([STOP]):
            store.add(beat_key(rank), 1)
            time.sleep(BEAT_S)
        code = 0 if store.get(STOP) == b"" else 1
    finally:
        _leave(store, rank, code)


def _leave(store: dist.Store, rank: int, code: int) -> NoReturn:
    """Tells the controller this rank is going, then ends the process at once (whatever its other thread is doing)."""
    try:
        post(store, "gone", rank)
    finally:
        os._exit(code)
