"""Short labels for the report's figures and headings (model and firmware, else the drive file and mount, or the
label given), told apart only by what differs; the full identity of each run goes in a table beside them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ckptqual.report.extract import Run

_EXTRAS: tuple[Callable[[Run], str | None], ...] = (
    lambda run: _sn(run.data),
    lambda run: _known(run.data.get("drive", {}).get("mount_point")),
    lambda run: _when(run.data),
    lambda run: run.path.name,
    lambda run: str(run.path),
)


def _known(value: Any) -> str | None:
    return str(value) if value not in (None, "", "unknown") else None


def _sn(data: dict[str, Any]) -> str | None:
    serial = _known(data.get("drive", {}).get("serial"))
    return f"sn {serial}" if serial else None


def _when(data: dict[str, Any]) -> str | None:
    """The run's start as 'YYYY-MM-DD HH:MM' (the record keeps ISO 8601 with seconds and the zone)."""
    started = _known(data.get("started"))
    return started[:16].replace("T", " ") if started else None


def model_of(data: dict[str, Any]) -> str:
    """The drive's model, else the name of the drive file it was judged by ("local"), else "unknown drive"."""
    drive, settings = data.get("drive", {}), data.get("settings", {})
    thresholds = _known(settings.get("thresholds_file"))
    return _known(drive.get("model")) or (Path(thresholds).stem if thresholds else None) or "unknown drive"


def short_label(data: dict[str, Any]) -> str:
    """Model and firmware ("Solidigm D5-P5336 fw 5CV10302"); without a model, the drive file's name and the
    drive's label in a run of several drives ("local loop2")."""
    firmware = _known(data.get("drive", {}).get("firmware"))
    parts = [model_of(data), f"fw {firmware}" if firmware else None]
    if not _known(data.get("drive", {}).get("model")):
        parts.append(_known(data.get("settings", {}).get("drive_label")))
    return " ".join(part for part in parts if part)


def short_labelled(runs: Sequence[Run], given: dict[Path, str] | None = None) -> list[Run]:
    """The runs with short labels: the one given for a path, else short_label; runs that would share one are told
    apart by the first of serial, mount point, start time, file name and path that differs among them."""
    given = given or {}
    labelled = [replace(run, given_label=given.get(run.path) or short_label(run.data)) for run in runs]
    for extra in _EXTRAS:
        counts = Counter(run.label for run in labelled)
        groups: dict[str, set[str | None]] = {}
        for run in labelled:
            groups.setdefault(run.label, set()).add(extra(run))
        labelled = [
            replace(run, given_label=f"{run.label} {extra(run)}")
            if counts[run.label] > 1 and len(groups[run.label]) > 1 and extra(run)
            else run
            for run in labelled
        ]
    return labelled


def identity_rows(runs: Sequence[Run]) -> list[list[str]]:
    """One row per run: its short label and its full identity, for the table beside the figures."""
    rows = []
    for run in runs:
        drive, settings = run.data.get("drive", {}), run.data.get("settings", {})
        rows.append(
            [
                run.label,
                _known(drive.get("model")) or "unknown",
                _known(drive.get("firmware")) or "unknown",
                _known(drive.get("serial")) or "unknown",
                f"{drive.get('device', '?')} at {drive.get('mount_point', '?')}",
                str(settings.get("drive", "")),
                str(run.data.get("started", "")),
                str(run.path),
            ]
        )
    return rows


IDENTITY_HEADERS = ("label", "model", "firmware", "serial", "device", "drive file", "started", "results file")
