"""The multi-node controller answers Ctrl-C or SIGTERM at once while it waits for its workers to join: it tells
those that may come to stop, and ends, without waiting for late ranks (they end by themselves once it is gone)."""

from __future__ import annotations

import signal
import socket
import time

import pytest

from ckptqual.runs import cluster


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
