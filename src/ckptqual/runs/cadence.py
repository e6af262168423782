"""A training cadence: the compute time between checkpoints, and whether they are saved asynchronously.

The interval runs from the end of one checkpoint's stall to the start of the next, as DLIO's
`time_between_checkpoints` does; the drive sits idle in it unless an asynchronous save is still writing.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol


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


class Stalled(Protocol):
    stall_s: float
    interval_s: float | None


def stall_fraction(checkpoints: Iterable[Stalled]) -> float:
    """The share of the training time lost to checkpoints: their stall / (stall + the compute intervals before them)."""
    stall = interval = 0.0
    for checkpoint in checkpoints:
        stall += checkpoint.stall_s
        interval += checkpoint.interval_s or 0.0
    return stall / (stall + interval) if stall + interval > 0 else 0.0
