"""Several drives in one run: each qualification test parametrized by its drive (`test_fill_pass[nvme1-2]`), a
drive's tests kept together and in order, and with pytest-xdist one worker per drive (`-n auto`), each drive's
tests one work unit of one worker; the workers' results come back to the controller, which runs no test."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from ckptqual.config.drives import drive_targets
from ckptqual.config.run_settings import RunSettings
from ckptqual.config.values import SettingsError
from ckptqual.pytest_plugin.drive_run import DriveRun
from ckptqual.pytest_plugin.held import session_of
from ckptqual.pytest_plugin.options import DRIVE, drive_of, drive_runs

DRIVE_ARG = "ckptqual_drive"
_ROWS_KEY, _SELECTED_KEY, _CRASHED_KEY = "ckptqual_drives", "ckptqual_selected", "ckptqual_crashed"
_ORDER = pytest.StashKey[int]()  # a test's place in the collection


def names_the_qualification(config: pytest.Config) -> bool:
    """Whether the command line selects the qualification suite (tests_qual, or the directory above it)."""
    for arg in config.args:
        path = Path(arg.split("::")[0]).resolve()
        if "tests_qual" in path.parts or (path.is_dir() and (path / "tests_qual").is_dir()):
            return True
    return False


def is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


@pytest.fixture(scope="session", name=DRIVE_ARG)
def drive_label() -> str | None:
    """The label of the drive a test qualifies: None where the run has one drive; parametrized where it has more."""
    return None


def drive_run(config: pytest.Config, label: str | None) -> DriveRun:
    return next(run for run in drive_runs(config) if run.label == label)


def parametrize_by_drive(
    metafunc: pytest.Metafunc,
    name: str | None,
    values_of: Callable[[RunSettings], list[Any]] = lambda run: [],
    id_of: Callable[[Any], str] = str,
    fallback: list[Any] | None = None,
) -> None:
    """Parametrizes `name` with each drive's values (ids as before where the run has one drive); with several
    drives, jointly with the drive, whose label opens the id (`nvme1-2`); `name` None: by the drive alone."""
    try:
        runs = drive_runs(metafunc.config)
    except pytest.UsageError:  # raised again once collection is done
        if name is not None:
            metafunc.parametrize(name, fallback or [], ids=[id_of(value) for value in fallback or []])
        return
    if len(runs) == 1:
        if name is not None:
            values = values_of(runs[0].settings)
            metafunc.parametrize(name, values, ids=[id_of(value) for value in values])
        return
    labels = [run.label for run in runs]
    if name is None:
        metafunc.parametrize(DRIVE_ARG, labels, ids=labels, scope="session")
        return
    pairs = [(run.label, value) for run in runs for value in values_of(run.settings)]
    ids = [f"{label}-{id_of(value)}" for label, value in pairs]
    metafunc.parametrize([DRIVE_ARG, name], pairs, ids=ids, scope="session")


def pytest_itemcollected(item: pytest.Item) -> None:
    """Notes the order of collection, which pytest's grouping of session-scoped parameters does not keep."""
    held = session_of(item.config)
    item.stash[_ORDER] = held.collected_count
    held.collected_count += 1


def group_by_drive(items: list[pytest.Item], selected: Iterable[pytest.Item], runs: list[DriveRun]) -> None:
    """Notes each qualification test's drive and, with several drives, puts each drive's tests together, in the
    order they were collected, drive after drive: without -n the drives are then qualified one after another, each
    closed before the next starts (the session fixtures depend on the drive's parameter)."""
    by_label = {run.label: run for run in runs}
    for item in selected:
        params = getattr(getattr(item, "callspec", None), "params", {})
        item.stash[DRIVE] = by_label.get(params.get(DRIVE_ARG), runs[0])
    if len(runs) > 1:
        place = {id(run): number for number, run in enumerate(runs)}
        items.sort(key=lambda item: (place[id(item.stash[DRIVE])] if DRIVE in item.stash else -1,
                                     item.stash.get(_ORDER, 0)))  # fmt: skip


def selected_runs(items: Iterable[pytest.Item]) -> list[DriveRun]:
    """The drives with a selected test, in their order."""
    return list({id(item.stash[DRIVE]): item.stash[DRIVE] for item in items if DRIVE in item.stash}.values())


