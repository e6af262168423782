"""What the plugin holds for a pytest run: its drives, what the selection did, the JUnit XML's additions, the workers'
rows and the verdict, in one SessionState kept in the config's stash. The QualificationSession (session.py) owns it and
ends the session; every wiring module reads and fills it through `session_of`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from ckptqual.config.values import SettingsError
    from ckptqual.limits.verdict import RunVerdict
    from ckptqual.pytest_plugin.drive_run import DriveRun
    from ckptqual.runs.sweep.driver import SweepRun

SESSION_PLUGIN = "ckptqual-session"


@dataclass(frozen=True)
class Collected:
    """A collected qualification test: its drive's label (None where the run has one drive), part and subject;
    `dropped`: how the selection dropped it, if it did."""

    label: str | None
    part: str
    subject: str
    dropped: str | None = None


class SessionState:
    """A pytest run's qualification state, made the first time a hook asks for it."""

    def __init__(self) -> None:
        # the drives, resolved once (options.drive_runs), or why they could not be
        self.drives: list[DriveRun] | SettingsError | None = None
        self.refused: str | None = None  # why a run over one drive was refused at collection, before it started
        self.collected: dict[str, Collected] = {}  # each qualification test a collected file defines (selection)
        self.collected_count = 0  # the tests collected so far: each one's place in the collection (drives)
        self.sweeps: dict[str | None, SweepRun] = {}  # each drive's read sweep, by label
        self.cufile_log: str | None = None  # where ckptqual told cuFile to log
        self.running: str | None = None  # the test running now (for an interrupted run's report)
        self.interrupted_by: str | None = None  # the signal that interrupted the session, in words
        # with several drives over xdist: each drive's row as its worker sent it, the drives some worker selected,
        # and why a drive's verdict cannot stand (its worker died in one of its tests)
        self.rows: dict[str, dict[str, Any]] = {}
        self.selected: set[str] = set()
        self.crashes: dict[str, str] = {}
        self.index: dict[str, Any] | None = None  # the index of a run over several drives, once made
        self.verdict: RunVerdict | None = None  # the run's verdict, once given
        self.suite_properties: list[tuple[str, str]] = []  # added to the JUnit XML's test suite
        self.junit_path: Path | None = None  # where the run's JUnit XML goes (--junitxml, resolved)
        self.pytests_junit: Path | None = None  # where pytest writes it: a file in a directory of ckptqual's own
        self.compared: list[dict[str, Any]] = []  # the saved benchmark runs this run is compared against
        self.benchmark_rows: list[dict[str, Any]] = []  # this run's benchmarks and the saved ones, as compared

    def records(self) -> dict[str | None, dict[str, Any]]:
        """The record of each drive begun in this process, by label (None: the run's one drive)."""
        return {
            run.label: run.record.data
            for run in (self.drives if isinstance(self.drives, list) else [])
            if run.record is not None
        }

    def interruption(self, exitstatus: int) -> str | None:
        """What interrupted the session and during which test, in words; None when it was not interrupted."""
        if exitstatus != pytest.ExitCode.INTERRUPTED:
            return None
        during = f" during {self.running}" if self.running else ""
        return f"the run was interrupted by {self.interrupted_by or 'an interrupt'}{during}"


_STATE = pytest.StashKey[SessionState]()


def session_of(config: pytest.Config) -> SessionState:
    """The run's SessionState, made the first time it is asked for."""
    if _STATE not in config.stash:
        config.stash[_STATE] = SessionState()
    return config.stash[_STATE]
