"""A training cadence: the compute time between checkpoints, and whether they are saved asynchronously.

The interval runs from the end of one checkpoint's stall to the start of the next, as DLIO's
`time_between_checkpoints` does; the drive sits idle in it unless an asynchronous save is still writing. Under async
save the ranks stage their state (the stall) and the checkpoint is written behind, during the next interval
(WriteBehind).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, NamedTuple, Protocol, TypeVar


@dataclass(frozen=True)
class Cadence:
    """`interval_s`: compute seconds between checkpoints (0: back to back); `async_save`: stage to host memory and
    write behind, as torch.distributed.checkpoint.async_save does."""

    interval_s: float = 0.0
    async_save: bool = False


BACK_TO_BACK = Cadence()  # the review's: no compute between checkpoints, saved synchronously


@dataclass(frozen=True)
class Due:
    """When a checkpoint became due on the main process's clock, and the compute interval kept before it (None: the
    first checkpoint of the run)."""

    at: float
    kept_s: float | None


class Clock:
    """The training's side of the cadence: a checkpoint is due `interval_s` after the last stall ended."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._stall_end: float | None = None

    def due(self) -> Due:
        """Waits out what is left of the interval (the training's compute) and says when the checkpoint is due. Where
        the suite itself took longer (its work between passes), the checkpoint was due when the interval ended: the
        suite's time is no training time."""
        now = time.monotonic()
        if self._stall_end is None:
            return Due(now, None)
        due = self._stall_end + self.interval_s
        if now >= due:
            return Due(due, self.interval_s)
        time.sleep(due - now)
        now = time.monotonic()
        return Due(now, now - self._stall_end)

    def stalled(self, until: float) -> None:
        """Training went on again at `until` (monotonic)."""
        self._stall_end = until


class Stall(NamedTuple):
    """An async checkpoint's round as a benchmark sees it when its save returns: the training stall, as its writes
    are still under way."""

    seconds: float


@dataclass(frozen=True)
class AsyncTimes:
    """An async save on the main process's clock: the wait for the previous save, the staging, and the time from
    the end of the staging until the checkpoint was durable."""

    wait_s: float
    stage_s: float
    behind_s: float

    @property
    def stall_s(self) -> float:
        return self.wait_s + self.stage_s

    @property
    def seconds_to_durable(self) -> float:
        return self.stall_s + self.behind_s


Written = TypeVar("Written")


@dataclass(frozen=True)
class _InFlight(Generic[Written]):
    """A checkpoint being written behind: its writing, who takes it when durable, and its stall's times."""

    writing: Future[tuple[Written, float]]
    done: Callable[[Written, AsyncTimes], None]
    wait_s: float
    stage_s: float
    staged: float


class WriteBehind(Generic[Written]):
    """The async path: one checkpoint at a time is written on a thread of its own while training goes on; the next
    save first waits until it is durable (that wait is stall), then stages (stall), then is written behind."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._writer = ThreadPoolExecutor(1, "ckptqual-async-save")
        self._in_flight: _InFlight[Written] | None = None
        self._last_durable: float | None = None  # when the last checkpoint written behind became durable

    @property
    def writing(self) -> bool:
        """Whether a checkpoint is being written behind (or written and not yet settled)."""
        return self._in_flight is not None

    def save(
        self,
        due: Due,
        stage: Callable[[], None],
        write: Callable[[], Written],
        done: Callable[[Written, AsyncTimes], None],
    ) -> Stall:
        """Once the checkpoint is `due` and the one before it durable, runs `stage` (the ranks copy their state) and
        starts `write` behind; `done` gets what it wrote and its times once it is durable (settle)."""
        self.settle()
        wait_s = max(0.0, self._last_durable - due.at) if self._last_durable is not None else 0.0
        staging = time.monotonic()
        stage()
        staged = time.monotonic()
        self.clock.stalled(staged)

        def behind() -> tuple[Written, float]:
            return write(), time.monotonic()

        self._in_flight = _InFlight(self._writer.submit(behind), done, wait_s, staged - staging, staged)
        return Stall(wait_s + staged - staging)

    def settle(self) -> None:
        """Waits for the checkpoint being written behind, if any, notes when it became durable and hands it to its
        `done`; raises what its writing raised."""
        if self._in_flight is None:
            return
        flight, self._in_flight = self._in_flight, None
        written, self._last_durable = flight.writing.result()
        flight.done(written, AsyncTimes(flight.wait_s, flight.stage_s, self._last_durable - flight.staged))

    def close(self) -> None:
        """Waits for a checkpoint still being written behind (its failure, if any, is moot now: a run that ends early
        stops its ranks first) and ends the writer."""
        with contextlib.suppress(Exception):
            self.settle()
        self._writer.shutdown()


class Stalled(Protocol):
    @property
    def stall_s(self) -> float: ...
    @property
    def interval_s(self) -> float | None: ...


def stall_fraction(checkpoints: Iterable[Stalled]) -> float:
    """The share of the training time lost to checkpoints: their stall / (stall + the compute intervals before them)."""
    stall = interval = 0.0
    for checkpoint in checkpoints:
        stall += checkpoint.stall_s
        interval += checkpoint.interval_s or 0.0
    return stall / (stall + interval) if stall + interval > 0 else 0.0


class Paced(Protocol):
    """A checkpoint's cadence figures (runs.fill.CheckpointRecord)."""

    @property
    def stall_s(self) -> float: ...
    @property
    def seconds_to_durable(self) -> float: ...
    @property
    def interval_s(self) -> float | None: ...
    @property
    def wait_s(self) -> float: ...
    @property
    def stage_s(self) -> float: ...
    @property
    def remove_s(self) -> float: ...
    @property
    def async_save(self) -> bool: ...


def writes_after_stall_s(checkpoint: Paced) -> float:
    """How long the drive kept writing a checkpoint after training went on (async), or would have had it been saved
    asynchronously (sync: the save and the removal before it): the interval its writes need."""
    if checkpoint.async_save:
        return checkpoint.seconds_to_durable - checkpoint.stall_s
    return checkpoint.seconds_to_durable + checkpoint.remove_s


class PacedFigures(NamedTuple):
    """A checkpoint's stall, wait and seconds to durable."""

    stall_s: float
    wait_s: float
    seconds_to_durable: float


def slower_by(checkpoint: Paced, seconds: float) -> PacedFigures:
    """A checkpoint's cadence figures had its save taken `seconds` longer, at the same cadence: a synchronous stall
    grows with the save; under async save the writes after the stall grow, and what of them outlasts the interval is
    a wait of the next (here: of this one, each checkpoint alike). Each figure grows with `seconds`."""
    if not checkpoint.async_save:
        stall = max(0.0, checkpoint.stall_s + seconds)
        return PacedFigures(stall, checkpoint.wait_s, stall)
    after = max(0.0, writes_after_stall_s(checkpoint) + seconds)
    wait = max(0.0, after - (checkpoint.interval_s or 0.0))
    stall = checkpoint.stage_s + wait
    return PacedFigures(stall, wait, stall + after)
