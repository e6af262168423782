"""Each qualification test's outcome and the run's one verdict: every test concludes with one outcome word and
its reasons; the verdict, computed from those words, is a JUnit test case and suite property, a results field
and the last line of the output. An interrupted run reports the test it stopped in and those it never reached.
With several drives each drive has its verdict (and case), and the run's is QUALIFIED only if every drive's is."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Generator, Iterator
from pathlib import Path

import pytest
from _pytest.junitxml import xml_key
from _pytest.reports import TestReport

from ckptqual.faults import RunError
from ckptqual.host.topology import shared_parents
from ckptqual.limits.health import MEASURED as HEALTH_MEASUREMENTS
from ckptqual.limits.health import SUBJECT as HEALTH_SUBJECT
from ckptqual.limits.limits import Outcome
from ckptqual.limits.verdict import (
    Conclusion,
    Findings,
    Overall,
    RunVerdict,
    combined_verdict,
    outcome_of_error,
    overall_verdict,
    unjudged_limits,
    unmet_requirements,
)
from ckptqual.pytest_plugin.drives import INDEX, crashed_before, gathered_rows, is_worker, selected_runs, send_rows
from ckptqual.pytest_plugin.options import DRIVE, DriveRun, resolved_runs
from ckptqual.pytest_plugin.run import SUBJECT
from ckptqual.pytest_plugin.selection import part_runs
from ckptqual.report.drives import drive_row, drives_index, shared_host
from ckptqual.report.record import RunRecord
from ckptqual.runs.qualification import Qualification

VERDICT_NODEID = "ckptqual::verdict"
HEALTH_NODEID = "ckptqual::health"
_CONCLUSION = pytest.StashKey[Conclusion]()
_RETURNED = pytest.StashKey[bool]()
_VERDICT = pytest.StashKey[RunVerdict]()
_TRACKER = "ckptqual-session-tracker"


class MarginalWarning(UserWarning):
    """A measurement met its limit only inside the limit's marginal band."""


class SessionTracker:
    """Which test is running and what interrupted the session, for the report of an interrupted run."""

    def __init__(self) -> None:
        self.running: str | None = None
        self.interrupted_by: str | None = None

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> None:
        self.running = item.nodeid

    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo) -> None:
        message = str(excinfo.value)
        self.interrupted_by = message.removeprefix("signal ") if message.startswith("signal ") else "SIGINT (Ctrl-C)"


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(SessionTracker(), _TRACKER)


class TestVerdict:
    """One test's findings: judged measurements and the suite's own outcomes; `conclude` fails the test unless it
    passed, with every reason in one line, and records the outcome the run's verdict is built from."""

    __test__ = False  # not a test class, whatever pytest's name rules say

    def __init__(self, qualification: Qualification, item: pytest.Item, record_property: Callable) -> None:
        self.qualification, self.item, self.record_property = qualification, item, record_property
        self.findings = Findings()
        settings = qualification.settings
        for name, value in (
            ("drive", settings.thresholds.drive.name),
            ("workload", settings.plan.workload),
            ("scale", settings.scale),
            ("engine", settings.engine),
        ):
            record_property(name, value)
        if settings.label:
            record_property("drive_label", settings.label)

    def judge(self, measurements: list[tuple[str, float, str]], **context: object) -> None:
        """Judges (name, value, unit) measurements against the drive's limits and keeps them as findings."""
        for judgement in self.qualification.judge(measurements, context):
            name = judgement.measurement
            self.record_property(name, f"{judgement.value:.6g}")
            self.record_property(f"{name}.unit", judgement.unit)
            self.record_property(f"{name}.outcome", judgement.outcome)
            if judgement.host_bound:
                self.record_property(f"{name}.host_bound", judgement.host_bound)
            if judgement.verdict:
                self.record_property(f"{name}.limit", judgement.limit)
                self.record_property(f"{name}.judged", f"{judgement.verdict.measured:.6g} {judgement.verdict.unit}")
            self.findings.add_judgements([judgement])

    def add(self, outcome: Outcome, reason: str | None) -> None:
        """A finding of the suite's own (INVALID, NOT_STEADY, FAIL); None adds nothing."""
        self.findings.add(outcome, reason)

    def conclude(self) -> Conclusion:
        conclusion = self.findings.conclusion()
        self.item.stash[_CONCLUSION] = conclusion
        self.record_property("ckptqual.outcome", str(conclusion.outcome))
        message = conclusion.message(self.item.stash.get(SUBJECT, self.item.name))
        if conclusion.outcome is Outcome.MARGINAL:
            warnings.warn(MarginalWarning(message), stacklevel=2)
        if conclusion.failed:
            pytest.fail(message, pytrace=False)
        return conclusion


