"""pytest wiring of the read sweep only: its options, one test per cell, the session's sweep, its summary table.

Every option is checked before any I/O: a bad value is a usage error naming the value and the fix.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ckptqual.host import gpu
from ckptqual.limits.thresholds import Outcome
from ckptqual.pytest_plugin.plugin import settings
from ckptqual.report.summary import table
from ckptqual.runs.fill import RESERVE_BYTES, checkpoint_footprint_bytes
from ckptqual.runs.qualification import Qualification
from ckptqual.runs.sweep.cells import (
    SweepConfig,
    SweepOptionError,
    matrix,
    parse_block_sizes,
    parse_file_bytes,
    parse_requests,
    parse_threads,
    parse_transfers,
    plan_cells,
    resolve_sweep,
)
from ckptqual.runs.sweep.driver import CellResult, SweepRun
from ckptqual.runs.sweep.files import file_names

CELL_FIXTURE = "sweep_cell"
_CONFIG = pytest.StashKey[SweepConfig]()
_RUN = pytest.StashKey[SweepRun]()


def _option(parse: Callable[[str, str], Any], name: str) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            return parse(text, name)
        except SweepOptionError as error:
            raise pytest.UsageError(str(error)) from None

    return convert


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ckptqual")
    group.addoption(
        "--sweep-block-sizes",
        type=_option(parse_block_sizes, "--sweep-block-sizes"),
        help="read sweep block sizes, e.g. 1M,128K (default: the drive file's [sweep])",
    )
    group.addoption(
        "--sweep-threads",
        type=_option(parse_threads, "--sweep-threads"),
        help="read sweep thread counts (I/O depth of a cell), e.g. 16,1 (default: the drive file's [sweep])",
    )
    group.addoption(
        "--sweep-file-bytes",
        type=_option(parse_file_bytes, "--sweep-file-bytes"),
        help="size of each of the sweep's files (one per job), e.g. 256M (default: the drive file's [sweep])",
    )
    group.addoption(
        "--sweep-requests",
        type=_option(parse_requests, "--sweep-requests"),
        help="reads per job per cell, at most one pass over its file (default: 2048)",
    )
    group.addoption(
        "--transfer",
        type=_option(parse_transfers, "--transfer"),
        help="read sweep transfer types: gpu-direct,cpu-gpu,cpu-only (default: the drive file's [sweep]); "
        "types this host cannot run are skipped with the reason",
    )


def sweep_config(config: pytest.Config) -> SweepConfig:
    """The sweep's settings, resolved once; a bad combination is a usage error."""
    if _CONFIG not in config.stash:
        thresholds = settings(config).thresholds
        get = config.getoption
        try:
            config.stash[_CONFIG] = resolve_sweep(
                thresholds.sweep,
                thresholds.path.name,
                block_sizes=get("sweep_block_sizes"),
                threads=get("sweep_threads"),
                file_bytes=get("sweep_file_bytes"),
                transfers=get("transfer"),
                requests=get("sweep_requests"),
            )
        except SweepOptionError as error:
            raise pytest.UsageError(str(error)) from None
    return config.stash[_CONFIG]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if CELL_FIXTURE in metafunc.fixturenames:
        try:
            cells = plan_cells(sweep_config(metafunc.config))
        except pytest.UsageError:
            cells = []  # the usage error is raised once collection is done
        metafunc.parametrize(CELL_FIXTURE, cells, ids=[cell.id for cell in cells])


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    if not any(CELL_FIXTURE in getattr(item, "fixturenames", ()) for item in items):
        return
    sweep = sweep_config(config)
    run = settings(config)
    where = run.target if run.target is not None else Path(tempfile.gettempdir())
    fill = any("fill_pass" in getattr(item, "fixturenames", ()) for item in items)
    fill_bytes = run.checkpoints_per_pass * checkpoint_footprint_bytes(run.plan) if fill else 0
    free = shutil.disk_usage(where).free
    if sweep.files_bytes + fill_bytes + RESERVE_BYTES > free:
        raise pytest.UsageError(
            f"--sweep-file-bytes: the read sweep's {sweep.jobs} files of {sweep.file_bytes / 2**20:,.0f} MiB need "
            f"{sweep.files_bytes / 1e9:,.2f} GB beside the fill's {fill_bytes / 1e9:,.2f} GB, but {where} has "
            f"{free / 1e9:,.2f} GB free; use a smaller --sweep-file-bytes"
        )


