"""The run's one verdict: each drive's, computed from its tests' outcome words, the limits none judged, the required
parts that did not run, an interruption and the refusal of a run that never started, with its basis; kept in the
record, reported in the JUnit XML and printed as the last line of the output. With several drives the run's verdict
is QUALIFIED only if every drive's is."""

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
from ckptqual.pytest_plugin.drives import is_worker, selected_runs, send_rows
from ckptqual.pytest_plugin.interruption import interruption, report_unfinished
from ckptqual.pytest_plugin.junit import report_health, report_verdict
from ckptqual.pytest_plugin.options import REFUSED, DriveRun, resolved_runs
from ckptqual.pytest_plugin.selection import part_runs
from ckptqual.report.verdict import record_basis

HEALTH_NODEID = "ckptqual::health"
_VERDICT = pytest.StashKey[RunVerdict]()


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Ends each drive's run and gives its verdict, before the JUnit XML is written: an interrupted run closes its
    qualification now, the tests it did not finish are reported as errors, and the verdict is a test case, a suite
    property, a results field and the last line of the output. With several drives an xdist worker sends its drives'
    verdicts to the controller, which reports them all, and the run's."""
    config = session.config
    runs = [run for run in resolved_runs(config) if run.record is not None]
    stopped = interruption(session, exitstatus)
    for run in runs:
        run.verdict = _drive_verdict(session, run, stopped)
    if is_worker(config):
        send_rows(config, runs, selected_runs(session.items))
        return
    if len(resolved_runs(config)) > 1:
        run_verdict = report_drives(session, resolved_runs(config), stopped)
    elif runs:
        run_verdict = runs[0].verdict
        report_health(config, runs[0].record.data.get("health", {}).get("message"))
        report_verdict(session, run_verdict)
    else:
        return
    config.stash[_VERDICT] = run_verdict
    if run_verdict.overall != "QUALIFIED" and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _drive_verdict(session: pytest.Session, run: DriveRun, stopped: str | None) -> RunVerdict:
    """One drive's verdict, from its tests, the limits none judged, the required parts that did not run and an
    interruption and the refusal of a run that never started; with its basis, kept in its record."""
    record = run.record
    if stopped and run.qualification is not None:
        try:
            run.qualification.close()
        except RunError as failure:  # e.g. a message refused while the interrupted run stopped: recorded, no traceback
            record.error(str(failure))
    if stopped:
        report_unfinished(session, run, stopped)
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
        session.config.stash.get(REFUSED, None),
    )
    reasons = (*run_verdict.reasons, record.save_error) if record.save_error else run_verdict.reasons
    run_verdict = RunVerdict(run_verdict.overall, reasons, record_basis(data))
    data["verdict"] = run_verdict.to_dict()
    record.save()
    return run_verdict


def _health_test(run: DriveRun) -> None:
    """The drive's health check (taken when the run closed) in the record's tests where it argues for the verdict:
    a failure, a marginal finding, or nothing read where the drive file limits a health measurement. A passed or
    merely unreadable check adds no test, so the counts do not depend on the host."""
    record = run.record
    check = record.data.get("health", {})
    if "outcome" not in check or HEALTH_NODEID in record.data["tests"]:
        return
    outcome = Outcome(check["outcome"])
    limited = any(limit.measurement in HEALTH_MEASUREMENTS for limit in run.settings.thresholds.limits)
    if outcome is not Outcome.PASS and (outcome is not Outcome.SKIPPED or limited):
        record.record_test(HEALTH_NODEID, HEALTH_SUBJECT, outcome, check["message"], "call")


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """The verdict is the last line of the output, after pytest's own counts (a refused run's usage error, which
    pytest prints after this, repeats its fix below it)."""
    run_verdict = config.stash.get(_VERDICT, None)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if run_verdict is not None and reporter is not None:
        reporter.write_line(run_verdict.line(), bold=True, red=run_verdict.overall != "QUALIFIED")
