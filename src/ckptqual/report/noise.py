"""The regression gate's noise band: how far two runs' figures may differ by chance, from what each run measured.

A figure of several rounds has the standard error of its mean; a figure of one round borrows the spread of one
round of a related figure of the same run. Two figures differ beyond noise when their difference exceeds Student's
t at 99 % (two-sided, Welch's degrees of freedom, so few rounds give a wide band) times the standard error of the
difference, and never by less than NOISE_FLOOR. Figures of one round each that two runs share cell by cell (the
read sweep) are compared as pairs: the spread of the pairs' log ratios is their noise."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import fmean, stdev

NOISE_FLOOR = 0.05  # no band is narrower than this fraction of the base figure
# Student's t at 0.995 (99 % two-sided) for 1 to 30 degrees of freedom; more take the last, slightly wider.
# fmt: off
T_995 = (63.657, 9.925, 5.841, 4.604, 4.032, 3.707, 3.499, 3.355, 3.25, 3.169, 3.106, 3.055, 3.012, 2.977, 2.947,
         2.921, 2.898, 2.878, 2.861, 2.845, 2.831, 2.819, 2.807, 2.797, 2.787, 2.779, 2.771, 2.763, 2.756, 2.75)
# fmt: on
RULE = (
    f"noise band: Student's t at 99 % times the standard error of the difference of the means, from each run's "
    f"rounds (a figure of one round takes the spread of one round of its run's related figure; sweep cells the "
    f"spread of the cells' log ratios), at least {NOISE_FLOOR:.0%}; host-bound figures are not judged; the band is "
    f"the smallest change the gate can detect: a metric whose band is wider than the allowance is not resolved"
)


@dataclass(frozen=True)
class Noise:
    """A figure's noise in one run: the standard error of the figure (in its unit) and the degrees of freedom of
    that estimate."""

    standard_error: float
    freedom: int


def t_quantile(freedom: float) -> float:
    """Student's t at 0.995 for `freedom` degrees of freedom, rounded down to a whole number (a wider band)."""
    return T_995[min(max(int(freedom), 1), len(T_995)) - 1]


def mean_noise(rounds: Sequence[float]) -> Noise | None:
    """The noise of the mean of `rounds`; None with fewer than two."""
    if len(rounds) < 2:
        return None
    return Noise(stdev(rounds) / math.sqrt(len(rounds)), len(rounds) - 1)


def single_noise(value: float, source: Sequence[float]) -> Noise | None:
    """The noise of one round of `value`: the relative spread of one round of `source`; None without two rounds."""
    if len(source) < 2 or fmean(source) <= 0:
        return None
    return Noise(stdev(source) / fmean(source) * value, len(source) - 1)


def band(base_mean: float, base: Noise, new: Noise) -> float:
    """The relative half-width within which two figures are alike: t times the standard error of their difference
    (Welch-Satterthwaite degrees of freedom), relative to the base figure, at least NOISE_FLOOR."""
    combined = math.hypot(base.standard_error, new.standard_error)
    if combined == 0 or base_mean <= 0:
        return NOISE_FLOOR
    freedom = combined**4 / (base.standard_error**4 / base.freedom + new.standard_error**4 / new.freedom)
    return max(NOISE_FLOOR, t_quantile(freedom) * combined / base_mean)


@dataclass(frozen=True)
class Paired:
    """Figures two runs share one by one, as log ratios new/base: their mean change, the band of that mean, and
    the band of one pair's change."""

    change: float
    band: float
    single_band: float


def paired(log_ratios: Sequence[float]) -> Paired | None:
    """The pairs' mean change and its bands, from the spread of their log ratios; None with fewer than three."""
    if len(log_ratios) < 3:
        return None
    spread, t = stdev(log_ratios), t_quantile(len(log_ratios) - 1)
    mean_band = max(NOISE_FLOOR, math.expm1(t * spread / math.sqrt(len(log_ratios))))
    return Paired(math.expm1(fmean(log_ratios)), mean_band, max(NOISE_FLOOR, math.expm1(t * spread)))


MAX_ROUNDS = 10_000  # beyond this many rounds a figure counts as one no run can resolve


def rounds_to_resolve(spreads: tuple[float, float], allowed: float) -> int | None:
    """The rounds per run at which the band of two figures whose rounds spread by `spreads` (each run's standard
    deviation of one round, relative to the base figure) is at most `allowed`; None where no number of rounds gets
    there (`allowed` under NOISE_FLOOR, or more than MAX_ROUNDS)."""
    variance = spreads[0] ** 2 + spreads[1] ** 2
    if allowed < NOISE_FLOOR:
        return None
    if variance == 0:
        return 2
    shape = variance**2 / (spreads[0] ** 4 + spreads[1] ** 4)  # Welch's freedom per round beyond the first
    return next(
        (n for n in range(2, MAX_ROUNDS + 1) if t_quantile(shape * (n - 1)) * math.sqrt(variance / n) <= allowed),
        None,
    )


def pairs_to_resolve(log_ratios: Sequence[float], allowed: float) -> int | None:
    """The pairs at which the band of their mean change (`paired`) is at most `allowed`, from their spread."""
    if allowed < NOISE_FLOOR:
        return None
    spread = stdev(log_ratios)
    return next(
        (k for k in range(3, MAX_ROUNDS + 1) if math.expm1(t_quantile(k - 1) * spread / math.sqrt(k)) <= allowed),
        None,
    )
