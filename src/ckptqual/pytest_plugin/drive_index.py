"""A run over several drives: each drive's verdict as a JUnit case of its own, what the drives share on the host, the
index of the run at --results, and the run's verdict (QUALIFIED only if every drive's is)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ckptqual.host.topology import shared_parents
from ckptqual.limits.verdict import RunVerdict, combined_verdict
from ckptqual.pytest_plugin.drives import INDEX, gathered_rows
from ckptqual.pytest_plugin.junit import report_health, report_verdict
from ckptqual.pytest_plugin.options import DriveRun
from ckptqual.report.drives import drive_row, drives_index, shared_host
from ckptqual.report.record import RunRecord


def report_drives(session: pytest.Session, runs: list[DriveRun], interruption: str | None) -> RunVerdict:
    """Every drive's verdict and health in the JUnit XML, the index at --results, and the run's verdict."""
    config = session.config
    local = [run for run in runs if run.record is not None]
    if local:
        rows = [drive_row(run.label, run.record.data) for run in local]
    else:
        rows = gathered_rows(config, runs, interruption)
    verdicts = {row["label"]: RunVerdict.from_dict(row["verdict"]) for row in rows}
    for row in rows:
        report_health(config, row["health"], row["label"])
        report_verdict(session, verdicts[row["label"]], row["label"])
    run_verdict = combined_verdict(verdicts)
    pcie = shared_parents({row["label"]: row["devices"] for row in rows})
    shared = shared_host(rows, len(os.sched_getaffinity(0)), pcie)
    index = drives_index(rows, shared, run_verdict.to_dict())
    config.stash[INDEX] = index
    results = config.getoption("results")
    if results:
        record = RunRecord(Path(results))  # its atomic save; of the rest, only the environment
        record.data = {**index, "environment": record.data["environment"]}
        record.save()
    report_verdict(session, run_verdict)
    return run_verdict
