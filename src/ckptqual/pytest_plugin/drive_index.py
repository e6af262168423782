"""A run over several drives: each drive's verdict as a JUnit case of its own, what the drives share on the host, the
index of the run at --results, and the run's verdict (QUALIFIED only if every drive's is)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from ckptqual.host.topology import disks_under, shared_disks, shared_parents
from ckptqual.limits.verdict import RunVerdict, combined_verdict
from ckptqual.pytest_plugin.drive_run import DriveRun
from ckptqual.pytest_plugin.drives import gathered_rows
from ckptqual.pytest_plugin.held import session_of
from ckptqual.pytest_plugin.junit import report_health, report_verdict
from ckptqual.report.drives import drive_row, drives_index, shared_host
from ckptqual.report.record import RunRecord


def report_drives(session: pytest.Session, runs: list[DriveRun], interruption: str | None) -> RunVerdict:
    """Every drive's verdict and health in the JUnit XML, the index at --results, and the run's verdict."""
    config = session.config
    local = [run for run in runs if run.record is not None]
    if local:
        rows = [drive_row(run.label, run.begun.data) for run in local]
    else:
        rows = gathered_rows(config, runs, interruption)
    verdicts = {row["label"]: RunVerdict.from_dict(row["verdict"]) for row in rows}
    for row in rows:
        report_health(config, row["health"], row["label"])
        report_verdict(session, verdicts[row["label"]], row["label"])
    run_verdict = combined_verdict(verdicts)
    shared = shared_host(rows, len(os.sched_getaffinity(0)), *shared_hardware(rows))
    index = drives_index(rows, shared, run_verdict.to_dict())
    session_of(config).index = index
    results = config.getoption("results")
    if results:
        record = RunRecord(Path(results))  # its atomic save; of the rest, only the environment
        record.data = {**index, "environment": record.data["environment"]}
        record.save()
    report_verdict(session, run_verdict)
    return run_verdict


def shared_hardware(rows: list[dict[str, Any]]) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """The PCI functions and the disks under two or more drives: each drive's devices as its identity names them and
    the disks under its target, loop devices followed to the disk under their backing files."""
    disks = {row["label"]: disks_under(Path(str(row["target"]))) for row in rows}
    pcie = shared_parents({row["label"]: [*row["devices"], *disks[row["label"]]] for row in rows})
    return pcie, shared_disks(disks)
