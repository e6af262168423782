"""One drive of a run as the plugin holds it: its settings and, once begun, its record, qualification and verdict."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the run's own modules load when a drive is qualified, not with the plugin
    from ckptqual.config.run_settings import RunSettings
    from ckptqual.limits.ceiling import Ceiling
    from ckptqual.limits.verdict import RunVerdict
    from ckptqual.report.record import RunRecord
    from ckptqual.runs.qualification import Qualification


@dataclass
class DriveRun:
    """One drive of the run: its label (None when the run has one drive), its settings and, once begun in this
    process, its record, qualification and verdict; `problem`: why it cannot run (its target refused or too small),
    which fails only its own tests."""

    label: str | None
    settings: RunSettings
    problem: str | None = None
    record: RunRecord | None = None
    qualification: Qualification | None = None
    verdict: RunVerdict | None = None
    ceiling: dict | None = None  # the suite's own ceiling on this host, for the record (runs.calibration)

    def begin(self, write: bool = True) -> RunRecord:
        """The drive's record, begun the first time it is asked for, before its run touches the target; its results
        file is written only where `write` is true (not under --collect-only)."""
        from ckptqual.report.record import RunRecord

        if self.record is None:
            self.record = RunRecord.begin(self.settings, write)
            if self.ceiling is not None:
                self.record.ceiling(self.ceiling)
        return self.record

    @property
    def begun(self) -> RunRecord:
        """The record of a drive whose run has begun: the steps after its tests take only those."""
        if self.record is None:
            raise RuntimeError(f"the record of drive {self.label or self.settings.target} was read before it began")
        return self.record

    def check_ceiling(self) -> dict[str, Ceiling]:
        """Measures the suite's own speed on memory, records the ceiling it gives this drive and refuses (SettingsError)
        an absolute minimum above it; before any I/O on the target. Returns each phase's ceiling."""
        from ckptqual.config.space import check_ceiling
        from ckptqual.runs.calibration import measure_ceiling  # loads the engines (torch among them)

        self.ceiling, ceilings = measure_ceiling(self.settings.engine, self.settings.drives_at_once)
        if self.record is not None:
            self.record.ceiling(self.ceiling)
        check_ceiling(self.settings, ceilings)
        return ceilings
