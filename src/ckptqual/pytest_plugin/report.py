"""`--report-dir DIR`: the figures and the HTML page of `ckptqual report`, written at the end of the run from the
run's record as the results JSON holds it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ckptqual.pytest_plugin.options import settings
from ckptqual.pytest_plugin.run import RECORD, say
from ckptqual.report.extract import Run


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


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    if not any(item.get_closest_marker("qualification") for item in items) or settings(config).report_dir is None:
        return
    problem = report_dir_problem(Path(settings(config).report_dir), settings(config).target)
    if problem:
        raise pytest.UsageError(problem)


@pytest.hookimpl(trylast=True)  # after the verdict is in the record (verdicts.py)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    record = config.stash.get(RECORD, None)
    if record is None or settings(config).report_dir is None:
        return
    directory = Path(settings(config).report_dir)
    if report_dir_problem(directory, settings(config).target):
        return  # refused before the run started (a usage error)
    data = json.loads(json.dumps(record.data, default=str))  # exactly what the results file holds
    try:
        from ckptqual.report.html import write_report  # matplotlib loads only when a report is asked for

        page = write_report([Run(record.path or Path("run.json"), data)], directory)
    except (OSError, ImportError) as error:
        say(config)(f"ckptqual: the report could not be written to {directory}: {error}")
        return
    say(config)(f"ckptqual: report written to {page}")
