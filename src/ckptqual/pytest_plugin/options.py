"""The ckptqual options, generated from the settings table; the run's drives and each one's settings, resolved once;
the space check and the check of the limits against the suite's own ceiling."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from ckptqual.config.drives import drive_targets
from ckptqual.config.table import SETTINGS, add_options
from ckptqual.config.values import SettingsError
from ckptqual.host import gpu
from ckptqual.pytest_plugin.drive_run import DriveRun
from ckptqual.pytest_plugin.held import session_of
from ckptqual.pytest_plugin.junit import junit_path

if TYPE_CHECKING:  # the run's own modules load when a drive is qualified, not with the plugin
    from ckptqual.config.run_settings import RunSettings


DRIVE = pytest.StashKey[DriveRun]()  # the drive a qualification test qualifies


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser.getgroup("ckptqual", "checkpoint storage qualification (ckptqual)").addoption)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "part(name): the part of the run a qualification test is, of [run] parts")


def drive_runs(config: pytest.Config) -> list[DriveRun]:
    """The run's drives, resolved once; a bad option, drive file or target list is a usage error, and so is a
    refused or too small target when it is the only one."""
    held = session_of(config)
    if held.drives is None:
        try:
            held.drives = _resolve(config)
        except SettingsError as error:
            held.drives = error
    resolved = held.drives
    if isinstance(resolved, SettingsError):
        raise pytest.UsageError(str(resolved))
    return resolved


def resolved_runs(config: pytest.Config) -> list[DriveRun]:
    """The run's drives where they were resolved without a usage error, else none (for hooks that run anyway)."""
    resolved = session_of(config).drives
    return resolved if isinstance(resolved, list) else []


def _resolve(config: pytest.Config) -> list[DriveRun]:
    """Each drive's settings, then its outputs (pytest's JUnit XML among them) apart from every target and each
    other."""
    from ckptqual.config.outputs import check_apart
    from ckptqual.config.run_settings import resolve_drive, resolve_settings

    options = {row.name: config.getoption(row.name) for row in SETTINGS if row.flag}
    targets = drive_targets(options["target"], options["drive"])
    if len(targets) == 1:
        runs = [DriveRun(None, resolve_settings({**options, "target": targets[0].target,
                                                  "drive": targets[0].drive or options["drive"]}))]  # fmt: skip
    else:
        at_once = min(len(targets), _workers(config))
        runs = [DriveRun(target.label, *resolve_drive(options, target, at_once)) for target in targets]
    saving = bool(config.getoption("benchmark_save", None) or config.getoption("benchmark_autosave", None))
    check_apart(junit_path(config), [run.settings for run in runs], _benchmark_storage(config), saving)
    return runs


def _benchmark_storage(config: pytest.Config) -> Path | None:
    """pytest-benchmark's storage directory where it is one (file://, its default), else None."""
    uri = config.getoption("benchmark_storage", None)
    if not isinstance(uri, str) or ("://" in uri and not uri.startswith("file://")):
        return None
    return Path(uri.removeprefix("file://"))


