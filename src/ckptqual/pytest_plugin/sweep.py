"""pytest wiring of the read sweep only: one test per cell, the session's sweep, its summary table."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from ckptqual.host import gpu
from ckptqual.limits.limits import Outcome
from ckptqual.pytest_plugin.drives import parametrize_by_drive
from ckptqual.pytest_plugin.held import session_of
from ckptqual.pytest_plugin.options import DRIVE
from ckptqual.pytest_plugin.run import say
from ckptqual.runs.sweep.cells import plan_cells

if TYPE_CHECKING:  # the sweep's reader loads when a sweep runs, not with the plugin
    from ckptqual.runs.qualification import Qualification
    from ckptqual.runs.sweep.driver import CellResult, SweepRun

CELL_FIXTURE = "sweep_cell"


@pytest.hookimpl(tryfirst=True)  # the drive opens a test's id: test_read_sweep[nvme1-cpu-only-1M-16]
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if CELL_FIXTURE in metafunc.fixturenames:
        parametrize_by_drive(metafunc, CELL_FIXTURE, lambda run: plan_cells(run.sweep), lambda cell: cell.id)


@pytest.fixture(scope="session")
def sweep(qualification: Qualification, request: pytest.FixtureRequest) -> Iterator[SweepRun]:
    """The session's read sweep; its files are written before the first cell that runs and removed after the
    last (pytest_runtest_teardown), or at the end of the session."""
    # cuFile logs to ./cufile.log unless told otherwise; keep it inside the run directory (read into the record),
    # this drive's where several are qualified one after another, unless the user set where.
    held = session_of(request.config)
    if os.environ.get("CUFILE_LOGFILE_PATH", held.cufile_log) == held.cufile_log:
        os.environ["CUFILE_LOGFILE_PATH"] = held.cufile_log = str(qualification.run_dir / "cufile.log")
    cufile_log = Path(os.environ["CUFILE_LOGFILE_PATH"])

    if cufile_log.parent == qualification.run_dir:
        qualification.declare(".", [cufile_log.name])
    label = qualification.settings.label
    run = qualification.read_sweep(gpu.probe(), say(request.config, label), cufile_log)
    session_of(request.config).sweeps[label] = run
    for transfer, engine in run.data["engines"].items():
        say(request.config, label)(f"ckptqual: read sweep {transfer}: {engine}")
    try:
        yield run
    finally:
        if not qualification.closed:  # an interrupted run closed it first: the run directory went with the files
            run.close()


@pytest.fixture
def sweep_runner(benchmark) -> Callable[[Callable[[], None], Callable[[], None]], None]:
    """Times a cell as one pytest-benchmark round, its setup (evict, check the page cache) untimed. When
    benchmarking is off (--benchmark-disable, xdist), pedantic() just runs setup and cell once, plainly."""

    def run(fn: Callable[[], None], setup: Callable[[], None]) -> None:
        benchmark.pedantic(fn, setup=setup, rounds=1, iterations=1, warmup_rounds=0)

    return run


@pytest.fixture
def sweep_check(sweep: SweepRun, verdict, record_property) -> Callable[[CellResult], None]:
    """Judges a measured cell: INVALID fails with its reason; else its GiB/s against the drive's limits."""

    def judge(result: CellResult) -> None:
        cell, record = result.cell, result.record
        for key in ("GiBps", "engine", "iops", "mean_latency_us", "p99_latency_us", "cached_fraction_before"):
            value = record[key]
            record_property(f"sweep.{key}", f"{value:.6g}" if isinstance(value, float) else value)
        record_property("sweep.direct_io", record["settings"].get("direct_io"))
        if result.invalid_reason:
            measured = f"{result.stats.GiBps:.3g} GiB/s measured, not judged"
            verdict.add(Outcome.INVALID, f"{measured}: {result.invalid_reason}")
        else:
            verdict.qualification.host_bound_figure("sweep_read_bandwidth", record["host_bound"])
            verdict.judge([("sweep_read_bandwidth", result.stats.GiBps, "GiB/s")], **cell.context())
        outcome = "ERROR"
        try:
            outcome = str(verdict.findings.conclusion(only_measures=True).outcome)
            verdict.conclude(only_measures=True)
        finally:
            sweep.set_outcome(cell, outcome)

    return judge


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Removes the sweep's files once its last cell has run, before the tests that follow."""
    drive = item.stash.get(DRIVE, None)
    run = session_of(item.config).sweeps.get(drive.label if drive else None)
    if run is None or CELL_FIXTURE not in getattr(item, "fixturenames", ()):
        return
    if nextitem is None or CELL_FIXTURE not in getattr(nextitem, "fixturenames", ()):
        run.remove_files()
