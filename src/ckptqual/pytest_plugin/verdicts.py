"""The run's one verdict: each drive's, computed from its tests' outcome words, the limits none judged, the required
parts that did not run, an interruption and the refusal of a run that never started, with its basis; kept in the
record, reported in the JUnit XML and printed as the last line of the output. With several drives the run's verdict
is QUALIFIED only if every drive's is. Steps of the end of the session (session.QualificationSession)."""

from __future__ import annotations

import pytest

from ckptqual.faults import RunError
from ckptqual.limits.health import MEASURED as HEALTH_MEASUREMENTS
from ckptqual.limits.health import SUBJECT as HEALTH_SUBJECT
from ckptqual.limits.limits import Outcome
from ckptqual.limits.verdict import (
    RunVerdict,
    overall_verdict,
    unjudged_limits,
    unmet_requirements,
)
from ckptqual.pytest_plugin.drive_index import report_drives
from ckptqual.pytest_plugin.drive_run import DriveRun
from ckptqual.pytest_plugin.drives import is_worker, selected_runs, send_rows
from ckptqual.pytest_plugin.held import session_of
from ckptqual.pytest_plugin.interruption import report_unfinished
from ckptqual.pytest_plugin.junit import report_health, report_verdict
from ckptqual.pytest_plugin.options import resolved_runs
from ckptqual.pytest_plugin.selection import part_runs
from ckptqual.report.verdict import record_basis

HEALTH_NODEID = "ckptqual::health"


def close_run(session: pytest.Session, run: DriveRun, stopped: str | None) -> None:
    """An interrupted run's qualification closed now (ranks stopped, target cleaned), and an error test case for each
    of its tests the interruption kept from finishing."""
    if not stopped:
        return
    if run.qualification is not None:
        try:
            run.qualification.close()
        except RunError as failure:  # e.g. a message refused while the interrupted run stopped: recorded, no traceback
            run.begun.error(str(failure))
    report_unfinished(session, run, stopped)


def drive_verdict(session: pytest.Session, run: DriveRun, stopped: str | None) -> RunVerdict:
    """One drive's verdict, from its tests, the limits none judged, the required parts that did not run, an
    interruption and the refusal of a run that never started; with its basis, put in its record (saved next)."""
    record = run.begun
    _health_test(run)
    settings, tests, data = run.settings, record.data["tests"], record.data
    thresholds = settings.thresholds
    parts = part_runs(session.config, run.label, tests, thresholds.requires)
    run_verdict = overall_verdict(
        tests,
        unjudged_limits(thresholds.limits, data["measurements"]),
        stopped,
        unmet_requirements(thresholds.requires, parts, thresholds.requires_origin),
        data.get("cleanup", {}).get("planted", ()),
        session_of(session.config).refused,
    )
    reasons = (*run_verdict.reasons, record.save_error) if record.save_error else run_verdict.reasons
    run_verdict = RunVerdict(run_verdict.overall, reasons, record_basis(data))
    data["verdict"] = run_verdict.to_dict()
    return run_verdict


def run_verdict(session: pytest.Session, runs: list[DriveRun], stopped: str | None) -> RunVerdict | None:
    """The run's verdict, as JUnit test cases and suite properties with each drive's (QUALIFIED only if every drive's
    is); a run that is not QUALIFIED fails. An xdist worker sends its drives' rows to the controller instead, which
    reports them all; None there, and where no drive was begun."""
    config = session.config
    if is_worker(config):
        send_rows(config, runs, selected_runs(session.items))
        return None
    if len(resolved_runs(config)) > 1:
        verdict = report_drives(session, resolved_runs(config), stopped)
    elif runs and runs[0].verdict is not None:
        verdict = runs[0].verdict
        report_health(config, runs[0].begun.data.get("health", {}).get("message"))
        report_verdict(session, verdict)
    else:
        return None
    if verdict.overall != "QUALIFIED" and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    return verdict


def _health_test(run: DriveRun) -> None:
    """The drive's health check (taken when the run closed) in the record's tests where it argues for the verdict:
    a failure, a marginal finding, or nothing read where the drive file limits a health measurement. A passed or
    merely unreadable check adds no test, so the counts do not depend on the host."""
    record = run.begun
    check = record.data.get("health", {})
    if "outcome" not in check or HEALTH_NODEID in record.data["tests"]:
        return
    outcome = Outcome(check["outcome"])
    limited = any(limit.measurement in HEALTH_MEASUREMENTS for limit in run.settings.thresholds.limits)
    if outcome is not Outcome.PASS and (outcome is not Outcome.SKIPPED or limited):
        record.record_test(HEALTH_NODEID, HEALTH_SUBJECT, outcome, check["message"], "call")
