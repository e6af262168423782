"""Where a run's outputs go (--results, --report-dir and its files, pytest's --junitxml, --secret-file, the
pytest-benchmark storage), checked before any I/O: nothing there but a regular file of this user (a directory for
the report), never a link, device, FIFO or socket; outside every target (by path and by filesystem, so that a bind
mount does not hide it), which holds only what ckptqual makes; in a directory where a file can be made; apart from
the others and from the run's inputs (compared by device and inode)."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ckptqual.config.values import SettingsError
from ckptqual.faults import os_error_line
from ckptqual.host.aliases import ancestor_keys, key
from ckptqual.output_file import entry_problem
from ckptqual.plan.workloads import WORKLOAD_DIR
from ckptqual.resources import resolve

if TYPE_CHECKING:  # the checks of a path need none of the drive file's modules
    from ckptqual.config.drive_file import DriveFile

REPORT_PAGE = "report.html"  # the files a report directory receives: the page and its figures
FIGURE_SUFFIX = ".png"
_FILE_FIX = "give a new path or a regular file of yours"
JUNIT_FIX = "write it elsewhere, e.g. --junitxml ./qual.xml"  # pytest makes the directories --junitxml names


class RunFiles(Protocol):
    """What the checks of a run's outputs read of its settings (config.run_settings.RunSettings holds it)."""

    @property
    def target(self) -> Path | None: ...
    @property
    def results(self) -> Path | None: ...
    @property
    def report_dir(self) -> Path | None: ...
    @property
    def secret_file(self) -> Path | None: ...
    @property
    def thresholds(self) -> DriveFile: ...
    @property
    def workload_name(self) -> str: ...
    @property
    def layout_plan_file(self) -> Path | None: ...


def check_results(path: Path, target: Path | None) -> None:
    """The results file's place: see check_file."""
    check_file("--results", path, [target] if target else [], "write the results elsewhere, e.g. --results r.json")


def check_secret(path: Path, target: Path | None) -> None:
    """The secret file's place (the controller writes it): see check_file."""
    check_file("--secret-file", path, [target] if target else [], "give a path in a directory of yours")


def check_file(option: str, path: Path, targets: Sequence[Path], fix: str, make_parent: bool = False) -> None:
    """An output file: its directory there (or, where `make_parent`, its nearest existing parent), nothing at `path`
    but a regular file of this user, outside every target, a file creatable beside it (or in that parent). Raises
    SettingsError naming the path and what it is."""
    path = path.absolute()
    what = f"{option} {path}"
    if stat.S_ISDIR(_mode(path, what, fix) or 0):
        raise SettingsError(f"{what}: is a directory; give a file path, e.g. {option} {path}/out")
    if (problem := entry_problem(path)) is not None:
        raise SettingsError(f"{what}: {problem}; {_FILE_FIX}")
    for target in targets:
        _outside(what, path, target, fix)
    parent = path.parent
    if make_parent:
        parent = next(above for above in path.parents if _mode(above, what, fix) is not None)
    mode = _mode(parent, what, fix, follow=True)
    if mode is None:
        raise SettingsError(f"{what}: the directory {parent} does not exist; create it first")
    if not stat.S_ISDIR(mode):
        raise SettingsError(f"{what}: {parent} is not a directory; {fix}")
    _writable(what, parent, fix)


def check_report_dir(directory: Path, target: Path | None, option: str = "--report-dir") -> None:
    """The report directory: see check_directory; and each file the report writes there (its page, its figures)
    nothing but a regular file of this user."""
    directory = check_directory(option, directory, [target] if target else [], "write the report elsewhere")
    for entry in _report_entries(directory):
        if (problem := entry_problem(entry)) is not None:
            raise SettingsError(f"{option} {directory}: {entry} {problem}; remove it, or write the report elsewhere")


def check_directory(option: str, directory: Path, targets: Sequence[Path], fix: str, writing: bool = True) -> Path:
    """An output directory: a directory of this user (not a link) or not there yet, outside every target, and
    (`writing`) a file creatable in it or in its nearest existing parent; returns it absolute."""
    directory = directory.absolute()
    what = f"{option} {directory}"
    mode = _mode(directory, what, fix)
    if mode is not None and not stat.S_ISDIR(mode) and not stat.S_ISLNK(mode):
        raise SettingsError(f"{what}: {entry_problem(directory) or 'is not a directory'}; give a directory")
    if (problem := entry_problem(directory, directory_ok=True)) is not None:
        raise SettingsError(f"{what}: {problem}; give a directory of yours")
    for target in targets:
        _outside(what, directory, target, fix)
    if writing:
        existing = next(parent for parent in (directory, *directory.parents) if _mode(parent, what, fix) is not None)
        _writable(what, existing, fix)
    return directory


