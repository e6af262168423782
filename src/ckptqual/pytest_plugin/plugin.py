"""pytest wiring only: options, settings, the session's qualification, test verdicts, reports and the summary."""

from __future__ import annotations

import shutil
import signal
import tempfile
import warnings
from collections.abc import Callable, Generator, Iterator
from pathlib import Path

import pytest
from _pytest.junitxml import xml_key
from _pytest.reports import TestReport

from ckptqual.config.run_settings import Options, RunSettings, SettingsError, resolve_settings, space_message
from ckptqual.faults import RunError
from ckptqual.limits.thresholds import Outcome, parse_size
from ckptqual.limits.verdict import Conclusion, Findings, RunVerdict, outcome_of_error, overall_verdict, unjudged_limits
from ckptqual.plan.strategies import layouts
from ckptqual.report.record import RunRecord
from ckptqual.report.summary import summary_lines
from ckptqual.runs.fill import RESERVE_BYTES, checkpoint_footprint_bytes, run_rounds
from ckptqual.runs.qualification import Qualification, new_record

MARK = "qualification"
VERDICT_NODEID = "ckptqual::verdict"
_SETTINGS = pytest.StashKey[RunSettings | SettingsError]()
_RECORD = pytest.StashKey[RunRecord]()
_QUALIFICATION = pytest.StashKey[Qualification]()
_CONCLUSION = pytest.StashKey[Conclusion]()
_RETURNED = pytest.StashKey[bool]()
_SUBJECT = pytest.StashKey[str]()
_VERDICT = pytest.StashKey[RunVerdict]()
_TRACKER = "ckptqual-session-tracker"


class MarginalWarning(UserWarning):
    """A measurement met its limit only inside the limit's marginal band."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ckptqual", "checkpoint storage qualification (ckptqual)")
    group.addoption("--drive", default="local", help="threshold file: a name in thresholds/ or a path (default: local)")
    group.addoption(
        "--target",
        type=Path,
        help="directory on the drive under test, empty or ckptqual's own "
        "(default: a fresh directory under the system temp dir)",
    )
    group.addoption("--workload", help="workload: a name in fixtures/workloads/ or a path (default: the drive file's)")
    group.addoption("--scale", type=float, help="shrink every tensor by this factor, 0 < S <= 1 (default: drive file)")
    group.addoption("--engine", help="stream (bounded memory) or torch-save (default: drive file, else stream)")
    group.addoption("--checkpoints-per-pass", type=int, help="checkpoints per fill pass (default: drive file)")
    group.addoption("--fill-fraction", type=float, help="fill this fraction of the target's capacity per pass")
    group.addoption("--passes", type=int, help="number of fill passes (default: drive file, else 3)")
    group.addoption("--results", type=Path, help="write a JSON record of the run to this path")
    group.addoption("--keep", action="store_true", help="keep the run directory and its checkpoints")
    group.addoption(
        "--rank-timeout",
        type=float,
        default=600.0,
        help="seconds a rank may take for one checkpoint before the run fails it (default: 600)",
    )
    group.addoption(
        "--memory-budget",
        type=_size_option,
        help="memory the ranks may hold together under torch-save, e.g. 32G (default: half of free)",
    )
    group.addoption("--seed", type=int, help="payload seed (default: random, recorded in the results)")
    group.addoption(
        "--restore-checkpoints",
        type=int,
        default=1,
        help="how many of the newest checkpoints test_restore reads back (default: 1)",
    )
    group.addoption("--layout-examples", type=int, help="odd shard layouts to try (default: drive file, else 5)")
    group.addoption("--layout-seed", type=int, help="seed of the odd layouts (default: drive file, else 0)")
    group.addoption("--layout-plan", type=Path, help="replay one layout from a plan file (printed on failure)")


def _size_option(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as error:
        raise pytest.UsageError(f"--memory-budget: {error}") from error


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
    config.addinivalue_line("markers", f"{MARK}: a check of the ckptqual qualification suite")
    config.pluginmanager.register(SessionTracker(), _TRACKER)
    if config.getoption("numprocesses", None) and _names_the_qualification(config):
        raise pytest.UsageError(
            "the qualification runs its own rank processes on one target; run tests_qual without -n "
            "(xdist workers would run its tests at once and measure each other)"
        )


def _names_the_qualification(config: pytest.Config) -> bool:
    """Whether the command line selects the qualification suite (tests_qual, or the directory above it)."""
    for arg in config.args:
        path = Path(arg.split("::")[0]).resolve()
        if "tests_qual" in path.parts or (path.is_dir() and (path / "tests_qual").is_dir()):
            return True
    return False


def settings(config: pytest.Config) -> RunSettings:
    """The run's settings, resolved once; a bad option or file is a usage error."""
    if _SETTINGS not in config.stash:
        try:
            config.stash[_SETTINGS] = resolve_settings(_options(config))
        except SettingsError as error:
            config.stash[_SETTINGS] = error
    resolved = config.stash[_SETTINGS]
    if isinstance(resolved, SettingsError):
        raise pytest.UsageError(str(resolved))
    return resolved


