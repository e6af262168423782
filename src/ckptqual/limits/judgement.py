"""Judgements: a measured value against every declared limit that selects it.

A measurement without a limit is kept and reported but not judged (verdict None).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ckptqual.limits.cache_served import relative_to_served
from ckptqual.limits.host_bound import decide
from ckptqual.limits.limits import Limit, Outcome, Verdict, limits_for


def _distinct(a: float, b: float) -> tuple[str, str]:
    """Both numbers with enough significant digits that different values never print alike."""
    for digits in (4, 6, 9):
        texts = f"{a:.{digits}g}", f"{b:.{digits}g}"
        if texts[0] != texts[1] or a == b:
            break
    return texts


@dataclass(frozen=True)
class Judgement:
    """One measured value, its context (pass, cell, ...) and the verdict of each limit that applies."""

    measurement: str
    value: float
    unit: str
    context: Mapping[str, Any]
    verdict: Verdict | None = None
    limit: str | None = None
    limit_number: int | None = None
    host_bound: str | None = None  # why the figure measured the host's CPUs (see limits.host_bound), if it did
    relative_to: str | None = None  # the baseline the judging limit divides by, if it is relative
    waits: str | None = None  # what the figure's own threads waited for (limits.host_bound.waits_text), if measured

    @property
    def outcome(self) -> str:
        return self.verdict.outcome.value if self.verdict else "MEASURED"

    def figure(self) -> str | None:
        """The judged figure in a few words, value, limit and unit: `fill_throughput 1.2 GB/s = 0.31 of raw_write >=
        0.05 of raw_write (pass=1, state=fresh)`; MARGINAL or INVALID where the limit said so; None when unjudged."""
        if self.verdict is None:
            return None
        verdict = self.verdict
        unit = f"of {self.relative_to}" if self.relative_to else verdict.unit
        met = verdict.measured >= verdict.limit if verdict.comparator == ">=" else verdict.measured <= verdict.limit
        relation = verdict.comparator if met else {">=": "<", "<=": ">"}[verdict.comparator]
        measured, limit = _distinct(verdict.measured, verdict.limit)
        word = f" {verdict.outcome}" if verdict.outcome in (Outcome.MARGINAL, Outcome.INVALID) else ""
        where = ", ".join(f"{key}={value}" for key, value in self.context.items())
        raw = f"{self.value:.4g} {self.unit} = " if self.relative_to else ""
        comparison = f"{raw}{measured} {unit} {relation} {limit} {unit}{word}"
        waits = f" [{self.waits}]" if self.waits else ""
        return f"{self.measurement} {comparison}" + (f" ({where})" if where else "") + waits

    def to_dict(self) -> dict[str, Any]:
        data = {
            "measurement": self.measurement,
            "value": self.value,
            "unit": self.unit,
            "context": dict(self.context),
            "outcome": self.outcome,
            "limit": self.limit,
            "limit_number": self.limit_number,
            "host_bound": self.host_bound,
            "waits": self.waits,
        }
        if self.verdict:
            data |= {
                "judged_value": self.verdict.measured,
                "limit_value": self.verdict.limit,
                "limit_unit": self.verdict.unit,
                "message": self.verdict.message,
            }
        return data


def judge(
    limits: Iterable[Limit],
    measurement: str,
    value: float,
    unit: str,
    context: Mapping[str, Any],
    baselines: Mapping[str, float],
    host_bound: str | None = None,
    served_baselines: Mapping[str, str] | None = None,
    waits: str | None = None,
) -> list[Judgement]:
    """The judgements of one measured value under every one of `limits` (bound to the run's scale) that applies to it;
    a figure that was
    host-bound for `host_bound` keeps only the verdicts its bound decides, the others are INVALID, and so is every
    verdict relative to a baseline of `served_baselines` (baseline -> why a cache served it); `waits` says what the
    figure's own threads waited for."""
    applying = limits_for(limits, measurement, context)
    if not applying:
        return [Judgement(measurement, value, unit, context, host_bound=host_bound, waits=waits)]
    return [
        Judgement(
            measurement,
            value,
            unit,
            context,
            _decided(
                limit,
                limit.evaluate(value, unit, baselines=dict(baselines), context=context),
                host_bound,
                served_baselines or {},
            ),
            limit.describe(),
            limit.number,
            host_bound,
            limit.relative_to,
            waits,
        )
        for limit in applying
    ]


def _decided(limit: Limit, verdict: Verdict, host_bound: str | None, served: Mapping[str, str]) -> Verdict:
    """A limit's verdict on a figure: INVALID where its baseline was a cache's, else as the host-bound rule keeps it."""
    if limit.relative_to in served:
        return relative_to_served(limit, verdict, served)
    return decide(limit, verdict, host_bound)
