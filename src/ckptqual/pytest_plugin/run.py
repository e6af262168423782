"""The session's qualification, one per drive: its record begun at collection, the run as a fixture, progress, the
summary."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

from ckptqual.config.space import LAYOUT_MAX_FILES
from ckptqual.faults import RunError
from ckptqual.printable import printable
from ckptqual.pytest_plugin.clock import figure_clock
from ckptqual.pytest_plugin.drives import (
    DRIVE_ARG,
    crashed_before,
    drive_run,
    group_by_drive,
    is_worker,
    names_the_qualification,
    parametrize_by_drive,
    selected_runs,
)
from ckptqual.pytest_plugin.junit import refused_junit
from ckptqual.pytest_plugin.options import DRIVE, drive_runs, resolved_runs

if TYPE_CHECKING:  # the run's own modules (torch, Hypothesis) load when a qualification test runs, not with the plugin
    from ckptqual.runs.qualification import Qualification

MARK = "qualification"
SUBJECT = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARK}: a check of the ckptqual qualification suite")
    if not names_the_qualification(config):
        return
    try:  # before pytest writes its JUnit XML and pytest-benchmark makes its storage (its configure is trylast)
        drive_runs(config)
    except pytest.UsageError as refusal:
        refused_junit(config, str(refusal))  # the XML pytest will not write: the refusal as its one case
        raise
    if config.getoption("numprocesses", None) and len(drive_runs(config)) < 2:
        raise pytest.UsageError(
            "the qualification runs its own rank processes on one target; run tests_qual without -n "
            "(xdist workers would run its tests at once and measure each other), or give --target several times "
            "to qualify several drives at once, one worker per drive"
        )


@pytest.hookimpl(tryfirst=True)  # the drive opens a test's id: test_fill_pass[nvme1-2]
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "fill_pass" in metafunc.fixturenames:
        parametrize_by_drive(metafunc, "fill_pass", lambda run: list(range(1, run.passes + 1)), str, fallback=[1])
    elif DRIVE_ARG in metafunc.fixturenames and "sweep_cell" not in metafunc.fixturenames:  # sweep.py does those
        parametrize_by_drive(metafunc, None)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Names what each qualification test judges and which drive it qualifies, drive after drive; the record of a
    run over one drive is begun now, once the selection is known."""
    selected = [item for item in items if item.get_closest_marker(MARK)]
    if not selected:
        return
    runs = drive_runs(config)
    group_by_drive(items, selected, runs)
    for item in selected:
        item.stash[SUBJECT] = subject_of(item)
    if len(runs) == 1:  # --collect-only gives the verdict of what was selected, and writes no results file
        runs[0].begin(write=not config.option.collectonly)


def pytest_collection_finish(session: pytest.Session) -> None:
    """With several drives and no -n, the record of each drive with a selected test is begun now (-k may have left
    out whole drives); an xdist worker begins a drive's record when it starts qualifying it."""
    config = session.config
    if len(resolved_runs(config)) > 1 and not is_worker(config):
        for run in selected_runs(session.items):
            run.begin(write=not config.option.collectonly)


def subject_of(item: pytest.Item) -> str:
    """What a qualification test judges, in words: "pass 2", "sweep cpu-only-1M-16", "restore"."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    if "fill_pass" in params:
        return f"pass {params['fill_pass']}"
    if "sweep_cell" in params:  # NOTSET, with no id, where settings that did not resolve gave no cells
        return f"sweep {getattr(params['sweep_cell'], 'id', 'cell')}"
    return getattr(item, "originalname", item.name).removeprefix("test_").replace("_", " ")


@pytest.fixture(scope="session")
def qualification(request: pytest.FixtureRequest, ckptqual_drive: str | None) -> Iterator[Qualification]:
    """The drive's qualification run; closed (ranks stopped, target cleaned, record finished) at the end, or before
    the next drive's starts. A drive whose target was refused or is too small fails each of its tests with why."""
    config = request.config
    drive = drive_run(config, ckptqual_drive)
    if (crash := crashed_before(config, drive.label)) is not None:
        raise RunError(f"not run: {crash}", "not-run")
    record = drive.begin()
    if drive.problem:
        raise RunError(drive.problem, "not-run")
    from ckptqual.report.progress import Progress
    from ckptqual.runs.events import Broadcast
    from ckptqual.runs.qualification import Qualification

    interrupts = Interrupts()
    previous = {signum: signal.signal(signum, interrupts) for signum in Interrupts.SIGNALS}
    try:
        run = drive.settings
        live = redraw(config) if drive.label is None else None  # one live line, not one per drive
        qual = Qualification(run, Broadcast(record, Progress(run, say(config, drive.label), live)))
        drive.qualification = qual
        try:
            yield qual
        finally:
            qual.close()
    finally:
        if interrupts.first is None:  # once interrupted, the rest of the session stops the run and must not be cut
            for signum, handler in previous.items():
                signal.signal(signum, handler)


