"""The SNIA SSS PTS 2.0 steady-state rule (docs/facts.md), a pure function over per-round values."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

WINDOW = 5  # the rounds the rule looks at: a run that must reach the steady state needs at least this many


@dataclass(frozen=True)
class SteadyState:
    """Whether the last `window` rounds are steady, and the figures that decided it (None: too few rounds)."""

    reached: bool
    window: tuple[float, ...]
    mean: float | None
    range_fraction: float | None
    excursion_fraction: float | None
    reason: str


def slope(values: Sequence[float]) -> float:
    """The least-squares slope of `values` against their round numbers 0, 1, 2, ..."""
    x_mean = (len(values) - 1) / 2
    y_mean = sum(values) / len(values)
    covariance = sum((x - x_mean) * (y - y_mean) for x, y in enumerate(values))
    return covariance / sum((x - x_mean) ** 2 for x in range(len(values)))


def steady_state(
    values: Sequence[float],
    window: int = WINDOW,
    max_range_fraction: float = 0.20,
    max_slope_excursion_fraction: float = 0.10,
) -> SteadyState:
    """Steady when, over the last `window` values, both max - min and the fitted line's rise are small."""
    if window < 2:
        raise ValueError(f"the window needs at least 2 rounds to fit a line, got {window}")
    if len(values) < window:
        reason = f"needs {window} rounds, got {len(values)}"
        return SteadyState(False, tuple(map(float, values)), None, None, None, reason)
    tail = tuple(float(v) for v in values[-window:])
    if not all(math.isfinite(v) and v > 0 for v in tail):
        raise ValueError(f"steady state needs positive finite values, got {tail}")
    mean = sum(tail) / window
    range_fraction = (max(tail) - min(tail)) / mean
    excursion_fraction = abs(slope(tail)) * (window - 1) / mean
    checks = (
        ("range", range_fraction, max_range_fraction),
        ("slope excursion", excursion_fraction, max_slope_excursion_fraction),
    )
    problems = [f"; {name} exceeds {limit:.0%}" for name, fraction, limit in checks if fraction > limit]
    figures = f"range {range_fraction:.1%}, slope excursion {excursion_fraction:.1%} of the mean {mean:.4g}"
    verdict = "not steady" if problems else "steady"
    reason = f"{verdict} over the last {window} rounds: {figures}{''.join(problems)}"
    return SteadyState(not problems, tail, mean, range_fraction, excursion_fraction, reason)
