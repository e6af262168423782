"""Where a run's outputs go (--results, --report-dir, pytest's --junitxml), checked before any I/O: each must be
writable, outside every target (which holds only what ckptqual makes), and apart from the others and the inputs."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ckptqual.config.values import SettingsError
from ckptqual.faults import os_error_line

if TYPE_CHECKING:
    from ckptqual.config.run_settings import RunSettings


def check_results(path: Path, target: Path | None) -> None:
    """The results file's place must be writable and outside the target."""
    path = path.absolute()
    if path.is_dir():
        raise SettingsError(f"--results {path}: is a directory; give a file path, e.g. --results {path}/results.json")
    _outside(f"--results {path}", path, target, "write the results elsewhere, e.g. --results ./results.json")
    parent = path.parent
    if not parent.is_dir():
        raise SettingsError(f"--results {path}: the directory {parent} does not exist; create it first")
    if os.statvfs(parent).f_flag & os.ST_RDONLY:
        raise SettingsError(f"--results {path}: {parent} is on a read-only filesystem; write the results elsewhere")
    if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise SettingsError(f"--results {path}: not writable by this user; write the results elsewhere")
    _probe(f"--results {path}", parent, "write the results elsewhere")


def check_report_dir(directory: Path, target: Path | None) -> None:
    """The report directory must be (or be creatable as) a directory outside the target in which files can be made."""
    directory = directory.absolute()
    if directory.exists() and not directory.is_dir():
        raise SettingsError(
            f"--report-dir {directory}: is not a directory; give a directory, e.g. --report-dir ./report"
        )
    _outside(f"--report-dir {directory}", directory, target, "write the report elsewhere, e.g. --report-dir ./report")
    existing = next(parent for parent in (directory, *directory.parents) if parent.exists())
    if not os.access(existing, os.W_OK | os.X_OK):
        raise SettingsError(f"--report-dir {directory}: {existing} is not writable by this user; write it elsewhere")
    _probe(f"--report-dir {directory}", existing, "write the report elsewhere")


def check_apart(junitxml: str | os.PathLike[str] | None, runs: Sequence[RunSettings]) -> None:
    """The JUnit XML outside every target and report directory; no results file, JUnit XML or input the same file
    as another (compared after resolving links, and by inode where they exist); no results in a report directory."""
    targets = [run.target for run in runs if run.target is not None]
    reports = [run.report_dir for run in runs if run.report_dir is not None]
    files = [("--results", run.results.absolute()) for run in runs if run.results is not None]
    if junitxml is not None:
        junit = Path(junitxml).absolute()
        for target in targets:
            _outside(f"--junitxml {junit}", junit, target, "write it elsewhere, e.g. --junitxml ./qual.xml")
        files.append(("--junitxml", junit))
    for option, path in files:
        for report in reports:
            if _inside(path, report):
                raise SettingsError(
                    f"{option} {path}: lies inside --report-dir {report}, whose files the report writes; write it "
                    f"beside the report directory"
                )
    inputs = [("the drive file", run.thresholds.path) for run in runs]
    inputs += [("--layout-plan", run.values["layout_plan"]) for run in runs if run.values["layout_plan"] is not None]
    for index, (option, path) in enumerate(files):
        for other, other_path in [*files[index + 1 :], *inputs]:
            if _same_file(path, other_path):
                raise SettingsError(
                    f"{option} {path}: is the same file as {other} {other_path}; give each its own file"
                )


def _outside(what: str, path: Path, target: Path | None, fix: str) -> None:
    if target is not None and _inside(path, target):
        raise SettingsError(
            f"{what}: lies inside the target {target}, which holds only what ckptqual creates and removes; {fix}"
        )


def _inside(path: Path, directory: Path) -> bool:
    return path.resolve().is_relative_to(directory.resolve())


def _same_file(one: Path, other: Path) -> bool:
    if one.resolve() == other.resolve():
        return True
    try:
        return os.path.samefile(one, other)  # hard links: one inode under two names
    except OSError:
        return False


def _probe(what: str, directory: Path, fix: str) -> None:
    """What access() says is not what the filesystem does (root on /proc, a full disk): create and drop a file."""
    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".ckptqual-", suffix=".probe"):
            pass
    except OSError as error:
        raise SettingsError(
            f"{what}: a file cannot be created in {directory} ({os_error_line(error, 'create')}); {fix}"
        ) from None
