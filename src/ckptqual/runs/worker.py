"""A rank process: waits for a task, meets the other ranks at the barrier, does the task timed and reports it; a
failure is reported, never raised, and the rank ends with its run."""

from __future__ import annotations

import contextlib
import gc
import os
import select
import signal
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from ckptqual.faults import RunError, fault_of_errno, os_error_line
from ckptqual.host.beneath import PlantedEntry
from ckptqual.host.waits import between, own_threads
from ckptqual.io.engines.base import IntegrityError, RankIO
from ckptqual.io.lanes import use as use_lanes
from ckptqual.io.payload import PayloadGenerator
from ckptqual.runs import raw, restore, save, stage
from ckptqual.runs.task import Task

_RUN_POLL_S = 0.5  # without a pidfd: how soon a rank notices that its run is gone


def _read_for_layout(io: RankIO, task: Task) -> int:
    """runs.reshard's read, imported by a rank's first such task: it loads every format's engine, torch's DCP too."""
    from ckptqual.runs import reshard

    return reshard.read_for_layout(io, task)


_OPERATIONS: dict[str, Callable[[RankIO, Task], int]] = {
    "write": save.write_checkpoint_files,
    "stage": stage.stage_to_host,
    "raw-write": raw.write_sequential,
    "raw-read": raw.read_sequential,
    "read": restore.read_checkpoint_files,
    "reshard-read": _read_for_layout,
}
OPERATIONS = tuple(_OPERATIONS)  # the operations a task may name
# Checks that follow an operation outside its timed region; their reply fields join the operation's.
_AFTER_TIMING: dict[str, Callable[[RankIO, Task], dict[str, Any]]] = {"read": restore.load_sample}


def serve(rank: int, seed: int, chunk_bytes: int, lanes: int, conn: Connection, barrier: Any, run: int) -> None:
    """A rank's loop: wait for a task, meet the others at the barrier, do it, report; ends with the run's process
    `run`. `lanes`: the threads the rank may use (its share of the host's cores)."""
    for signum in (signal.SIGINT, signal.SIGHUP):  # the parent decides what an interrupt or a hang-up stops
        signal.signal(signum, signal.SIG_IGN)
    use_lanes(lanes)
    threading.Thread(target=_end_with, args=(run,), name="ckptqual-run-watch", daemon=True).start()
    io = RankIO(PayloadGenerator(seed), rank=rank, chunk_bytes=chunk_bytes)
    # What the start-up made (torch's modules above all, some 170,000 objects) lives as long as the rank: frozen, it
    # is no longer walked by every full collection, one of which took 0.1 s of a small-file checkpoint's 2 s here.
    gc.freeze()
    with contextlib.suppress(EOFError, OSError):  # the parent is gone: nothing left to report to
        conn.send({"ready": True})
        while (task := conn.recv()).op != "stop":
            conn.send(run_task(io, task, barrier))


def _end_with(run: int) -> None:
    """Ends this rank as soon as the run's process is gone (a run killed by SIGKILL): the pipe's end of file reaches a
    rank only between tasks, and one waiting at the barrier for a rank that never comes would wait forever. The run
    waits for this rank's start-up, so that its PID cannot have passed to another process yet."""
    try:
        select.select([os.pidfd_open(run)], [], [])
    except ProcessLookupError:  # gone already
        pass
    except OSError:  # no pidfd before Linux 5.3: the run's entry in /proc, checked twice a second
        born = _start_time(run)
        while born is not None and _start_time(run) == born:
            time.sleep(_RUN_POLL_S)
    os._exit(1)


def _start_time(pid: int) -> str | None:
    """When the process `pid` started (field 22 of /proc/PID/stat), or None once it has ended (a zombie too)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def run_task(io: RankIO, task: Task, barrier: Any) -> dict[str, Any]:
    """Meets the other ranks at `barrier` (anything with `wait()`), does the task timed and reports it; a failure is
    reported, never raised."""
    io.checkpoint, io.payload_cpu_s, io.generated_bytes, io.stage = task.checkpoint, 0.0, 0, task.op
    io.barrier = barrier
    try:
        barrier.wait()
        sampler = task.sampler
        if sampler is None:
            raise ValueError(f"the {task.op} task came without the host sampler that marks its start and end")
        with task.run_root().open() as io.tree:  # opened untimed, before the common start
            first, threads = sampler.mark(), own_threads()
            io.begin(task.op)
            cpu_start = time.process_time()
            moved = _OPERATIONS[task.op](io, task)
            cpu_s = time.process_time() - cpu_start
            phases = io.end_phases()
            waits = between(threads, own_threads(), time.monotonic() - first.wall)  # host.waits: who waited for what
            last = sampler.mark()
            reply: dict[str, Any] = {
                "start": first.wall,
                "end": last.wall,
                "bytes": moved,
                "payload_cpu_s": io.payload_cpu_s,
            }
            reply |= {"cpu_s": cpu_s, "marks": (first, last), "waits": waits.to_dict(), "phases": phases}
            return reply | (_AFTER_TIMING[task.op](io, task) if task.op in _AFTER_TIMING else {})
    except Exception as error:
        return _failure_reply(error, io.stage)
    finally:
        io.tree = None
        io.end_phases()


def _failure_reply(error: Exception, stage: str) -> dict[str, Any]:
    """What a rank reports of an exception: one line, whose fault it is, and the errno of an I/O error."""
    if isinstance(error, RunError):
        return {"error": str(error), "fault": error.fault, "errno": error.errno}
    if isinstance(error, PlantedEntry):
        return {"error": f"{stage}: {error}", "fault": "planted", "errno": error.errno}
    if isinstance(error, OSError):
        return {"error": os_error_line(error, stage), "fault": fault_of_errno(error.errno), "errno": error.errno}
    if isinstance(error, IntegrityError):
        return {"error": f"{type(error).__name__}: {error}", "fault": "integrity", "errno": None}
    return {
        "error": f"{type(error).__name__}: {error}",
        "fault": "crash",
        "errno": None,
        "trace": traceback.format_exc(),
    }
