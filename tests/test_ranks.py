"""Rank workers: a common start, per-rank timing, and bounded failure when a rank dies or hangs."""

import errno
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ckptqual.host.cpu import HostSampler
from ckptqual.plan.model import FilePlan, RankPlan, TensorSpec
from ckptqual.runs import worker
from ckptqual.runs.failure import RankFailure
from ckptqual.runs.pool import RankPool
from ckptqual.runs.task import Task
from suite_runs import parent


def plans(ranks: int, numel: int) -> tuple[RankPlan, ...]:
    return tuple(RankPlan(r, (FilePlan(f"rank{r}.pt", (TensorSpec("x", numel, "int8"),)),)) for r in range(ranks))


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture(scope="module")
def pool(tmp_path_factory) -> Iterator[RankPool]:
    """Three ranks, their host use sampled, shared by the tests that leave them running."""
    with RankPool(3, seed=1, timeout_s=60, sampler=HostSampler(tmp_path_factory.mktemp("ranks"))) as ranks:
        yield ranks


def test_ranks_fork_from_one_server_that_imported_the_worker_once(pool):
    """The ranks are forked by multiprocessing's fork server, started with the worker module (torch with it)
    preloaded, not spawned as interpreters that each import torch."""
    (server,) = {parent(pid) for pid in pool.pids}
    assert server != os.getpid() and parent(server) == os.getpid()
    command = Path(f"/proc/{server}/cmdline").read_bytes().decode()
    assert "from multiprocessing.forkserver import main" in command and "['ckptqual.runs.worker']" in command


def test_every_rank_reports_its_bytes_and_time_from_the_common_start(tmp_path, pool):
    timing = pool.write_checkpoint(tmp_path, 0, plans(3, 1_000_000), "stream")
    assert [r.rank for r in timing.ranks] == [0, 1, 2]
    assert timing.bytes == 3_000_000
    assert 0 < timing.first_done_s <= timing.seconds
    assert all(r.payload_cpu_s > 0 for r in timing.ranks)


def test_a_rank_that_dies_fails_the_checkpoint_and_no_process_is_left(tmp_path):
    pool = RankPool(2, seed=1, timeout_s=60)
    pids = pool.pids
    killer = threading.Timer(0.5, os.kill, (pids[1], signal.SIGKILL))
    killer.start()
    started = time.monotonic()
    with pytest.raises(RankFailure, match=rf"rank 1 \(PID {pids[1]}\) was killed by SIGKILL during checkpoint 0"):
        pool.write_checkpoint(tmp_path, 0, plans(2, 3_000_000_000), "stream")
    assert time.monotonic() - started < 30
    assert not any(alive(pid) for pid in pids)
    expected = r"not run: the ranks were stopped after rank 1 \(PID \d+\) was killed"
    with pytest.raises(RankFailure, match=expected) as later:
        pool.write_checkpoint(tmp_path, 1, plans(2, 1000), "stream")
    assert later.value.fault == "not-run"


def test_a_rank_killed_while_idle_is_named_with_its_pid_and_signal(tmp_path):
    pool = RankPool(2, seed=1, timeout_s=60)
    pids = pool.pids
    os.kill(pids[1], signal.SIGKILL)
    # Wait until the death is visible to waitpid (which /proc's "Z" can precede): it died while the pool had
    # nothing for it.
    while pool._procs[1].is_alive():
        time.sleep(0.01)
    expected = rf"rank 1 \(PID {pids[1]}\) was killed by SIGKILL while idle, before checkpoint 0"
    with pytest.raises(RankFailure, match=expected) as failure:
        pool.write_checkpoint(tmp_path, 0, plans(2, 1000), "stream")
    assert failure.value.fault == "crash"
    assert not any(alive(pid) for pid in pids)


def test_a_rank_that_hangs_fails_within_the_timeout_and_is_stopped(tmp_path):
    pool = RankPool(2, seed=1, timeout_s=1)
    pids = pool.pids
    os.kill(pids[0], signal.SIGSTOP)
    with pytest.raises(
        RankFailure, match=r"rank\(s\) 0 \(stopped\), 1 \(sleeping\) did not finish checkpoint 0 within 1 s"
    ) as hung:
        pool.write_checkpoint(tmp_path, 0, plans(2, 1000), "stream")
    assert hung.value.fault == "stopped"  # not in the kernel on I/O: not the drive's fault
    assert not any(alive(pid) for pid in pids)


