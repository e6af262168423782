"""`--report-dir DIR`: the figures and the HTML page of `ckptqual report`, written at the end of the run from the
run's record as the results JSON holds it; with several drives, one subfolder DIR/LABEL per drive and, in DIR, the
page of all the drives side by side; and the run's summary in the terminal. Steps of the end of the session
(session.QualificationSession)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ckptqual.pytest_plugin.drives import is_worker
from ckptqual.pytest_plugin.held import session_of
from ckptqual.pytest_plugin.options import resolved_runs
from ckptqual.pytest_plugin.run import say
from ckptqual.report.extract import ResultsError, Run, load_run
from ckptqual.report.terminal import report_sections

if TYPE_CHECKING:
    from ckptqual.report.record import RunRecord


def write_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """The run's summary (report.terminal), from the index of its drives or the record of its one drive."""
    runs = resolved_runs(config)
    data = session_of(config).index or (runs[0].record.data if len(runs) == 1 and runs[0].record else None)
    for title, lines in report_sections(data) if data is not None else []:
        terminalreporter.section(title)
        for line in lines:
            terminalreporter.write_line(line)


def draw_reports(session: pytest.Session) -> None:
    """Each drive's figures and page where it has a --report-dir, and with several drives the page of them all;
    once the verdict is in the records."""
    for run in resolved_runs(session.config):
        if run.record is not None and run.settings.report_dir is not None:
            _write(session.config, run.record, Path(run.settings.report_dir), run.label)
    directory = session.config.getoption("report_dir", None)
    if directory is not None and len(resolved_runs(session.config)) > 1 and not is_worker(session.config):
        _write_drives(session.config, Path(directory))


def _write(config: pytest.Config, record: RunRecord, directory: Path, label: str | None) -> None:
    """One drive's figures and page, from its record as its results file holds it (the directory was checked with
    the settings, before the run started: config/outputs.py)."""
    data = json.loads(json.dumps(record.data, default=str))  # exactly what the results file holds
    try:
        from ckptqual.report.html import write_report  # matplotlib loads only when a report is asked for
        from ckptqual.report.labels import short_labelled

        page = write_report(short_labelled([Run(record.path or Path("run.json"), data)]), directory)
    except (OSError, ImportError) as error:
        say(config, label)(f"ckptqual: the report could not be written to {directory}: {error}")
        return
    say(config, label)(f"ckptqual: report written to {page}")


def _write_drives(config: pytest.Config, directory: Path) -> None:
    """The page of every drive side by side in `directory`, from the records this process holds and the results
    files of the drives other processes qualified; a drive with neither is named as left out."""
    index = session_of(config).index
    if index is None:
        return
    records = {run.label: run.record for run in resolved_runs(config) if run.record is not None}
    runs, left_out = [], []
    for label, row in index["drives"].items():
        run = _drive_run(records.get(label), row.get("results"))
        if run is None:
            left_out.append(label)
        else:
            runs.append(run)
    if left_out:
        why = "no record came back (--results keeps one)"
        say(config)(f"ckptqual: the drives' page leaves out {', '.join(left_out)}: {why}")
    if len(runs) < 2:
        return
    try:
        from ckptqual.report.html import write_report  # matplotlib loads only when a report is asked for
        from ckptqual.report.labels import short_labelled

        page = write_report(short_labelled(runs), directory)
    except (OSError, ImportError) as error:
        say(config)(f"ckptqual: the drives' page could not be written to {directory}: {error}")
        return
    say(config)(f"ckptqual: the drives side by side written to {page}")


def _drive_run(record: RunRecord | None, results: str | None) -> Run | None:
    """A drive's run: its record as its results file holds it, or that file as another process wrote it."""
    if record is not None:
        return Run(record.path or Path("run.json"), json.loads(json.dumps(record.data, default=str)))
    try:
        return load_run(Path(results)) if results else None
    except ResultsError:
        return None
