"""What a run tells as it goes: one event per result. The record (report/record.py) keeps them, the progress
view (report/progress.py) prints them; the run itself neither stores nor prints anything."""

from __future__ import annotations

from typing import Any, Protocol


class RunEvents(Protocol):
    """Receives a run's results as they happen; every payload is JSON-ready data."""

    def ceiling(self, ceiling: dict[str, Any]) -> None: ...  # the suite's own speed on this host, before any I/O

    def started(self, target: dict[str, Any], drive: dict[str, Any]) -> None: ...

    def measuring_baseline(self, bytes_per_round: int) -> None: ...

    def baseline(self, baseline: dict[str, Any]) -> None: ...

    def checkpoint(self, checkpoint: dict[str, Any], of: int) -> None: ...

    def fill_started(self, number: int) -> None: ...

    def fill_ended(self, number: int) -> None: ...  # however it ended; fill_pass follows a pass that was written

    def fill_pass(self, result: dict[str, Any], wall_s: float) -> None: ...

    def steady_state(self, through_pass: int, state: dict[str, Any]) -> None: ...

    def restore(self, result: dict[str, Any]) -> None: ...

    def layout(self, layout: dict[str, Any]) -> None: ...

    def sweep(self, sweep: dict[str, Any]) -> None: ...

    def judged(self, judgements: list[dict[str, Any]]) -> None: ...

    def health(self, health: dict[str, Any]) -> None: ...

    def sample(self, sample: dict[str, Any]) -> None: ...  # one look at the host (host/sampler.py), every interval

    def timeseries(self, series: dict[str, Any]) -> None: ...  # the samples and marks so far

    def error(self, message: str) -> None: ...

    def left(self, entries: list[dict[str, Any]]) -> None: ...

    def abandoned(self, lines: list[str]) -> None: ...

    def finished(self, cleanup: dict[str, Any]) -> None: ...


class Broadcast:
    """Hands each event to every listener that takes it (a view may listen to a few events only), in order."""

    def __init__(self, *listeners: object) -> None:
        self.listeners = listeners

    def __getattr__(self, event: str):
        if not hasattr(RunEvents, event):
            raise AttributeError(f"no run event {event!r}")

        def tell(*args: Any) -> None:
            for listener in self.listeners:
                handler = getattr(listener, event, None)
                if handler is not None:
                    handler(*args)

        return tell
