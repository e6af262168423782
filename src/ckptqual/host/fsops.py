"""Changes to the target made outside the ranks (removals, directories, untimed files) run in a helper process
with a deadline, so that a drive that stops answering fails the operation on time instead of holding the main
process in the kernel (a write on a frozen filesystem blocks uninterruptibly until it thaws).

The helper is a plain `python -m ckptqual.host.fsops` child that runs module-level functions sent to it over a
pipe; one that misses its deadline is killed and abandoned (it ends whenever the kernel lets it), and the
next operation starts a fresh one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from multiprocessing.connection import Connection, Pipe
from pathlib import Path
from typing import Any

from ckptqual.faults import RunError, fault_of_errno, os_error_line
from ckptqual.host.beneath import RunTree
from ckptqual.host.target import write_file_list

_FD_VARIABLE = "CKPTQUAL_FSOPS_FD"
_START_TIMEOUT_S = 60.0


class TargetOps:
    """Runs functions that change the target in a helper process, each within a deadline."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._proc: subprocess.Popen | None = None
        self._conn: Connection | None = None
        self.abandoned: list[str] = []

    def call(self, what: str, function: Callable[..., Any], *args: Any, timeout_s: float | None = None) -> Any:
        """`function(*args)` in the helper. An OSError there is re-raised as a RunError naming operation, path and
        errno; no answer within the deadline raises RunError(fault="unresponsive")."""
        limit_s = timeout_s if timeout_s is not None else self.timeout_s
        proc, conn = self._connection()
        pid = proc.pid
        try:
            conn.send((function, args))
            answered = conn.poll(limit_s)
            ok, value = conn.recv() if answered else (None, None)
        except EOFError:
            self._abandon()
            raise RunError(f"{what}: the helper process (PID {pid}) died", "crash") from None
        except BaseException:  # interrupted mid-call: its answer would reach the next call, so end this helper
            self._abandon()
            raise
        if not answered:
            self._abandon()
            raise RunError(f"the drive did not respond: {what} did not finish within {limit_s:g} s", "unresponsive")
        if ok:
            return value
        if isinstance(value, OSError):
            raise RunError(os_error_line(value, what), fault_of_errno(value.errno), value.errno) from value
        if isinstance(value, BaseException):
            raise value
        raise RunError(f"{what}: the helper process answered {value!r} where an error was due", "crash")

    def _connection(self) -> tuple[subprocess.Popen, Connection]:
        """The helper and the pipe to it, started where there is none or it ended."""
        proc, conn = self._proc, self._conn
        if proc is None or conn is None or proc.poll() is not None:
            return self._start()
        return proc, conn

    def _start(self) -> tuple[subprocess.Popen, Connection]:
        ours, theirs = Pipe()
        env = {**os.environ, _FD_VARIABLE: str(theirs.fileno())}
        proc = self._proc = subprocess.Popen(
            [sys.executable, "-m", "ckptqual.host.fsops"], pass_fds=(theirs.fileno(),), env=env, start_new_session=True
        )
        theirs.close()
        self._conn = ours
        if not ours.poll(_START_TIMEOUT_S) or ours.recv() != "ready":
            self._abandon()
            raise RunError(f"the target helper process did not start within {_START_TIMEOUT_S:g} s", "crash")
        return proc, ours

    def _abandon(self) -> None:
        """Kills the helper without waiting for it: stuck in the kernel, it ends only when the drive answers."""
        proc, self._proc = self._proc, None
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(1.0)
            if proc.poll() is None:
                self.abandoned.append(f"target helper (PID {proc.pid}) did not end on SIGKILL")

    def close(self) -> None:
        """Ends the helper; never waits long for one that is stuck."""
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.send(None)
            with contextlib.suppress(subprocess.TimeoutExpired):
                if self._proc is not None:
                    self._proc.wait(2.0)
        self._abandon()


def make_listed_directory(run_dir: Path, identity: tuple[int, int], directory: Path, files: list[str]) -> None:
    """Makes `directory` under the run directory (with `identity`) and lists in it (the run manifest's per-directory
    list) the files about to be written, never through a symlink: one planted on the way raises PlantedEntry."""
    with RunTree(run_dir, identity) as tree, tree.directory(directory, create=True) as directory_fd:
        write_file_list(directory_fd, directory, files)


def _serve(conn: Connection) -> None:
    """The helper's loop: run each (function, args) and send back (True, result) or (False, exception)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides what an interrupt stops
    conn.send("ready")
    while (request := _next_request(conn)) is not None:
        function, args = request
        try:
            reply = (True, function(*args))
        except Exception as error:
            reply = (False, error)
        try:
            conn.send(reply)
        except Exception as error:  # an unpicklable result or exception: say what it was
            conn.send((False, RuntimeError(f"{type(error).__name__}: {error}")))


def _next_request(conn: Connection) -> tuple[Callable[..., Any], tuple[Any, ...]] | None:
    """The next request; None (the end) also when the parent is gone without saying so (it was stopped)."""
    try:
        return conn.recv()
    except EOFError:
        return None


if __name__ == "__main__":
    _serve(Connection(int(os.environ[_FD_VARIABLE])))
