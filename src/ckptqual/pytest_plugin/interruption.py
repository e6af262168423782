"""An interrupted run: an error test case for the test it stopped in and for each it never reached (the session
object notes which test was running and what interrupted it)."""

from __future__ import annotations

import pytest

from ckptqual.host import gpu
from ckptqual.limits.limits import Outcome
from ckptqual.pytest_plugin.drive_run import DriveRun
from ckptqual.pytest_plugin.held import session_of
from ckptqual.pytest_plugin.junit import LINE_PROPERTY, report_case
from ckptqual.pytest_plugin.options import DRIVE
from ckptqual.pytest_plugin.run import SUBJECT


def report_unfinished(session: pytest.Session, run: DriveRun, interruption: str) -> None:
    """An error test case for the drive's test that was running and for each that did not run, as the JUnit XML
    shows."""
    running = session_of(session.config).running
    record = run.begun
    for item in (item for item in session.items if item.stash.get(DRIVE, None) is run):
        done = record.data["tests"].get(item.nodeid, {}).get("when") == "call"
        if item.nodeid in record.data["tests"] and (item.nodeid != running or done):
            continue
        subject = item.stash.get(SUBJECT, item.name)
        skipped = None if item.nodeid == running else _would_skip(item)
        if item.nodeid == running:
            outcome, message = Outcome.INTERRUPTED, f"{subject} INTERRUPTED: {interruption}"
        elif skipped is not None:
            outcome, message = Outcome.SKIPPED, f"{subject} SKIPPED: {skipped}"
        else:
            outcome, message = Outcome.NOT_RUN, f"{subject} NOT_RUN: not run: {interruption}"
        record.record_test(item.nodeid, subject, outcome, message, "setup")
        failure = None if skipped is not None else message
        report_case(session, item.nodeid, item.location, "setup", failure, [(LINE_PROPERTY, message)], skipped)


def _would_skip(item: pytest.Item) -> str | None:
    """Why a test the interruption kept from running would have been skipped anyway (a sweep cell whose transfer
    type this host cannot run), as the test itself says it; None where it would have run."""
    cell = getattr(getattr(item, "callspec", None), "params", {}).get("sweep_cell")
    return gpu.probe().problem(cell.transfer) if cell is not None else None