@pytest.fixture(scope="session")
def sweep(qualification: Qualification, request: pytest.FixtureRequest) -> Iterator[SweepRun]:
    """The session's read sweep; its files are written before the first cell that runs and removed after the
    last (pytest_runtest_teardown), or at the end of the session."""
    config = sweep_config(request.config)
    record = qualification.record
    # cuFile logs to ./cufile.log unless told otherwise; keep it inside the run directory (read into the record).
    cufile_log = Path(os.environ.setdefault("CUFILE_LOGFILE_PATH", str(qualification.target.run_dir / "cufile.log")))

    def store(data: dict[str, Any]) -> None:
        record.data["sweep"] = data
        record.save()

    if cufile_log.parent == qualification.run_dir:
        qualification.declare(".", [cufile_log.name])
    qualification.declare("sweep", file_names(config.jobs))
    run = SweepRun(
        config,
        qualification.run_dir / "sweep",
        seed=qualification.settings.seed,
        host=gpu.probe(),
        say=qualification.say,
        on_change=store,
        cufile_log=cufile_log,
        run=qualification.space.call,
    )
    request.config.stash[_RUN] = run
    store(run.data)
    for transfer, engine in run.data["engines"].items():
        qualification.say(f"ckptqual: read sweep {transfer}: {engine}")
    try:
        yield run
    finally:
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
            verdict.judge([("sweep_read_bandwidth", result.stats.GiBps, "GiB/s")], **cell.context())
        outcome = "ERROR"
        try:
            outcome = str(verdict.findings.conclusion().outcome)
            verdict.conclude()
        finally:
            sweep.set_outcome(cell, outcome if verdict.findings.items else "MEASURED")

    return judge


def summary_lines(data: dict[str, Any]) -> list[str]:
    """The sweep's matrix per transfer type: block sizes down, threads across, GiB/s."""
    config = data["config"]
    lines = [
        f"{config['jobs']} jobs (one file of {config['file_bytes'] / 2**20:,.0f} MiB each), batch {config['batch']}, "
        f"up to {config['requests_per_job']} reads per job per cell; GiB/s (2^30 bytes/s); "
        "F = below its limit, M = marginal"
    ]
    cells: list[dict[str, Any]] = data["cells"]
    for transfer in config["transfers"]:
        own = [cell for cell in cells if cell["transfer"] == transfer]
        engine = data["engines"].get(transfer, "")
        if not own or all(cell.get("outcome") == "SKIPPED" for cell in own):
            lines.append(f"{transfer}: {engine if own else 'not run'}")
            continue
        measured = [cell for cell in own if "settings" in cell]
        direct = {cell["settings"].get("direct_io") for cell in measured}
        io_mode = "O_DIRECT" if direct == {True} else "buffered" if direct == {False} else "O_DIRECT/buffered"
        lines.append(f"{transfer}: {engine}, {io_mode}")
        headers, rows = matrix(cells, transfer)
        lines += ["  " + line for line in table(headers, rows)]
    return lines


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Removes the sweep's files once its last cell has run, before the tests that follow."""
    run = item.config.stash.get(_RUN, None)
    if run is None or CELL_FIXTURE not in getattr(item, "fixturenames", ()):
        return
    if nextitem is None or CELL_FIXTURE not in getattr(nextitem, "fixturenames", ()):
        run.remove_files()


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    run = config.stash.get(_RUN, None)
    if run is None:
        return
    terminalreporter.section("ckptqual read sweep")
    for line in summary_lines(run.data):
        terminalreporter.write_line(line)
