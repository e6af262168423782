"""The QualificationSession: the one plugin object that owns a pytest run's qualification state (held.SessionState:
its drives, what the selection did, the JUnit XML's additions, the workers' rows, the verdict) and ends the session in
one visible order. The other modules of the plugin are wiring: their hooks read and fill that state (`session_of`)."""

from __future__ import annotations

from collections.abc import Generator
from types import TracebackType
from typing import Any

import pytest

from ckptqual.printable import printable
from ckptqual.pytest_plugin import benchmarks, hookspecs, junit
from ckptqual.pytest_plugin.drives import is_worker, settle_drive_files
from ckptqual.pytest_plugin.held import SESSION_PLUGIN, session_of
from ckptqual.pytest_plugin.options import resolved_runs


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Registers the session object before pytest's terminal reporter (see pytest_sessionfinish)."""
    config.pluginmanager.register(QualificationSession(config), SESSION_PLUGIN)


class QualificationSession:
    """A pytest run's qualification: its state, and the end of the session as one sequence (`pytest_sessionfinish`).
    Registered as the plugin `ckptqual-session`, as pytest-xdist registers its DSession."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        if not hasattr(config.hook, "pytest_ckptqual_verdict"):  # loaded without the plugin's entry point (-p ...)
            config.pluginmanager.add_hookspecs(hookspecs)
        self.session: pytest.Session | None = None
        self.state = session_of(config)

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self.session = session

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> None:
        self.state.running = item.nodeid

    @pytest.hookimpl(tryfirst=True)  # before the terminal reporter renders the interrupt's traceback
    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo) -> None:
        _drop_lineless_frames(excinfo.tb)
        message = str(excinfo.value)
        if isinstance(excinfo.value, pytest.Session.Interrupted):  # pytest's own stop: a collection error, -x
            self.state.interrupted_by = f"pytest ({printable(message)})"
        elif message.startswith("signal "):
            self.state.interrupted_by = message.removeprefix("signal ")
        else:
            self.state.interrupted_by = "SIGINT (Ctrl-C)"

    # A wrapper registered after pytest-benchmark's plugin and before pytest's terminal reporter (pytest_configure):
    # pluggy calls the later registered first, so this wraps pytest-benchmark's (which saves before it yields) and is
    # wrapped by the terminal reporter's (whose summary, after it yields, names the JUnit XML this rewrites).
    @pytest.hookimpl(wrapper=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> Generator[None, None, None]:
        """The end of the session, in this order: (1) close the runs an interruption left open and report the tests
        it kept from finishing; (2) each drive's verdict, then (3) saved in its record; (4) the run's verdict, as JUnit
        test cases and suite properties (an xdist worker sends its drives' rows to the controller instead), told to
        `pytest_ckptqual_verdict`; (5) pytest-benchmark's autosaved run named after the drives; then pytest writes
        its JUnit XML and pytest-benchmark saves; (6) the JUnit XML rewritten with ckptqual's additions; (7) the
        figures and page of --report-dir drawn."""
        drives = resolved_runs(self.config)
        if drives:  # a qualification: the modules of its verdict and report load now
            from ckptqual.pytest_plugin import report, verdicts

            stopped = self.state.interruption(exitstatus)
            runs = [run for run in drives if run.record is not None]
            for run in runs:
                verdicts.close_run(session, run, stopped)
            for run in runs:
                run.verdict = verdicts.drive_verdict(session, run, stopped)
            for run in runs:
                run.begun.save()
            self.state.verdict = verdicts.run_verdict(session, runs, stopped)
            if self.state.verdict is not None:
                self.config.hook.pytest_ckptqual_verdict(session=session, verdict=self.state.verdict)
            benchmarks.name_autosave(self.config, self.state.records())
        result = yield
        junit.rewrite(session)
        if drives:
            report.draw_reports(session)
        return result

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_terminal_summary(
        self, terminalreporter: Any, exitstatus: int, config: pytest.Config
    ) -> Generator[None, None, None]:
        """After the other plugins' summaries (pytest-benchmark's table, shown only for -v or a comparison): the run's
        summary, then the benchmarks' rates compared with the saved run's, then a regression pytest-benchmark found
        as one failing line."""
        records = self.state.records()
        benchmarks.quiet_table(config, bool(records))
        try:
            yield
            regression = None
        except Exception as error:
            regression = error
        if resolved_runs(config):
            from ckptqual.pytest_plugin.report import write_summary

            write_summary(terminalreporter, config)
        if regression is not None and not benchmarks.is_regression(regression):
            raise regression
        benchmarks.write_comparison(terminalreporter, self.state.compared, self.state.benchmark_rows)
        if regression is not None:
            benchmarks.write_regressions(terminalreporter, config, self.state.benchmark_rows, regression)
            if self.session is not None and self.session.exitstatus == pytest.ExitCode.OK:
                self.session.exitstatus = pytest.ExitCode.TESTS_FAILED

    @pytest.hookimpl(trylast=True)
    def pytest_unconfigure(self, config: pytest.Config) -> None:
        """After the workers ended: each drive's results file agrees with the controller's verdict; pytest's private
        JUnit directory goes; the verdict is the last line of the output, after pytest's own counts (a refused run's
        usage error, which pytest prints after this, repeats its fix below it)."""
        if self.state.index is not None and not is_worker(config):
            settle_drive_files(self.state.index)
        junit.remove_private_copy(self.state)
        if self.state.verdict is not None:
            terminal = config.pluginmanager.get_plugin("terminalreporter")
            if terminal is not None:
                terminal.write_line(self.state.verdict.line(), bold=True, red=self.state.verdict.overall != "QUALIFIED")


def _drop_lineless_frames(tb: TracebackType) -> None:
    """Unlinks the frames of `tb` that have no line number: a signal that lands on an instruction without one (seen
    on Python 3.11 at Ctrl-C) leaves such a frame, and pytest's rendering of the interrupt fails on it."""
    while tb.tb_next is not None:
        if tb.tb_next.tb_lineno is None:
            tb.tb_next = tb.tb_next.tb_next
        else:
            tb = tb.tb_next