def _workers(config: pytest.Config) -> int:
    """How many pytest-xdist workers run the tests: 1 without -n."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        return int(workerinput["workercount"])
    count = config.getoption("numprocesses", None)
    return count if isinstance(count, int) and count > 0 else 1


def settings(config: pytest.Config) -> RunSettings:
    """The run's settings (the first drive's, where there are several), resolved once; a bad option or drive file
    is a usage error."""
    return drive_runs(config)[0].settings


def selected_parts(items: Iterable[pytest.Item], can_run: gpu.HostGpu | None = None) -> set[str]:
    """The parts of the run that write to the target, by the selected tests: the sweep only with a cell whose
    transfer type this host can run (`can_run`: the host's GPU probe, made here when needed)."""
    parts, transfers = set(), set()
    for item in items:
        names = getattr(item, "fixturenames", ())
        parts |= {part for part, fixture in (("fill", "fill_pass"), ("layouts", "layout_strategy")) if fixture in names}
        cell = getattr(getattr(item, "callspec", None), "params", {}).get("sweep_cell")
        transfers |= {cell.transfer} if cell is not None else set()
    if transfers:
        host = can_run or gpu.probe()
        parts |= {"sweep"} if any(host.problem(transfer) is None for transfer in transfers) else set()
    return parts


def _sweep_transfers(items: Iterable[pytest.Item]) -> list[str]:
    """The transfer types of the selected sweep cells, in order."""
    cells = (getattr(getattr(item, "callspec", None), "params", {}).get("sweep_cell") for item in items)
    return list(dict.fromkeys(cell.transfer for cell in cells if cell is not None))


def check_runnable(run: RunSettings, items: Iterable[pytest.Item], can_run: gpu.HostGpu | None = None) -> None:
    """Refuses a run whose drive file requires the sweep when no selected cell's transfer type can run on this host:
    every cell would be skipped and the verdict could never be QUALIFIED. The fix names runs that can qualify here."""
    transfers = _sweep_transfers(items)
    if "sweep" not in run.thresholds.requires or not transfers:
        return
    host = can_run or gpu.probe()
    problems = [host.problem(transfer) for transfer in transfers]
    if any(problem is None for problem in problems):
        return
    raise SettingsError(
        f"--drive {run.thresholds.path.stem}: its [verdict] requires the sweep, whose transfers here are "
        f"{', '.join(transfers)}, and none can run on this host ({problems[0]}), so the run could never be "
        f"QUALIFIED; run it on a host with a GPU and GPU Direct Storage, or qualify this host's read path with a drive "
        f"file whose sweep reads without a GPU too (--drive local)"
    )


def leave_out_parts(items: Iterable[pytest.Item], run: RunSettings) -> list[pytest.Item]:
    """Marks the tests of the parts that the drive file's [run] parts leaves out as skipped, naming why; returns the
    others."""
    running = []
    for item in items:
        marker = item.get_closest_marker("part")
        if marker is None or marker.args[0] in run.parts:
            running.append(item)
        else:
            why = f"{marker.args[0]} is not among the parts this run runs ({run.sources['parts']}: [run] parts = "
            item.add_marker(pytest.mark.skip(reason=f"{why}{', '.join(run.parts)})"))
    return running


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected what will not run
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skips the tests of parts the run leaves out, and refuses, before any I/O, a run whose selected parts do not
    fit the target at once (from the file system's free space, with no I/O); with several drives, a drive whose
    target is too small fails alone (run.py). The suite's own ceiling is measured only for a run that runs tests."""
    if not any(item.get_closest_marker("qualification") for item in items):
        return
    from ckptqual.config.space import check_inodes, check_space

    runs = drive_runs(config)
    for run in runs:
        running = leave_out_parts([item for item in items if item.stash.get(DRIVE, runs[0]) is run], run.settings)
        if run.problem is not None:
            continue  # its target was refused: there is no space to check
        try:
            check_runnable(run.settings, running)
            parts = selected_parts(running)
            # first: a fix for too little space must be a run this host can qualify; --collect-only calibrates nothing
            ceilings = None if config.option.collectonly else run.check_ceiling()
            check_space(run.settings, parts, ceilings=ceilings)
            check_inodes(run.settings, parts)
        except SettingsError as error:
            if len(runs) == 1:
                session_of(config).refused = str(error)
                raise pytest.UsageError(str(error)) from None
            run.problem = str(error)
    if len(runs) > 1:  # the drives that cannot run share nothing
        at_once = max(1, min(sum(run.problem is None for run in runs), _workers(config)))
        for run in runs:
            run.settings = replace(run.settings, drives_at_once=at_once)


def drive_of(nodeid: str, config: pytest.Config) -> str | None:
    """The label of the drive whose label opens the test's id (`nvme1` in `...::test_fill_pass[nvme1-2]`), if any."""
    match = re.search(r"\[([A-Za-z0-9_.]+)[-\]]", nodeid.rsplit("::", 1)[-1])
    labels = {run.label for run in drive_runs(config)}
    return match.group(1) if match and match.group(1) in labels else None
