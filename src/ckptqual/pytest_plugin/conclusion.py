"""Each qualification test's conclusion: the `verdict` fixture judges its measurements and concludes with one outcome
word and its reasons; each test phase's outcome and one-line message go into the run record (what the run's verdict
is built from) and into the JUnit XML, with every judged figure."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Generator, Iterator
from typing import TYPE_CHECKING

import pytest

from ckptqual.faults import RunError
from ckptqual.limits.limits import Outcome
from ckptqual.limits.verdict import Conclusion, Findings, outcome_of_error
from ckptqual.printable import printable
from ckptqual.pytest_plugin.drives import crashed_before
from ckptqual.pytest_plugin.junit import LINE_PROPERTY
from ckptqual.pytest_plugin.options import DRIVE
from ckptqual.pytest_plugin.run import SUBJECT

if TYPE_CHECKING:
    from ckptqual.runs.qualification import Qualification

_CONCLUSION = pytest.StashKey[Conclusion]()
_RETURNED = pytest.StashKey[bool]()


class MarginalWarning(UserWarning):
    """A measurement met its limit only inside the limit's marginal band."""


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

    def conclude(self, only_measures: bool = False) -> Conclusion:
        """The test's conclusion (Findings.conclusion); a failing one fails the test in one line."""
        conclusion = self.findings.conclusion(only_measures)
        self.item.stash[_CONCLUSION] = conclusion
        self.record_property("ckptqual.outcome", str(conclusion.outcome))
        message = printable(conclusion.message(self.item.stash.get(SUBJECT, self.item.name)))
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
    """Records each qualification test's outcome word and one-line message in the run record; its JUnit case gets
    one line with every judged figure (value, limit, unit), which its failure message carries too."""
    report = yield
    drive = item.stash.get(DRIVE, None)
    if drive is None or SUBJECT not in item.stash:
        return report
    record = drive.begin() if crashed_before(item.config, drive.label) is None else None  # the dead worker's stands
    if report.when == "call" or not report.passed:
        outcome, message = _test_outcome(item, report, call)
        if record is not None:
            record.record_test(report.nodeid, item.stash[SUBJECT], outcome, message, report.when)
        conclusion = item.stash.get(_CONCLUSION, None) if report.when == "call" else None
        line = printable(conclusion.figures_line(item.stash[SUBJECT]) if conclusion is not None else message)
        item.user_properties.append((LINE_PROPERTY, line))  # the JUnit XML takes the teardown report's properties
        if report.when == "teardown":
            report.user_properties.append((LINE_PROPERTY, line))
        if conclusion is not None:  # a verdict: one line with what, where and why, and every judged figure
            figures = f" || figures: {'; '.join(conclusion.figures)}" if conclusion.figures else ""
            report.longrepr = printable(message + figures)
        elif call.excinfo is not None and isinstance(call.excinfo.value, RunError):  # an expected fault: one line
            report.longrepr = printable(message)
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