def test_a_rank_error_names_the_rank_and_the_cause(tmp_path, pool):
    clash = (FilePlan("a", (TensorSpec("t", 1, "int8"),)), FilePlan("a/b.pt", (TensorSpec("t", 1, "int8"),)))
    with pytest.raises(RankFailure, match=r"rank 1 failed during checkpoint 0: write .*a: \[Errno 21 EISDIR\]"):
        pool.write_checkpoint(tmp_path, 0, (RankPlan(0, ()), RankPlan(1, clash), RankPlan(2, ())), "stream")
    again = pool.write_checkpoint(tmp_path / "again", 1, tuple(RankPlan(r, ()) for r in range(3)), "stream")
    assert again.bytes == 0  # the ranks go on after one failed


def test_ranks_report_their_cpu_time_and_the_host_is_sampled_over_the_timed_region(tmp_path, pool):
    timing = pool.write_checkpoint(tmp_path, 0, plans(3, 20_000_000), "stream")
    assert all(r.cpu_s >= r.payload_cpu_s > 0 for r in timing.ranks)  # making payload is part of a rank's CPU time
    host = timing.host
    assert host.work_cpu_s == pytest.approx(sum(r.cpu_s for r in timing.ranks))
    assert host.wall_s == pytest.approx(timing.seconds)  # from the first rank's start to the last rank's end
    assert host.cores == len(os.sched_getaffinity(0)) and 0 <= host.cpu_busy <= 1
    assert host.cpu_s_per_GB(timing.bytes) == pytest.approx(host.work_cpu_s / 0.06)
    if HostSampler(tmp_path).stat is not None:  # a block device under tmp_path: its busy time is sampled too
        assert host.device is not None and 0 <= host.device_busy <= 1


KILLED_PARENT = """
import sys
from ckptqual.runs.pool import RankPool
from ckptqual.runs.task import Task

pool = RankPool(2, seed=1, timeout_s=60)
pool._conns[0].send(Task("raw-write"))  # rank 0 alone: it waits at the barrier for rank 1, which never comes
print(*pool.pids, flush=True)
sys.stdin.read()
"""


def test_a_rank_stopped_while_waiting_at_the_barrier_cannot_hold_the_pool_open():
    """multiprocessing's barrier abort waits for every waiting process to wake: a rank stopped (SIGSTOP) at the
    barrier must still not keep close() from ending every rank."""
    pool = RankPool(2, seed=1, timeout_s=60)
    pool._conns[0].send(Task("raw-write"))  # rank 0 alone: it waits at the barrier for rank 1, which never comes
    deadline = time.monotonic() + 60
    while pool._barrier.n_waiting != 1:
        assert time.monotonic() < deadline, "rank 0 never reached the barrier"
        time.sleep(0.05)
    pids = pool.pids
    os.kill(pids[0], signal.SIGSTOP)
    closing = threading.Thread(target=pool.close, daemon=True)
    closing.start()
    closing.join(30)
    assert not closing.is_alive(), "close() hung on the rank stopped at the barrier"
    assert not any(alive(pid) for pid in pids)


@pytest.mark.parametrize("reaped", [True, False], ids=["reaped", "zombie"])
def test_where_the_kernel_has_no_pidfd_a_rank_still_ends_with_its_run(monkeypatch, reaped):
    """Before Linux 5.3 there is no pidfd: the rank's watch falls back to the run's entry in /proc, and a run that
    ended is gone for it whether its parent has reaped it yet or not."""

    def no_pidfd(pid: int) -> int:
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    run = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    watch = multiprocessing.get_context("fork").Process(target=worker._end_with, args=(run.pid,))
    watch.start()
    try:
        watch.join(1.5)
        assert watch.exitcode is None  # the run lives: the rank goes on
        run.kill()
        if reaped:
            run.wait()
        watch.join(10)
        assert watch.exitcode == 1
    finally:
        run.kill()
        run.wait()
        watch.kill()


def test_ranks_end_when_their_run_is_killed_even_while_waiting_at_the_barrier():
    """A run killed by SIGKILL cannot stop its ranks: each ends by itself once its parent is gone, also one that
    waits at the barrier for a rank that never comes (it would never read the pipe's end of file)."""
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED_PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        pids = [int(pid) for pid in child.stdout.readline().split()]
        assert len(pids) == 2 and all(alive(pid) for pid in pids)
    finally:
        child.kill()
        child.wait(timeout=60)
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in pids if alive(pid)], "ranks outlived their killed run"
