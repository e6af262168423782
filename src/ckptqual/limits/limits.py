"""Declared limits and their verdicts: a bound on a measurement (limits.measurements) with its unit and marginal band.

A limit is data, declared like an OpenHTF measurement: name, unit, bound, marginal band and the source of its
number (docs/facts.md). Pure: the drive file that declares limits is read in ckptqual.config.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from ckptqual.limits.measurements import LIMITED
from ckptqual.limits.units import to_unit, unit_kind

BASELINES = ("raw_write", "raw_read")
DRIVE_STATES = ("fresh", "steady")  # fill pass 1 runs on the fresh drive, later passes in steady state


class MissingBaselineError(ValueError):
    """A relative limit was evaluated without the baseline it is relative to."""


# Below this many bytes a layout's time is its per-file cost, not throughput: verified, ratio not judged.
MIN_JUDGED_BYTES = 16 << 20


class Outcome(StrEnum):
    """The outcome of a check or of a whole test. A limit gives PASS, MARGINAL or FAIL; the rest come from the
    suite: NOT_STEADY (SNIA rule not met), INVALID (the figure measured the host, not the drive), and for a test
    that did not conclude: ERROR (it broke), SKIPPED, NOT_RUN (an earlier failure), INTERRUPTED; and MEASURED for a
    test that only measures, where no limit judged its figures."""

    PASS = "PASS"
    MARGINAL = "MARGINAL"
    FAIL = "FAIL"
    NOT_STEADY = "NOT_STEADY"
    INVALID = "INVALID"
    ERROR = "ERROR"
    SKIPPED = "SKIPPED"
    NOT_RUN = "NOT_RUN"
    INTERRUPTED = "INTERRUPTED"
    MEASURED = "MEASURED"  # a test of figures no limit judges (a sweep cell without a limit): it found nothing wrong


Scalar = str | int | float
Where = tuple[tuple[str, tuple[Scalar, ...]], ...]


def _number_text(value: float, digits: int = 4) -> str:
    return f"{value:.{digits}g}" if abs(value) < 10**digits else f"{value:.0f}"


def _distinct_texts(a: float, b: float) -> tuple[str, str]:
    """Both numbers printed with enough digits that different values never print alike."""
    for digits in (4, 6, 9):
        texts = _number_text(a, digits), _number_text(b, digits)
        if texts[0] != texts[1] or a == b:
            break
    return texts


def _where_text(where: Mapping[str, Any]) -> str:
    return ", ".join(f"{key}={value}" for key, value in where.items())


@dataclass(frozen=True)
class Verdict:
    """A measurement judged against one limit; `comparator` is what the limit requires (">=" or "<=")."""

    outcome: Outcome
    measured: float
    limit: float
    unit: str
    comparator: str
    message: str


@dataclass(frozen=True)
class Limit:
    """A declared bound on a measurement: at least `min` or at most `max`, in `unit`, with a marginal band."""

    measurement: str
    unit: str
    source: str
    min: float | None = None
    max: float | None = None
    marginal: float = 0.0
    where: Where = ()
    relative_to: str | None = None
    at_full_scale: bool = False
    number: int = 0  # its place among the file's [[limit]] blocks, from 1
    scale: float = 1.0  # the run's --scale, bound by at_scale when the settings are resolved

    @property
    def run_bound(self) -> float:
        """The bound the run is judged by: an at_full_scale bound times the run's scale."""
        return self.bound * self.scale if self.at_full_scale else self.bound

    @property
    def bound(self) -> float:
        bound = self.min if self.min is not None else self.max
        if bound is None:
            raise ValueError(f"{self.measurement}: a limit needs a min or a max; the drive file declares one")
        return bound

    @property
    def comparator(self) -> str:
        return ">=" if self.min is not None else "<="

    def matches(self, context: Mapping[str, Any]) -> bool:
        """Whether a measurement with `context` is selected: it has every `where` key, with a listed value."""
        return all(key in context and context[key] in values for key, values in self.where)

    def describe(self) -> str:
        """The requirement for reports, e.g. `>= 2.37 GB/s` or `>= 0.25 of raw_write`."""
        text = f"{self.comparator} {_number_text(self.bound)} {self._unit_text()}"
        return f"{text} at full scale" if self.at_full_scale else text

    def title(self) -> str:
        """The limit in one line for a person: number, measurement, requirement and selection."""
        where = _where_text(self.to_dict()["where"])
        return f"limit {self.number} ({self.measurement} {self.describe()}{f' where {where}' if where else ''})"

    def to_dict(self) -> dict[str, Any]:
        """The limit as JSON-ready data, keyed like the threshold file (`name` becomes `measurement`)."""
        return {
            "number": self.number,
            "measurement": self.measurement,
            "min": self.min,
            "max": self.max,
            "unit": self.unit,
            "marginal": self.marginal,
            "where": {key: values[0] if len(values) == 1 else list(values) for key, values in self.where},
            "relative_to": self.relative_to,
            "at_full_scale": self.at_full_scale,
            "source": self.source,
        }

    def evaluate(
        self,
        value: float,
        unit: str,
        *,
        baselines: Mapping[str, float] | None = None,
        context: Mapping[str, Any] | None = None,
    ) -> Verdict:
        """Judge `value` in `unit`; a relative limit divides it by `baselines[relative_to]`, given in bytes per
        second (B/s); an at_full_scale bound is multiplied by the run's scale. `context` only labels the message."""
        measured, basis = self._measured(value, unit, baselines)
        bound, scaling = self.run_bound, self._scaling()
        outcome = self._outcome(measured, bound)
        selector = _where_text(context if context is not None else self.to_dict()["where"])
        message = self._message(outcome, measured, bound, [basis, scaling, selector])
        return Verdict(outcome, measured, bound, self.unit, self.comparator, message)

    def _unit_text(self) -> str:
        return f"of {self.relative_to}" if self.relative_to else self.unit

    def _measured(self, value: float, unit: str, baselines: Mapping[str, float] | None) -> tuple[float, str]:
        if not math.isfinite(value):
            raise ValueError(f"{self.measurement}: measured value {value!r} is not a finite number")
        if self.relative_to is None:
            return to_unit(value, unit, self.unit), ""
        if unit_kind(unit) != "throughput":
            raise ValueError(f"{self.measurement}: a relative limit needs a throughput, got {unit}")
        baseline = (baselines or {}).get(self.relative_to)
        if baseline is None:
            raise MissingBaselineError(
                f"{self.measurement}: the limit is relative to {self.relative_to}, but no such baseline was "
                f"given; measure it on the same target and pass baselines={{'{self.relative_to}': ...}}"
            )
        if not (math.isfinite(baseline) and baseline > 0):
            raise ValueError(f"{self.measurement}: baseline {self.relative_to} must be > 0, got {baseline!r}")
        baseline_in_unit = to_unit(baseline, "B/s", unit)
        basis = f"{_number_text(value)} {unit} / {self.relative_to} {_number_text(baseline_in_unit)} {unit}"
        return to_unit(value, unit, "B/s") / baseline, basis

    def _scaling(self) -> str:
        if not self.at_full_scale:
            return ""
        return f"scale {self.scale:g} x {_number_text(self.bound)} {self.unit} at full scale"

    def _outcome(self, measured: float, bound: float) -> Outcome:
        if self.min is not None:
            if measured < bound:
                return Outcome.FAIL
            return Outcome.MARGINAL if measured < bound * (1 + self.marginal) else Outcome.PASS
        if measured > bound:
            return Outcome.FAIL
        return Outcome.MARGINAL if measured > bound * (1 - self.marginal) else Outcome.PASS

    def _message(self, outcome: Outcome, measured: float, bound: float, notes: list[str]) -> str:
        relation = self.comparator
        if outcome is Outcome.FAIL:
            relation = "<" if self.min is not None else ">"
        measured_text, bound_text = _distinct_texts(measured, bound)
        side = "min" if self.min is not None else "max"
        band = f", within the {self.marginal * 100:g} % marginal band" if outcome is Outcome.MARGINAL else ""
        details = "; ".join(note for note in [*notes, f"source: {self.source}"] if note)
        unit = self._unit_text()
        comparison = f"{measured_text} {unit} {relation} {side} {bound_text} {unit}"
        return f"{self.measurement} {comparison}{band} ({details})"


def at_scale(limits: Iterable[Limit], scale: float) -> tuple[Limit, ...]:
    """`limits` bound to a run at `scale`, which multiplies each at_full_scale bound."""
    return tuple(replace(limit, scale=scale) for limit in limits)


def limits_for(limits: Iterable[Limit], measurement: str, context: Mapping[str, Any]) -> list[Limit]:
    """The limits on `measurement` whose `where` selects `context`."""
    if measurement not in LIMITED:
        raise ValueError(f"unknown measurement {measurement!r}; known: {', '.join(LIMITED)}")
    return [limit for limit in limits if limit.measurement == measurement and limit.matches(context)]