@pytest.fixture
def verdict(qualification: Qualification, request: pytest.FixtureRequest, record_property) -> Iterator[TestVerdict]:
    """The test's verdict; a qualification test must end with `verdict.conclude()` (checked at teardown)."""
    test_verdict = TestVerdict(qualification, request.node, record_property)
    yield test_verdict
    if _CONCLUSION not in request.node.stash and request.node.stash.get(_RETURNED, False):
        raise RuntimeError(f"{request.node.nodeid} returned without verdict.conclude(); its limits went unjudged")


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Generator[None, object, object]:
    """Notes a test body that returned (neither raised, skipped nor was interrupted): it must have concluded."""
    result = yield
    pyfuncitem.stash[_RETURNED] = True
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Records each qualification test's outcome word and one-line message in the run record."""
    report = yield
    drive = item.stash.get(DRIVE, None)
    if drive is None or SUBJECT not in item.stash:
        return report
    record = drive.begin() if crashed_before(item.config, drive.label) is None else None  # the dead worker's stands
    if report.when == "call" or not report.passed:
        outcome, message = _test_outcome(item, report, call)
        if record is not None:
            record.record_test(report.nodeid, item.stash[SUBJECT], outcome, message, report.when)
        concluded = report.when == "call" and _CONCLUSION in item.stash
        if concluded or (call.excinfo is not None and isinstance(call.excinfo.value, RunError)):
            report.longrepr = message  # a verdict or an expected fault: one line with what, where and why
    return report


def _test_outcome(item: pytest.Item, report: pytest.TestReport, call: pytest.CallInfo) -> tuple[Outcome, str]:
    """The outcome word and one-line message of a test phase, from its conclusion or from what it raised."""
    subject = item.stash[SUBJECT]
    conclusion = item.stash.get(_CONCLUSION, None)
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        return Outcome.SKIPPED, f"{subject} SKIPPED: {reason.removeprefix('Skipped: ')}"
    if conclusion is not None and report.when == "call":
        return conclusion.outcome, conclusion.message(subject)
    if report.passed:
        return Outcome.PASS, f"{subject} PASS"
    error = call.excinfo.value if call.excinfo is not None else None
    outcome = outcome_of_error(error) if error is not None else Outcome.ERROR
    text = str(error).splitlines()[0] if error is not None and str(error) else report.longreprtext.splitlines()[-1]
    phase = "" if report.when == "call" else f" (in {report.when})"
    return outcome, f"{subject} {outcome}{phase}: {text}"


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Ends each drive's run and gives its verdict, before the JUnit XML is written: an interrupted run closes its
    qualification now, the tests it did not finish are reported as errors, and the verdict is a test case, a suite
    property, a results field and the last line of the output. With several drives an xdist worker sends its drives'
    verdicts to the controller, which reports them all, and the run's."""
    config = session.config
    runs = [run for run in resolved_runs(config) if run.record is not None]
    interruption = _interruption(session, exitstatus)
    for run in runs:
        run.verdict = _drive_verdict(session, run, interruption)
    if is_worker(config):
        send_rows(config, runs, selected_runs(session.items))
        return
    if len(resolved_runs(config)) > 1:
        run_verdict = _report_drives(session, resolved_runs(config), interruption)
    elif runs:
        run_verdict = runs[0].verdict
        _report_health(session, runs[0].record.data.get("health", {}).get("message"))
        _report_verdict(session, run_verdict)
    else:
        return
    config.stash[_VERDICT] = run_verdict
    if run_verdict.overall != "QUALIFIED" and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _drive_verdict(session: pytest.Session, run: DriveRun, interruption: str | None) -> RunVerdict:
    """One drive's verdict, from its tests, the limits none judged, the required parts that did not run and an
    interruption; kept in its record."""
    record = run.record
    if interruption and run.qualification is not None:
        try:
            run.qualification.close()
        except RunError as failure:  # e.g. a message refused while the interrupted run stopped: recorded, no traceback
            record.error(str(failure))
    if interruption:
        _report_unfinished(session, run, interruption)
    _health_test(run)
    thresholds, tests = run.settings.thresholds, record.data["tests"]
    parts = part_runs(session.config, run.label, tests, thresholds.requires)
    run_verdict = overall_verdict(
        tests,
        unjudged_limits(thresholds.limits, record.data["measurements"]),
        interruption,
        unmet_requirements(thresholds.requires, parts, thresholds.requires_origin),
        record.data.get("cleanup", {}).get("planted", ()),
    )
    if record.save_error:
        run_verdict = RunVerdict(run_verdict.overall, (*run_verdict.reasons, record.save_error))
    record.data["verdict"] = run_verdict.to_dict()
    record.save()
    return run_verdict


