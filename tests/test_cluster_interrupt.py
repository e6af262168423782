"""The multi-node controller answers at once while it waits for its workers to join: on Ctrl-C or SIGTERM it tells
those that may come to stop, and ends, without waiting for late ranks (they end by themselves once it is gone); on a
rank that cannot start because torchrun started too few, it waits only for the ranks that were started to go."""

from __future__ import annotations

import signal
import socket
import threading
import time

import pytest

from ckptqual.runs import cluster
from ckptqual.runs.failure import RankFailure
from ckptqual.runs.node import Link, connect
from ckptqual.runs.secret import read_secret
from ckptqual.runs.wire import Wire


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Interrupted(KeyboardInterrupt):
    """What the suite's signal handler raises on SIGTERM (pytest_plugin.run.Interrupts)."""


def test_sigterm_while_the_controller_waits_for_its_workers_takes_effect_at_once(tmp_path):
    secret = tmp_path / "secret"  # the pool writes it
    raised: list[float] = []

    def on_alarm(signum: int, frame: object) -> None:
        raised.append(time.monotonic())
        raise Interrupted("signal SIGTERM")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, 1.0)  # the workers never come: the controller is still waiting then
    try:
        with pytest.raises(Interrupted):
            cluster.NodePool(f"127.0.0.1:{free_port()}", 2, 4, 0, tmp_path / "run", secret, timeout_s=60)
        ended = time.monotonic()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert raised and ended - raised[0] < 5, ended - raised[0]  # it waited 37 s for late ranks before


def test_ranks_torchrun_never_started_are_not_waited_for_when_the_started_ones_cannot_start(tmp_path):
    """torchrun started 2 ranks for a plan of 4: each says it cannot start, naming the 2 it started, and goes. The
    controller stops once those 2 have gone, without waiting for ranks 2 and 3 to come (they never do: waited for,
    they would be named as never reached, after the wait for late ranks)."""
    address, secret = f"127.0.0.1:{free_port()}", tmp_path / "secret"  # the pool writes the secret
    left: list[str] = []

    class Watched(cluster.NodePool):
        def _shut_down(self, *args: float, **kwargs: float) -> None:
            super()._shut_down(*args, **kwargs)
            left.extend(self.abandoned)

    def started_ranks() -> None:  # what each rank of `torchrun --nnodes 2 --nproc-per-node 1` does (runs.node._serve)
        store = connect(address, 60)
        run_id, key = read_secret(secret)
        for rank in (0, 1):
            link = Link(store, Wire(key, run_id, rank, 2), rank)
            link.post("unable", {"error": "torchrun started 2 ranks in all", "world": 2})
            link.post("gone", {})

    ranks = threading.Thread(target=started_ranks, daemon=True)
    ranks.start()
    with pytest.raises(RankFailure, match=r"^rank [01] could not start: torchrun started 2 ranks in all$"):
        Watched(address, 2, 4, 0, tmp_path / "run", secret, timeout_s=60)
    assert left == []  # every rank started said it went; none was waited for that never started
    ranks.join(timeout=10)
