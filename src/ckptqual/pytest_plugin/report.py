"""`--report-dir DIR`: the figures and the HTML page of `ckptqual report`, written at the end of the run from the
run's record as the results JSON holds it (with several drives, one subfolder DIR/LABEL per drive)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ckptqual.pytest_plugin.drives import is_worker, names_the_qualification
from ckptqual.pytest_plugin.options import drive_runs, resolved_runs
from ckptqual.pytest_plugin.run import say
from ckptqual.report.extract import Run
from ckptqual.report.record import RunRecord


def report_dir_problem(directory: Path, target: Path | None) -> str | None:
    """Why `directory` cannot take the report, checked before the run starts (not hours later); None if it can."""
    directory = directory.resolve()
    if directory.exists() and not directory.is_dir():
        return f"--report-dir {directory}: is not a directory; give a directory, e.g. --report-dir ./report"
    if target is not None and directory.is_relative_to(target.resolve()):
        return (
            f"--report-dir {directory}: lies inside the target {target}, which holds only what ckptqual creates and "
            "removes; write the report elsewhere, e.g. --report-dir ./report"
        )
    existing = next(parent for parent in (directory, *directory.parents) if parent.exists())
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"--report-dir {directory}: {existing} is not writable by this user; write the report elsewhere"
    return None


def _check_report_dirs(config: pytest.Config) -> None:
    """Refuses, before the run starts, a report directory (of any drive) that cannot take the report."""
    for run in drive_runs(config):
        if run.settings.report_dir is not None:
            problem = report_dir_problem(Path(run.settings.report_dir), run.settings.target)
            if problem:
                raise pytest.UsageError(problem)


def pytest_configure(config: pytest.Config) -> None:
    """An xdist controller collects nothing: with several drives under -n it checks here instead."""
    if config.getoption("numprocesses", None) and not is_worker(config) and names_the_qualification(config):
        _check_report_dirs(config)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    if any(item.get_closest_marker("qualification") for item in items):
        _check_report_dirs(config)


@pytest.hookimpl(trylast=True)  # after the verdict is in the record (verdicts.py)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    for run in resolved_runs(session.config):
        if run.record is not None and run.settings.report_dir is not None:
            _write(session.config, run.record, Path(run.settings.report_dir), run.settings.target, run.label)


def _write(config: pytest.Config, record: RunRecord, directory: Path, target: Path | None, label: str | None) -> None:
    """One drive's figures and page, from its record as its results file holds it."""
    if report_dir_problem(directory, target):
        return  # refused before the run started (a usage error)
    data = json.loads(json.dumps(record.data, default=str))  # exactly what the results file holds
    try:
        from ckptqual.report.html import write_report  # matplotlib loads only when a report is asked for

        page = write_report([Run(record.path or Path("run.json"), data)], directory)
    except (OSError, ImportError) as error:
        say(config, label)(f"ckptqual: the report could not be written to {directory}: {error}")
        return
    say(config, label)(f"ckptqual: report written to {page}")
