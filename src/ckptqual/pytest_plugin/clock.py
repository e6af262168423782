"""The clock of a benchmark whose rounds are figures (pytest-benchmark's `benchmark(timer=...)` marker): it moves
only when told, so each round lasts exactly its figure. Not a plugin: the plugins that time rounds import it."""

from __future__ import annotations

from typing import Any

import pytest


class FigureClock:
    """A benchmark timer that moves only when told: a benchmark timed by it has the figures it is given as its rounds,
    the figures the regression gate judges, not the wall time of a test whose work varies."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


CLOCK = pytest.StashKey[FigureClock]()  # the clock of a test whose benchmark it times


def figure_clock(item: pytest.Item) -> FigureClock | None:
    """The FigureClock that times `item`'s benchmark, if it has one."""
    return item.stash.get(CLOCK, None)


def time_figures(benchmark: Any, clock: FigureClock, figures: list[float]) -> None:
    """Gives `benchmark` (timed by `clock`) one round per figure, each as long as the figure."""
    values = iter(figures)
    benchmark.pedantic(clock.advance, setup=lambda: ((next(values),), {}), rounds=len(figures), warmup_rounds=0)