def _report_drives(session: pytest.Session, runs: list[DriveRun], interruption: str | None) -> RunVerdict:
    """Every drive's verdict as a test case of its own, what they share on the host, the index of the run at
    --results, and the run's verdict: QUALIFIED only if every drive's is."""
    config = session.config
    local = [run for run in runs if run.record is not None]
    if local:
        rows = [drive_row(run.label, run.record.data) for run in local]
    else:
        rows = gathered_rows(config, runs, interruption)
    verdicts = {row["label"]: RunVerdict(Overall(row["verdict"]["overall"]), tuple(row["verdict"]["reasons"]))
                for row in rows}  # fmt: skip
    for row in rows:
        _report_health(session, row["health"], row["label"])
        _report_verdict(session, verdicts[row["label"]], row["label"])
    run_verdict = combined_verdict(verdicts)
    pcie = shared_parents({row["label"]: row["devices"] for row in rows})
    shared = shared_host(rows, len(os.sched_getaffinity(0)), pcie)
    index = drives_index(rows, shared, run_verdict.to_dict())
    config.stash[INDEX] = index
    results = config.getoption("results")
    if results:
        record = RunRecord(Path(results))  # its atomic save; of the rest, only the environment
        record.data = {**index, "environment": record.data["environment"]}
        record.save()
    _report_verdict(session, run_verdict)
    return run_verdict


def _interruption(session: pytest.Session, exitstatus: int) -> str | None:
    if exitstatus != pytest.ExitCode.INTERRUPTED:
        return None
    tracker: SessionTracker = session.config.pluginmanager.get_plugin(_TRACKER)
    by = tracker.interrupted_by or "an interrupt"
    return f"the run was interrupted by {by}" + (f" during {tracker.running}" if tracker.running else "")


def _report_unfinished(session: pytest.Session, run: DriveRun, interruption: str) -> None:
    """An error test case for the drive's test that was running and for each that did not run, as the JUnit XML
    shows."""
    running = session.config.pluginmanager.get_plugin(_TRACKER).running
    record = run.record
    for item in (item for item in session.items if item.stash.get(DRIVE, None) is run):
        done = record.data["tests"].get(item.nodeid, {}).get("when") == "call"
        if item.nodeid in record.data["tests"] and (item.nodeid != running or done):
            continue
        subject = item.stash.get(SUBJECT, item.name)
        if item.nodeid == running:
            outcome, message = Outcome.INTERRUPTED, f"{subject} INTERRUPTED: {interruption}"
        else:
            outcome, message = Outcome.NOT_RUN, f"{subject} NOT_RUN: not run: {interruption}"
        record.record_test(item.nodeid, subject, outcome, message, "setup")
        report = TestReport(item.nodeid, item.location, {}, "failed", message, "setup", [], 0.0)
        session.config.hook.pytest_runtest_logreport(report=report)


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


def _report_health(session: pytest.Session, message: str | None, label: str | None = None) -> None:
    """The drive's health check (its line) as a JUnit suite property: `ckptqual.health`, `ckptqual.health[LABEL]`."""
    xml = session.config.stash.get(xml_key, None)
    if xml is not None and message:
        xml.add_global_property("ckptqual.health" + (f"[{label}]" if label else ""), message)


def _report_verdict(session: pytest.Session, run_verdict: RunVerdict, label: str | None = None) -> None:
    """The verdict (of the drive `label`, else of the run) as a test case of its own (GitLab and Jenkins read test
    cases, not properties) and as a suite property of the JUnit XML."""
    suffix = f"[{label}]" if label else ""
    xml = session.config.stash.get(xml_key, None)
    if xml is not None:
        xml.add_global_property(f"ckptqual.limits.verdict{suffix}", str(run_verdict.overall))
        xml.add_global_property(f"ckptqual.limits.verdict{suffix}.reasons", " | ".join(run_verdict.reasons))
    qualified = run_verdict.overall == "QUALIFIED"
    report = TestReport(
        VERDICT_NODEID + suffix,
        ("ckptqual", None, f"ckptqual verdict{suffix}"),
        {},
        "passed" if qualified else "failed",
        None if qualified else run_verdict.line(),
        "call",
        [],
        0.0,
        user_properties=[(f"ckptqual.limits.verdict{suffix}", str(run_verdict.overall))],
    )
    session.config.hook.pytest_runtest_logreport(report=report)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """The verdict is the last line of the output, after pytest's own counts."""
    run_verdict = config.stash.get(_VERDICT, None)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if run_verdict is not None and reporter is not None:
        reporter.write_line(run_verdict.line(), bold=True, red=run_verdict.overall != "QUALIFIED")