def _options(config: pytest.Config) -> Options:
    get = config.getoption
    return Options(
        drive=get("drive"),
        target=get("target"),
        workload=get("workload"),
        scale=get("scale"),
        engine=get("engine"),
        checkpoints_per_pass=get("checkpoints_per_pass"),
        fill_fraction=get("fill_fraction"),
        passes=get("passes"),
        results=get("results"),
        keep=get("keep"),
        rank_timeout_s=get("rank_timeout"),
        memory_budget_bytes=get("memory_budget"),
        seed=get("seed"),
        restore_checkpoints=get("restore_checkpoints"),
        layout_examples=get("layout_examples"),
        layout_seed=get("layout_seed"),
        layout_plan=get("layout_plan"),
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "fill_pass" in metafunc.fixturenames:
        try:
            passes = settings(metafunc.config).passes
        except pytest.UsageError:
            passes = 1  # the usage error is raised once collection is done
        metafunc.parametrize("fill_pass", range(1, passes + 1), ids=str)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    qualification_items = [item for item in items if item.get_closest_marker(MARK)]
    if not qualification_items:
        return
    run = settings(config)
    if any("layout_strategy" in getattr(item, "fixturenames", ()) for item in items):
        _check_layout_space(run)
    for item in qualification_items:
        item.stash[_SUBJECT] = subject_of(item)
    config.stash[_RECORD] = new_record(run)


def subject_of(item: pytest.Item) -> str:
    """What a qualification test judges, in words: "pass 2", "sweep cpu-only-1M-16", "restore"."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    if "fill_pass" in params:
        return f"pass {params['fill_pass']}"
    if "sweep_cell" in params:
        return f"sweep {params['sweep_cell'].id}"
    return getattr(item, "originalname", item.name).removeprefix("test_").replace("_", " ")


def _check_layout_space(run: RunSettings) -> None:
    """An odd layout and its regular twin are written beside the fill's kept checkpoints; they must fit too."""
    where = run.target if run.target is not None else Path(tempfile.gettempdir())
    free = shutil.disk_usage(where).free
    layout = checkpoint_footprint_bytes(run.layout_plan) if run.layout_plan else run.layout_max_total_bytes
    layouts_bytes = 2 * layout
    per_checkpoint = checkpoint_footprint_bytes(run.plan)
    needed = run.checkpoints_per_pass * per_checkpoint + layouts_bytes + RESERVE_BYTES
    if needed > free:
        fitting = max(0, free - layouts_bytes - RESERVE_BYTES) // per_checkpoint
        fix = f"--checkpoints-per-pass {fitting}" if fitting else "a larger target"
        problem = (
            f"the fill and the odd layouts need {needed / 1e9:,.3f} GB ({run.checkpoints_per_pass} "
            f"checkpoints of {per_checkpoint / 1e9:,.3f} GB + {layouts_bytes / 1e9:,.3f} GB for the odd layouts) but "
            f"the target has {free / 1e9:,.3f} GB free; use {fix}, or a drive file with a smaller [layouts] "
            f"max_total_bytes"
        )
        raise pytest.UsageError(space_message(where, problem))


@pytest.fixture
def layout_strategy(qualification: Qualification):
    """The Hypothesis strategy of this run's odd layouts: at most the run's ranks and the drive file's size."""
    run = qualification.settings
    return layouts(max_total_bytes=run.layout_max_total_bytes, max_ranks=len(run.plan.ranks), max_files=64)


@pytest.fixture(scope="session")
def qualification(request: pytest.FixtureRequest) -> Iterator[Qualification]:
    """The session's qualification run; closed (ranks stopped, results written, target cleaned) at the end."""
    config = request.config
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        qual = Qualification(settings(config), config.stash[_RECORD], say=_sayer(config))
        config.stash[_QUALIFICATION] = qual
        try:
            yield qual
        finally:
            qual.close()
    finally:
        signal.signal(signal.SIGTERM, previous)


def _terminate(signum: int, frame: object) -> None:
    """SIGTERM stops the run as Ctrl-C does: ranks stopped, partial files removed, reports written."""
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def _sayer(config: pytest.Config) -> Callable[[str], None]:
    """Prints a progress line now, even while pytest captures the test's output."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")

    def say(line: str) -> None:
        if reporter is None:
            return
        if capture is None:
            reporter.write_line(line)
            return
        with capture.global_and_fixture_disabled():
            reporter.ensure_newline()
            reporter.write_line(line)

    return say


@pytest.fixture
def rounds_runner(benchmark) -> Callable[..., None]:
    """Drives rounds (a pass's checkpoints, a restore's) as pytest-benchmark rounds, or plainly when benchmarking
    is off (pedantic would then run only one round)."""
    if benchmark.disabled:
        return run_rounds

    def run(fn: Callable[[], None], setup: Callable[[], None], rounds: int) -> None:
        benchmark.pedantic(fn, setup=setup, rounds=rounds, iterations=1, warmup_rounds=0)

    return run


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

    def judge(self, measurements: list[tuple[str, float, str]], **context: object) -> None:
        """Judges (name, value, unit) measurements against the drive's limits and keeps them as findings."""
        for judgement in self.qualification.judge(measurements, context):
            name = judgement.measurement
            self.record_property(name, f"{judgement.value:.6g}")
            self.record_property(f"{name}.unit", judgement.unit)
            self.record_property(f"{name}.outcome", judgement.outcome)
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
        message = conclusion.message(self.item.stash.get(_SUBJECT, self.item.name))
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
    record = item.config.stash.get(_RECORD, None)
    if record is None or _SUBJECT not in item.stash:
        return report
    if report.when == "call" or not report.passed:
        outcome, message = _test_outcome(item, report, call)
        record.record_test(report.nodeid, item.stash[_SUBJECT], outcome, message, report.when)
        concluded = report.when == "call" and _CONCLUSION in item.stash
        if concluded or (call.excinfo is not None and isinstance(call.excinfo.value, RunError)):
            report.longrepr = message  # a verdict or an expected fault: one line with what, where and why
    return report


def _test_outcome(item: pytest.Item, report: pytest.TestReport, call: pytest.CallInfo) -> tuple[Outcome, str]:
    """The outcome word and one-line message of a test phase, from its conclusion or from what it raised."""
    subject = item.stash[_SUBJECT]
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
    """Ends the run and gives the verdict, before the JUnit XML is written: an interrupted run closes its
    qualification now, the tests it did not finish are reported as errors, and the verdict is a test case,
    a suite property, a results field and the last line of the output."""
    config = session.config
    record = config.stash.get(_RECORD, None)
    if record is None:
        return
    interruption = _interruption(session, exitstatus)
    qual = config.stash.get(_QUALIFICATION, None)
    if interruption and qual is not None:
        qual.close()
    if interruption:
        _report_unfinished(session, record, interruption)
    thresholds = settings(config).thresholds
    run_verdict = overall_verdict(
        record.data["tests"], unjudged_limits(thresholds.limits, record.data["measurements"]), interruption
    )
    if record.save_error:
        run_verdict = RunVerdict(run_verdict.overall, (*run_verdict.reasons, record.save_error))
    record.data["verdict"] = run_verdict.to_dict()
    record.save()
    config.stash[_VERDICT] = run_verdict
    _report_verdict(session, run_verdict)
    if run_verdict.overall != "QUALIFIED" and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _interruption(session: pytest.Session, exitstatus: int) -> str | None:
    if exitstatus != pytest.ExitCode.INTERRUPTED:
        return None
    tracker: SessionTracker = session.config.pluginmanager.get_plugin(_TRACKER)
    by = tracker.interrupted_by or "an interrupt"
    return f"the run was interrupted by {by}" + (f" during {tracker.running}" if tracker.running else "")


def _report_unfinished(session: pytest.Session, record: RunRecord, interruption: str) -> None:
    """An error test case for the test that was running and for each that did not run, as the JUnit XML shows."""
    running = session.config.pluginmanager.get_plugin(_TRACKER).running
    for item in session.items:
        done = record.data["tests"].get(item.nodeid, {}).get("when") == "call"
        if item.nodeid in record.data["tests"] and (item.nodeid != running or done):
            continue
        subject = item.stash.get(_SUBJECT, item.name)
        if item.nodeid == running:
            outcome, message = Outcome.INTERRUPTED, f"{subject} INTERRUPTED: {interruption}"
        else:
            outcome, message = Outcome.NOT_RUN, f"{subject} NOT_RUN: not run: {interruption}"
        record.record_test(item.nodeid, subject, outcome, message, "setup")
        report = TestReport(item.nodeid, item.location, {}, "failed", message, "setup", [], 0.0)
        session.config.hook.pytest_runtest_logreport(report=report)


def _report_verdict(session: pytest.Session, run_verdict: RunVerdict) -> None:
    """The verdict as a test case of its own (GitLab and Jenkins read test cases, not properties) and as a
    suite property of the JUnit XML."""
    xml = session.config.stash.get(xml_key, None)
    if xml is not None:
        xml.add_global_property("ckptqual.limits.verdict", str(run_verdict.overall))
        xml.add_global_property("ckptqual.limits.verdict.reasons", " | ".join(run_verdict.reasons))
    qualified = run_verdict.overall == "QUALIFIED"
    report = TestReport(
        VERDICT_NODEID,
        ("ckptqual", None, "ckptqual verdict"),
        {},
        "passed" if qualified else "failed",
        None if qualified else run_verdict.line(),
        "call",
        [],
        0.0,
        user_properties=[("ckptqual.limits.verdict", str(run_verdict.overall))],
    )
    session.config.hook.pytest_runtest_logreport(report=report)


def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict) -> None:
    qual = config.stash.get(_QUALIFICATION, None)
    if qual is not None:
        machine_info["ckptqual"] = {"drive": qual.settings.thresholds.drive.name, **qual.identity.to_dict()}


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    record = config.stash.get(_RECORD, None)
    if record is None:
        return
    terminalreporter.section("ckptqual summary")
    for line in summary_lines(record.data):
        terminalreporter.write_line(line)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """The verdict is the last line of the output, after pytest's own counts."""
    run_verdict = config.stash.get(_VERDICT, None)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if run_verdict is not None and reporter is not None:
        reporter.write_line(run_verdict.line(), bold=True, red=run_verdict.overall != "QUALIFIED")
