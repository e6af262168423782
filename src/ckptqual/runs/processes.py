"""Rank processes seen and ended from outside: their state in /proc, how one ended, why late ones are late, and
ending them for certain (SIGTERM, then SIGKILL, then abandoning one stuck in the kernel)."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import signal
import time
from pathlib import Path

_TERM_WAIT_S = 0.5
_KILL_WAIT_S = 2.0  # after SIGKILL: a process still alive then is stuck in the kernel and is abandoned


def late_reason(states: dict[int, str], what: str, timeout_s: float) -> tuple[str, str]:
    """(reason, fault) for ranks that ran past the timeout, by their process state letters: ranks stuck in the kernel
    mean an unresponsive drive."""
    shown = ", ".join(f"{rank} ({_STATES.get(state, state)})" for rank, state in states.items())
    if "D" in states.values():
        reason = (
            f"the drive did not respond: rank(s) {shown} did not finish {what} within {timeout_s:g} s "
            f"(setting rank_timeout_s), waiting in the kernel on I/O"
        )
        return reason, "unresponsive"
    return (
        f"rank(s) {shown} did not finish {what} within {timeout_s:g} s; raise rank_timeout_s for a slow drive",
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


def death(proc: mp.process.BaseProcess) -> str:
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
        # multiprocessing joins its children at exit; this one may never end. Its set of them is private: no stubs
        mp.process._children.discard(proc)  # type: ignore[attr-defined]
    return [f"{p.name} (PID {p.pid}, {_STATES.get(process_state(p.pid), '?')}) did not end on SIGKILL" for p in procs]
