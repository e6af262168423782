"""pytest wiring only: options, settings, the session's qualification, reports and the terminal summary."""

from __future__ import annotations

import shutil
import signal
import tempfile
import warnings
from collections.abc import Callable, Generator, Iterator
from pathlib import Path

import pytest

from ckptqual.fill import RESERVE_BYTES, checkpoint_footprint_bytes, run_rounds
from ckptqual.qualification import Qualification
from ckptqual.results import Judgement, failures
from ckptqual.settings import Options, RunSettings, SettingsError, resolve_settings
from ckptqual.strategies import layouts
from ckptqual.summary import summary_lines
from ckptqual.thresholds import Outcome, parse_size

MARK = "qualification"
_SETTINGS = pytest.StashKey[RunSettings | SettingsError]()
_QUALIFICATION = pytest.StashKey[Qualification]()


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


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARK}: a check of the ckptqual qualification suite")


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
    if any(item.get_closest_marker(MARK) for item in items):
        run = settings(config)
        if any("layout_strategy" in getattr(item, "fixturenames", ()) for item in items):
            _check_layout_space(run)
        if config.pluginmanager.hasplugin("xdist") and config.getoption("numprocesses", None):
            raise pytest.UsageError("the qualification runs its own rank processes; run it without -n")


def _check_layout_space(run: RunSettings) -> None:
    """An odd layout and its regular twin are written beside the fill's kept checkpoints; they must fit too."""
    where = run.target if run.target is not None else Path(tempfile.gettempdir())
    free = shutil.disk_usage(where).free
    layouts_bytes = 2 * run.layout_max_total_bytes
    per_checkpoint = checkpoint_footprint_bytes(run.plan)
    needed = run.checkpoints_per_pass * per_checkpoint + layouts_bytes + RESERVE_BYTES
    if needed > free:
        fitting = max(0, free - layouts_bytes - RESERVE_BYTES) // per_checkpoint
        fix = f"--checkpoints-per-pass {fitting}" if fitting else "a larger target"
        raise pytest.UsageError(
            f"--target {where}: the fill and the odd layouts need {needed / 1e9:,.3f} GB ({run.checkpoints_per_pass} "
            f"checkpoints of {per_checkpoint / 1e9:,.3f} GB + {layouts_bytes / 1e9:,.3f} GB for the odd layouts) but "
            f"the target has {free / 1e9:,.3f} GB free; use {fix}, or a drive file with a smaller [layouts] "
            f"max_total_bytes"
        )


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
        qual = Qualification(settings(config), say=_sayer(config))
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


@pytest.fixture
def check(qualification: Qualification, record_property: Callable[[str, object], None]):
    """Judges measurements against the drive's limits, reports them, and fails the test on a FAIL."""
    settings = qualification.settings
    for name, value in (
        ("drive", settings.thresholds.drive.name),
        ("workload", settings.plan.workload),
        ("scale", settings.scale),
        ("engine", settings.engine),
    ):
        record_property(name, value)

    def check_measurements(measurements: list[tuple[str, float, str]], **context: object) -> list[Judgement]:
        judgements = qualification.judge(measurements, context)
        for judgement in judgements:
            _record(record_property, judgement)
            if judgement.verdict and judgement.verdict.outcome == Outcome.MARGINAL:
                warnings.warn(MarginalWarning(judgement.verdict.message), stacklevel=2)
        failed = failures(judgements)
        if failed:
            pytest.fail(" | ".join(j.verdict.message for j in failed), pytrace=False)
        return judgements

    return check_measurements


def _record(record_property: Callable[[str, object], None], judgement: Judgement) -> None:
    name = judgement.measurement
    record_property(name, f"{judgement.value:.6g}")
    record_property(f"{name}.unit", judgement.unit)
    record_property(f"{name}.outcome", judgement.outcome)
    if judgement.verdict:
        record_property(f"{name}.limit", judgement.limit)
        record_property(f"{name}.judged", f"{judgement.verdict.measured:.6g} {judgement.verdict.unit}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Records each qualification test's outcome (and why, when it did not pass) in the results JSON."""
    report = yield
    qual = item.config.stash.get(_QUALIFICATION, None)
    if qual is not None and (report.when == "call" or not report.passed):
        message = str(report.longrepr)[-2000:] if report.longrepr else ""
        qual.record.data["tests"][report.nodeid] = {"outcome": report.outcome, "when": report.when, "message": message}
        qual.record.save()
    return report


def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict) -> None:
    qual = config.stash.get(_QUALIFICATION, None)
    if qual is not None:
        machine_info["ckptqual"] = {"drive": qual.settings.thresholds.drive.name, **qual.identity.to_dict()}


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    qual = config.stash.get(_QUALIFICATION, None)
    if qual is None:
        return
    terminalreporter.section("ckptqual summary")
    for line in summary_lines(qual):
        terminalreporter.write_line(line)
