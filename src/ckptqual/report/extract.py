"""The series a results record holds, read out for the figures, the HTML page and `compare` (record only)."""

from __future__ import annotations

import json
import os
import stat
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ckptqual.limits.units import to_unit
from ckptqual.report.schema import shape_problem

_FIX = "give the results file a run wrote (setting results)"
MAX_RESULTS_BYTES = 256 << 20  # a results file of a run of many hours is tens of MB; this bounds the read


class ResultsError(ValueError):
    """A results file that cannot be read, with the path and the fix."""


@dataclass(frozen=True)
class Run:
    """One results file: its record and the label legends and tables name it by: the one given, else the drive's
    (see drive_label)."""

    path: Path
    data: dict[str, Any]
    given_label: str | None = None

    @property
    def label(self) -> str:
        return self.given_label or drive_label(self.data)


def _known(value: Any) -> str | None:
    return str(value) if value not in (None, "", "unknown") else None


def drive_label(data: dict[str, Any]) -> str:
    """The drive a record was measured on: model (else the drive file's name), firmware and serial where the record
    knows them, else the device ("Solidigm D5-P5336 fw 5CV10302 sn PHAB1234")."""
    drive = data.get("drive", {})
    name = _known(drive.get("model")) or data.get("settings", {}).get("drive") or "unknown drive"
    firmware, serial = _known(drive.get("firmware")), _known(drive.get("serial"))
    parts = [name, f"fw {firmware}" if firmware else None, f"sn {serial}" if serial else None]
    if not serial and _known(drive.get("device")):
        parts.append(f"on {drive['device']}")
    return " ".join(part for part in parts if part)


def labelled(runs: list[Run], given: dict[Path, str] | None = None) -> list[Run]:
    """The runs with their labels: the `given` one for a path it names, else the drive's; where two runs would share
    a label (one drive measured twice), each gets its start time, and then its file name, too."""
    given = given or {}
    runs = [replace(run, given_label=given.get(run.path)) for run in runs]
    for extra in (lambda run: run.data.get("started"), lambda run: run.path.name):
        counts = Counter(run.label for run in runs)
        runs = [
            replace(run, given_label=f"{run.label} [{extra(run)}]") if counts[run.label] > 1 and extra(run) else run
            for run in runs
        ]
    return runs


def given_labels(pairs: list[str], paths: list[Path]) -> dict[Path, str]:
    """LABEL=FILE pairs by file; a pair without '=', with an empty label or a FILE not among `paths` is a
    ResultsError naming it and the fix."""
    labels: dict[Path, str] = {}
    for pair in pairs:
        label, _, file = pair.rpartition("=")
        if not label.strip() or Path(file) not in paths:
            known = ", ".join(str(path) for path in paths)
            raise ResultsError(f"label {pair!r}: write LABEL=FILE, FILE one of the results files given ({known})")
        labels[Path(file)] = label.strip()
    return labels


def load_run(path: Path) -> Run:
    """The record of a results file, checked against the record's schema (report.schema); a file that is missing,
    not a regular file, too large, not JSON, not ckptqual's or of the wrong shape is a ResultsError naming why."""
    try:
        text = _read_bounded(path)
        data = json.loads(text)
    except OSError as error:
        raise ResultsError(f"{path}: {error.strerror}; {_FIX}") from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as error:
        raise ResultsError(f"{path}: not JSON ({error}); {_FIX}") from None
    problem = shape_problem(data)
    if problem is not None:
        raise ResultsError(f"{path}: not a results record as ckptqual writes it: {problem}; {_FIX}")
    return Run(path, data)


def _read_bounded(path: Path) -> str:
    """The text of a regular file of at most MAX_RESULTS_BYTES; a FIFO, a device or a larger file is refused."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(descriptor, "rb") as file:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise ResultsError(f"{path}: not a regular file; {_FIX}")
        data = file.read(MAX_RESULTS_BYTES + 1)
    if len(data) > MAX_RESULTS_BYTES:
        raise ResultsError(f"{path}: larger than {MAX_RESULTS_BYTES >> 20} MiB; {_FIX}")
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
