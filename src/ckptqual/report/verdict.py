"""The verdict a results file holds, as every view shows it (terminal, `ckptqual summary`, HTML): with its basis,
which a file written before the basis existed lacks and which is then computed from the record it sits in."""

from __future__ import annotations

from typing import Any

from ckptqual.limits.measurements import is_relative
from ckptqual.limits.verdict import RunVerdict, uncounted_basis, verdict_basis


def recorded_verdict(data: dict[str, Any]) -> RunVerdict | None:
    """The run's verdict with its basis; None when the run recorded none (it did not finish)."""
    verdict = data.get("verdict")
    if not verdict:
        return None
    if "basis" in verdict or "drives" in data:  # an index's verdict combines its drives': recorded whole
        return RunVerdict.from_dict(verdict)
    return RunVerdict.from_dict({**verdict, "basis": list(record_basis(data))})


def record_basis(data: dict[str, Any]) -> tuple[str, ...]:
    """The verdict's basis from a run's record: the limits and settings it began with and what it judged."""
    limits = [limit for limit in data.get("limits", []) if "number" in limit]
    relative = {
        limit["number"]: is_relative(str(limit.get("measurement")), limit.get("relative_to")) for limit in limits
    }
    required = bool(data.get("settings", {}).get("require_steady_state"))
    steady = data.get("steady_state") or {}
    uncounted = uncounted_basis(device_regions(data))
    passes = len(data.get("passes", []))
    return verdict_basis(relative, data.get("measurements", []), steady, passes, required, uncounted)


def device_regions(data: dict[str, Any]) -> list[tuple[str, dict[str, Any] | None]]:
    """Every timed region of a record by kind (raw baseline, fill checkpoints, restores, sweep cells), with what the
    devices under the target moved meanwhile (its `device` entry)."""
    baseline = data.get("baseline", {}).get("device", {})
    regions = [(f"raw {kind}", count) for kind, rounds in baseline.items() for count in rounds]
    regions += [("fill checkpoints", c.get("device")) for c in data.get("checkpoints", [])]
    regions += [("restores", r.get("device")) for r in data.get("restore", [])]
    return regions + [("sweep cells", c.get("device")) for c in data.get("sweep", {}).get("cells", [])]
