"""The series a results record holds, read out for the figures, the HTML page and `compare` (record only)."""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptqual.limits.units import to_unit
from ckptqual.report.schema import shape_problem

MAX_RESULTS_BYTES = 256 << 20  # a results file of a run of many hours is tens of MB; this bounds the read


class ResultsError(ValueError):
    """A results file that cannot be read, with the path and the fix."""


@dataclass(frozen=True)
class Run:
    """One results file: its record and a short label for legends ("a: Solidigm D5-P5336 fw 5CV10302")."""

    path: Path
    data: dict[str, Any]

    @property
    def label(self) -> str:
        drive = self.data.get("drive", {})
        model, firmware = drive.get("model"), drive.get("firmware")
        if model and model != "unknown":
            return f"{self.path.stem}: {model}" + (f" fw {firmware}" if firmware and firmware != "unknown" else "")
        return f"{self.path.stem}: {self.data.get('settings', {}).get('drive', 'unknown drive')}"


def load_run(path: Path) -> Run:
    """The record of a results file, checked against the record's schema (report.schema); a file that is missing,
    not a regular file, too large, not JSON, not ckptqual's or of the wrong shape is a ResultsError naming why."""
    try:
        text = _read_bounded(path)
        data = json.loads(text)
    except OSError as error:
        raise ResultsError(f"{path}: {error.strerror}; give the file written by --results") from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as error:
        raise ResultsError(f"{path}: not JSON ({error}); give the file written by --results") from None
    problem = shape_problem(data)
    if problem is not None:
        raise ResultsError(
            f"{path}: not a results record as ckptqual writes it: {problem}; give the file written by --results"
        )
    return Run(path, data)


def _read_bounded(path: Path) -> str:
    """The text of a regular file of at most MAX_RESULTS_BYTES; a FIFO, a device or a larger file is refused."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(descriptor, "rb") as file:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise ResultsError(f"{path}: not a regular file; give the file written by --results")
        data = file.read(MAX_RESULTS_BYTES + 1)
    if len(data) > MAX_RESULTS_BYTES:
        raise ResultsError(f"{path}: larger than {MAX_RESULTS_BYTES >> 20} MiB; give the file written by --results")
    return data.decode()


def limit_in(entry: dict[str, Any], unit: str) -> float | None:
    """A judged measurement's bound in `unit` (the measurement's own unit family), or None where it has none.

    The record keeps the value in its unit and both the judged value and the bound in the limit's unit (a ratio
    for relative limits); the two are proportional, so the bound in the value's unit is bound * value / judged.
    """
    bound, judged = entry.get("limit_value"), entry.get("judged_value")
    if bound is None or not judged:
        return None
    return to_unit(bound * entry["value"] / judged, entry["unit"], unit)


def limits_of(data: dict[str, Any], measurement: str) -> list[dict[str, Any]]:
    """The judged entries of `measurement` that carry a bound."""
    return [m for m in data.get("measurements", []) if m["measurement"] == measurement and m.get("limit_value")]


def passes(data: dict[str, Any]) -> dict[int, list[dict[str, Any]]]:
    """Each pass's checkpoints in the order they were written."""
    grouped: dict[int, list[dict[str, Any]]] = {}
    for checkpoint in data.get("checkpoints", []):
        grouped.setdefault(checkpoint["pass_number"], []).append(checkpoint)
    return dict(sorted(grouped.items()))


def steady_rounds(data: dict[str, Any]) -> list[float]:
    """The SNIA rule's rounds: per-checkpoint GB/s of passes 2 and later, in order."""
    return [c["GBps"] for number, checkpoints in passes(data).items() if number >= 2 for c in checkpoints]


def measured_cells(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The read sweep's cells that were measured (not skipped)."""
    return [cell for cell in data.get("sweep", {}).get("cells", []) if "GiBps" in cell]
