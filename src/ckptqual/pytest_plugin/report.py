"""`--report-dir DIR`: the figures and the HTML page of `ckptqual report`, written at the end of the run from the
run's record as the results JSON holds it (with several drives, one subfolder DIR/LABEL per drive)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckptqual.pytest_plugin.options import resolved_runs
from ckptqual.pytest_plugin.run import say
from ckptqual.report.extract import Run
from ckptqual.report.record import RunRecord


@pytest.hookimpl(trylast=True)  # after the verdict is in the record (verdicts.py)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    for run in resolved_runs(session.config):
        if run.record is not None and run.settings.report_dir is not None:
            _write(session.config, run.record, Path(run.settings.report_dir), run.label)


def _write(config: pytest.Config, record: RunRecord, directory: Path, label: str | None) -> None:
    """One drive's figures and page, from its record as its results file holds it (the directory was checked with
    the settings, before the run started: config/outputs.py)."""
    data = json.loads(json.dumps(record.data, default=str))  # exactly what the results file holds
    try:
        from ckptqual.report.html import write_report  # matplotlib loads only when a report is asked for

        page = write_report([Run(record.path or Path("run.json"), data)], directory)
    except (OSError, ImportError) as error:
        say(config, label)(f"ckptqual: the report could not be written to {directory}: {error}")
        return
    say(config, label)(f"ckptqual: report written to {page}")
