"""The session's qualification: its record begun at collection, the run as a fixture, progress, the summary."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable, Generator, Iterator
from pathlib import Path

import pytest

from ckptqual.plan.strategies import layouts
from ckptqual.pytest_plugin.options import settings
from ckptqual.report.progress import Progress
from ckptqual.report.record import RunRecord
from ckptqual.report.terminal import report_sections
from ckptqual.runs.events import Broadcast
from ckptqual.runs.fill import StopRounds, run_rounds
from ckptqual.runs.qualification import Qualification

MARK = "qualification"
RECORD = pytest.StashKey[RunRecord]()
QUALIFICATION = pytest.StashKey[Qualification]()
SUBJECT = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARK}: a check of the ckptqual qualification suite")
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


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "fill_pass" in metafunc.fixturenames:
        try:
            passes = settings(metafunc.config).passes
        except pytest.UsageError:
            passes = 1  # the usage error is raised once collection is done
        metafunc.parametrize("fill_pass", range(1, passes + 1), ids=str)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Names what each qualification test judges and begins the run's record, once the selection is known."""
    selected = [item for item in items if item.get_closest_marker(MARK)]
    if not selected:
        return
    run = settings(config)
    for item in selected:
        item.stash[SUBJECT] = subject_of(item)
    config.stash[RECORD] = RunRecord.begin(run)


def subject_of(item: pytest.Item) -> str:
    """What a qualification test judges, in words: "pass 2", "sweep cpu-only-1M-16", "restore"."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    if "fill_pass" in params:
        return f"pass {params['fill_pass']}"
    if "sweep_cell" in params:
        return f"sweep {params['sweep_cell'].id}"
    return getattr(item, "originalname", item.name).removeprefix("test_").replace("_", " ")


@pytest.fixture(scope="session")
def qualification(request: pytest.FixtureRequest) -> Iterator[Qualification]:
    """The session's qualification run; closed (ranks stopped, target cleaned, record finished) at the end."""
    config = request.config
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        run = settings(config)
        qual = Qualification(run, Broadcast(config.stash[RECORD], Progress(run, say(config), redraw(config))))
        config.stash[QUALIFICATION] = qual
        try:
            yield qual
        finally:
            qual.close()
    finally:
        signal.signal(signal.SIGTERM, previous)


def _terminate(signum: int, frame: object) -> None:
    """SIGTERM stops the run as Ctrl-C does: ranks stopped, partial files removed, reports written."""
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def say(config: pytest.Config) -> Callable[[str], None]:
    """Prints a progress line now, even while pytest captures the test's output."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")

    def write(line: str) -> None:
        if reporter is None:
            return
        if capture is None:
            reporter.write_line(line)
            return
        with capture.global_and_fixture_disabled():
            reporter.ensure_newline()
            reporter.write_line(line)

    return write


def redraw(config: pytest.Config) -> Callable[[str], None] | None:
    """Redraws one line in place ("" clears it) where pytest's output is a terminal; None where it is not (a pipe,
    a CI log, a file, TERM=dumb): there the progress lines come alone, one per checkpoint."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or not reporter.isatty or os.environ.get("TERM") == "dumb":
        return None
    capture = config.pluginmanager.get_plugin("capturemanager")

    def draw(text: str) -> None:
        with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
            reporter.ensure_newline()
            reporter.write(f"\r{text[: _columns() - 1]}\x1b[K", flush=True)  # never wider than the terminal: no wrap

    return draw


def _columns() -> int:
    """The terminal's width now (asked of the terminal: $COLUMNS may be stale), 80 where it does not say."""
    try:
        return os.get_terminal_size(sys.stdout.fileno()).columns
    except (OSError, ValueError):
        return 80


@pytest.fixture(name="say")
def say_fixture(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Prints a line of progress now, even under pytest's output capture."""
    return say(request.config)


@pytest.fixture
def layout_strategy(qualification: Qualification, benchmark):
    """The Hypothesis strategy of this run's odd layouts: at most the run's ranks and its layout size. (The
    benchmark is there for pytest_plugin/benchmarks.py, which times the layouts test as one benchmark round.)"""
    run = qualification.settings
    return layouts(max_total_bytes=run.layout_max_total_bytes, max_ranks=len(run.plan.ranks), max_files=64)


@pytest.fixture
def rounds_runner(benchmark) -> Callable[..., None]:
    """Drives rounds (a pass's checkpoints, a restore's) as pytest-benchmark rounds, or plainly when benchmarking
    is off (pedantic would then run only one round)."""
    if benchmark.disabled:
        return run_rounds

    def run(fn: Callable[[], None], setup: Callable[[], None], rounds: int) -> None:
        try:
            benchmark.pedantic(fn, setup=setup, rounds=rounds, iterations=1, warmup_rounds=0)
        except StopRounds:
            benchmark.has_error = False  # ended early on purpose (--early-stop): keep the rounds that ran

    return run


def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict) -> None:
    qual = config.stash.get(QUALIFICATION, None)
    if qual is not None:
        machine_info["ckptqual"] = {"drive": qual.settings.thresholds.drive.name, **qual.identity.to_dict()}


@pytest.hookimpl(wrapper=True)
def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> Generator[None, None, None]:
    """The run's summary after the other plugins' (pytest-benchmark's table), even when one of them raised."""
    try:
        return (yield)
    finally:
        record = config.stash.get(RECORD, None)
        for title, lines in report_sections(record.data) if record is not None else []:
            terminalreporter.section(title)
            for line in lines:
                terminalreporter.write_line(line)