def send_rows(config: pytest.Config, runs: list[DriveRun], selected: list[DriveRun]) -> None:
    """A worker's drives, as rows of the side-by-side table, back to the controller (config.workeroutput)."""
    from ckptqual.report.drives import drive_row

    rows = {run.label: drive_row(run.label, run.record.data) for run in runs if run.record is not None}
    output = config.workeroutput  # type: ignore[attr-defined]  # pytest-xdist gives a worker's config one
    output[_ROWS_KEY] = json.loads(json.dumps(rows, default=str))
    output[_SELECTED_KEY] = [run.label for run in selected]


def gathered_rows(config: pytest.Config, runs: list[DriveRun], interruption: str | None) -> list[dict[str, Any]]:
    """On the controller, each selected drive's row (every drive's, if the run was interrupted): as its worker sent
    it, else from its results file, else a row saying that nothing came back; a drive whose worker crashed is at best
    INCOMPLETE, with the crash first (after the interruption, where the run was interrupted: a worker may die of it)."""
    from ckptqual.report.drives import crashed_row, drive_row, missing_row

    held = session_of(config)
    rows, selected, crashes = held.rows, held.selected, held.crashes
    unjudged = f"{interruption} before the drive's worker recorded a verdict" if interruption else None
    found = []
    for run in runs:
        results = run.settings.results
        if run.label in rows:
            row = rows[run.label]
        elif not (run.label in selected or run.label in crashes or interruption):
            continue
        elif results is not None and Path(results).is_file():
            row = drive_row(run.label, json.loads(Path(results).read_text()), unjudged)
        else:
            why = unjudged or "no result came back from the worker that qualified it (see its output above)"
            row = missing_row(run.label, run.settings.target, results, why)
        found.append(crashed_row(row, crashes[run.label], unjudged) if run.label in crashes else row)
    return found


def settle_drive_files(index: dict[str, Any]) -> None:
    """After the workers ended (xdist ends them at session finish): each drive's verdict, as the controller gave it,
    goes into the drive's results file where that file says otherwise or nothing (its worker crashed, or was stopped
    by Ctrl-C before its verdict reached the controller), so that every drive's file says what the gate says."""
    from ckptqual.report.record import RunRecord

    for row in index["drives"].values():
        path = Path(row["results"]) if row["results"] else None
        if path is None or not path.is_file():
            continue
        record = RunRecord.reopen(path)
        if record.data.get("verdict") != row["verdict"]:
            record.data["verdict"] = row["verdict"]
            record.save()


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem: str, report: pytest.TestReport, sched: Any) -> None:
    """Notes the drive whose worker died while running `crashitem` (killed, out of memory): xdist runs the drive's
    remaining tests on a new worker, which fails them as not run (see crashed_before): no verdict of it can stand."""
    label = drive_of(crashitem, sched.config)
    if label is None:
        return
    worker = report.node.gateway.id  # xdist's crash report carries the worker that died
    target = drive_run(sched.config, label).settings.target
    session_of(sched.config).crashes[label] = (
        f"worker {worker} crashed while running {crashitem} (its process died: killed, or out of memory; see dmesg), "
        f"so the drive was not qualified in one run; remove what it left with `ckptqual clean {target}` and qualify "
        f"the drive again"
    )


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """Tells each worker as it starts (one replacing a crashed worker too) whose drives' workers crashed."""
    node.workerinput[_CRASHED_KEY] = dict(session_of(node.config).crashes)


def crashed_before(config: pytest.Config, label: str | None) -> str | None:
    """Why this worker must not qualify the drive again: a worker before it died in one of the drive's tests, and a
    new qualification would overwrite the results file that holds what the dead worker measured."""
    return getattr(config, "workerinput", {}).get(_CRASHED_KEY, {}).get(label)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """Keeps what a worker sent back about its drives."""
    output = getattr(node, "workeroutput", None) or {}
    held = session_of(node.config)
    held.rows.update(output.get(_ROWS_KEY, {}))
    held.selected.update(output.get(_SELECTED_KEY, []))


@pytest.hookimpl(optionalhook=True, tryfirst=True)  # before xdist's own count
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """`-n auto` for the qualification of several drives: one worker per drive (else xdist's own count)."""
    if not names_the_qualification(config):
        return None
    try:
        targets = drive_targets(config.getoption("target"), config.getoption("drive"))
    except SettingsError:
        return None  # refused with its message when the run is configured
    return len(targets) if len(targets) > 1 else None


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """With several drives, whatever --dist says: each drive's tests are one work unit of one worker."""
    if names_the_qualification(config) and len(drive_runs(config)) > 1:
        from ckptqual.pytest_plugin.scheduling import DriveScheduling  # xdist's schedulers load only for this

        return DriveScheduling(config, log)
    return None