def check_apart(
    junitxml: str | os.PathLike[str] | None,
    runs: Sequence[RunFiles],
    storage: Path | None = None,
    saving: bool = False,
) -> None:
    """The JUnit XML and the benchmark storage (writable where the run `saving` saves into it) outside every target;
    no two output files (results, JUnit XML, secret file) the same, nor one of them or of the report's files an input
    of the run (drive file, workload file, layout plan), compared after resolving links and by inode; no results or
    JUnit XML in a report directory."""
    targets = [run.target for run in runs if run.target is not None]
    reports = [run.report_dir for run in runs if run.report_dir is not None]
    files = [("--results", run.results.absolute()) for run in runs if run.results is not None]
    if junitxml is not None:
        junit = Path(junitxml).absolute()
        check_file("--junitxml", junit, targets, JUNIT_FIX, make_parent=True)
        files.append(("--junitxml", junit))
    if storage is not None:
        check_directory("--benchmark-storage", storage, targets, "keep it elsewhere, e.g. file://./.benchmarks", saving)
    secret = runs[0].secret_file if runs else None  # one for the whole run
    files += [("--secret-file", secret.absolute())] if secret is not None else []
    for option, path in files:
        for report in reports:
            if _inside(path, report):
                raise SettingsError(
                    f"{option} {path}: lies inside --report-dir {report}, whose files the report writes; write it "
                    f"beside the report directory"
                )
    inputs = list(dict.fromkeys(_inputs(runs)))
    for index, (option, path) in enumerate(files):
        for other, other_path in [*files[index + 1 :], *inputs]:
            if _same_file(path, other_path):
                raise SettingsError(
                    f"{option} {path}: is the same file as {other} {other_path}; give each its own file"
                )
    for report in reports:
        check_report_inputs(report, inputs)


def check_report_inputs(directory: Path, inputs: Sequence[tuple[str, Path]], option: str = "--report-dir") -> None:
    """No file the report writes in `directory` one of `inputs` ((what, path)), compared by inode."""
    for entry in _report_entries(directory.absolute()):
        for other, other_path in inputs:
            if _same_file(entry, other_path):
                raise SettingsError(
                    f"{option} {directory}: the report would replace {entry}, which is {other} {other_path}; "
                    f"give the report another directory"
                )


def _inputs(runs: Sequence[RunFiles]) -> Iterator[tuple[str, Path]]:
    """The files the run reads: each drive file, workload file and layout plan."""
    for run in runs:
        yield "the drive file", run.thresholds.path
        try:  # a shipped workload's name, or a path; the settings resolved it already
            workload = resolve(run.workload_name, WORKLOAD_DIR, "workload")
        except (LookupError, OSError):
            workload = None
        if workload is not None:
            yield "--workload", workload
        if run.layout_plan_file is not None:
            yield "--layout-plan", run.layout_plan_file


def _report_entries(directory: Path) -> list[Path]:
    """What stands in `directory` under the names a report writes (its page, any figure)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return [directory / name for name in sorted(names) if name == REPORT_PAGE or name.endswith(FIGURE_SUFFIX)]


def _mode(path: Path, what: str, fix: str, follow: bool = False) -> int | None:
    """`path`'s st_mode (a last link followed only where `follow`), None where nothing is there; one that cannot be
    examined (a directory this user may not search) is refused."""
    try:
        return os.stat(path, follow_symlinks=follow).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as error:
        named = "" if what.endswith(f" {path}") else f"{path} "
        raise SettingsError(f"{what}: {named}cannot be examined by this user ({error.strerror}); {fix}") from None


def _writable(what: str, directory: Path, fix: str) -> None:
    if os.statvfs(directory).f_flag & os.ST_RDONLY:
        raise SettingsError(f"{what}: {directory} is on a read-only filesystem; {fix}")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise SettingsError(f"{what}: {directory} is not writable by this user; {fix}")
    _probe(what, directory, fix)


def _outside(what: str, path: Path, target: Path, fix: str) -> None:
    """Refuses `path` inside `target`: by path, or by filesystem (the target among its parents as any mount shows
    them)."""
    inside = _inside(path, target)
    if not inside:
        try:
            inside = key(target) in ancestor_keys(path)
        except OSError:
            inside = False
    if inside:
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