class Interrupts:
    """SIGINT, SIGTERM and SIGHUP (a closed terminal or SSH session) while a drive is qualified: the first stops the
    run as Ctrl-C does (ranks stopped, partial files removed, reports written); a later one, while that goes on, is
    ignored: stopping is never cut short."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.first: str | None = None

    def __call__(self, signum: int, frame: object) -> None:
        if self.first is not None:
            return
        self.first = signal.Signals(signum).name
        raise KeyboardInterrupt() if signum == signal.SIGINT else KeyboardInterrupt(f"signal {self.first}")


def say(config: pytest.Config, label: str | None = None) -> Callable[[str], None]:
    """Prints a progress line now, even while pytest captures the test's output; with several drives, after the
    drive's label. An xdist worker's output goes nowhere but its stderr, which is the controller's: it writes there."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")

    def write(line: str) -> None:
        line = "\n".join(printable(part) for part in (f"[{label}] {line}" if label else line).split("\n"))
        if reporter is None:
            return
        if capture is None:
            reporter.write_line(line)
            return
        with capture.global_and_fixture_disabled():
            if is_worker(config):
                print(line, file=sys.stderr, flush=True)
                return
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
            shown = printable(text)[: _columns() - 1]  # never wider than the terminal: no wrap
            reporter.write(f"\r{shown}\x1b[K", flush=True)

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
    drive = request.node.stash.get(DRIVE, None)
    return say(request.config, drive.label if drive else None)


@pytest.fixture
def layout_strategy(qualification: Qualification, benchmark):
    """The Hypothesis strategy of this run's odd layouts: at most the run's ranks and its layout size. (The
    benchmark is there for pytest_plugin/benchmarks.py, which gives it one round per judged layout.)"""
    from ckptqual.plan.strategies import layouts  # Hypothesis loads with the first test that draws layouts

    run = qualification.settings
    return layouts(
        max_total_bytes=run.layout_max_total_bytes, max_ranks=len(run.plan.ranks), max_files=LAYOUT_MAX_FILES
    )


@pytest.fixture
def rounds_runner(benchmark, request: pytest.FixtureRequest) -> Callable[..., None]:
    """Drives rounds (a pass's checkpoints, a restore's) as pytest-benchmark rounds, or plainly when benchmarking
    is off (pedantic would then run only one round). Each round lasts, on the test's FigureClock, the seconds of
    what `fn` returns (a checkpoint, a restore): the figure `ckptqual compare` judges, not pytest's wall time."""
    from ckptqual.runs.fill import StopRounds, run_rounds

    clock = figure_clock(request.node)
    if benchmark.disabled or clock is None:
        return run_rounds

    def run(fn: Callable[[], Any], setup: Callable[[], None], rounds: int) -> None:
        try:
            benchmark.pedantic(lambda: clock.advance(fn().seconds), setup=setup, rounds=rounds, warmup_rounds=0)
        except StopRounds:
            benchmark.has_error = False  # ended early on purpose (--early-stop): keep the rounds that ran

    return run


def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict) -> None:
    """The identity of the drive (of each drive, by label, where the run has several)."""
    identities = {
        run.label: {"drive": run.settings.thresholds.drive.name, **run.qualification.identity.to_dict()}
        for run in resolved_runs(config)
        if run.qualification is not None
    }
    if identities:
        machine_info["ckptqual"] = identities.get(None) or {"drives": identities}
