"""Measurement records: judged against declared limits, kept for the results JSON and the reports.

A measurement without a limit is kept and reported but not judged (verdict None).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckptqual import __version__
from ckptqual.faults import os_error_line
from ckptqual.thresholds import Outcome, Thresholds, Verdict


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

    @property
    def outcome(self) -> str:
        return self.verdict.outcome.value if self.verdict else "MEASURED"

    def to_dict(self) -> dict[str, Any]:
        data = {
            "measurement": self.measurement,
            "value": self.value,
            "unit": self.unit,
            "context": dict(self.context),
            "outcome": self.outcome,
            "limit": self.limit,
            "limit_number": self.limit_number,
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
    thresholds: Thresholds,
    measurement: str,
    value: float,
    unit: str,
    context: Mapping[str, Any],
    baselines: Mapping[str, float],
    scale: float,
) -> list[Judgement]:
    """The judgements of one measured value under every limit of the threshold file that applies to it."""
    limits = thresholds.limits_for(measurement, context)
    if not limits:
        return [Judgement(measurement, value, unit, context)]
    return [
        Judgement(
            measurement,
            value,
            unit,
            context,
            limit.evaluate(value, unit, baselines=dict(baselines), scale=scale, context=context),
            limit.describe(),
            limit.number,
        )
        for limit in limits
    ]


def failures(judgements: list[Judgement]) -> list[Judgement]:
    return [j for j in judgements if j.verdict and j.verdict.outcome == Outcome.FAIL]


def environment() -> dict[str, Any]:
    """Versions and host facts a result depends on."""
    versions = {"ckptqual": __version__, "python": platform.python_version()}
    for module in ("torch", "numpy", "kvikio", "pytest", "pytest_benchmark", "hypothesis"):
        loaded = sys.modules.get(module)
        if loaded is not None:
            versions[module] = getattr(loaded, "__version__", "unknown")
    return {"versions": versions, "host": platform.node(), "platform": platform.platform(), "cpus": os.cpu_count()}


@dataclass
class RunRecord:
    """Everything the results JSON holds, written atomically whenever it changes.

    Saving never raises: a failure (the results disk full, say) is kept in `save_error`, so that it cannot stop
    the run from cleaning up its target; the verdict then names it.
    """

    path: Path | None
    data: dict[str, Any] = field(default_factory=dict)
    save_error: str | None = None

    def __post_init__(self) -> None:
        self.data.update(
            started=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            environment=environment(),
            passes=[],
            measurements=[],
            tests={},
            errors=[],
        )

    def add_judgements(self, judgements: list[Judgement]) -> None:
        self.data["measurements"].extend(j.to_dict() for j in judgements)
        self.save()

    def record_test(self, nodeid: str, subject: str, outcome: str, message: str, when: str) -> None:
        """A test's outcome word and one-line message, what the run's verdict is computed from."""
        self.data["tests"][nodeid] = {"subject": subject, "outcome": str(outcome), "message": message, "when": when}
        self.save()

    def save(self) -> None:
        """Writes the JSON next to its final name, then renames it into place (never half-written)."""
        if self.path is None:
            return
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            temporary.write_text(json.dumps(self.data, indent=2, default=str) + "\n")
            os.replace(temporary, self.path)
            self.save_error = None
        except OSError as error:
            with contextlib.suppress(OSError):
                temporary.unlink(missing_ok=True)
            self.save_error = f"the results file could not be written: {os_error_line(error, 'write')}"
