"""What runs that did not finish (or were kept) left on a target, and `ckptqual clean`, which removes it."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptqual.host import guard, lock
from ckptqual.host.beneath import RunTree
from ckptqual.host.guard import LOCK_FILE, RUN_MARKER, RUN_PREFIX, TARGET_MARKER
from ckptqual.host.manifest import read_manifest
from ckptqual.host.removal import Removal, remove_owned

KEPT = "kept with --keep"


def format_bytes(size_bytes: int) -> str:
    """'1.31 GB' (1e9), '4.10 MB' (1e6), '12.29 kB' (1e3) or '12 bytes'."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size_bytes >= scale:
            return f"{size_bytes / scale:,.2f} {unit}"
    return f"{size_bytes} bytes"


def format_age(age_s: float) -> str:
    """'45 s', '12 min', '2 h' or '3 d'."""
    for unit, scale, below in (("s", 1, 120), ("min", 60, 7_200), ("h", 3_600, 172_800)):
        if age_s < below:
            return f"{int(age_s // scale)} {unit}"
    return f"{int(age_s // 86_400)} d"


@dataclass(frozen=True)
class LeftoverRun:
    """A marked run directory no live run holds: a run that died (or was kept), with what it left."""

    path: Path
    size_bytes: int  # allocated on disk (st_blocks): what `ckptqual clean` would remove
    age_s: float
    pid: int | None
    host: str | None
    kept: bool


def _leftover(run_dir: Path, now_s: float) -> LeftoverRun:
    try:
        with RunTree(run_dir) as tree:
            manifest = read_manifest(RUN_MARKER, tree.fd)
            written_s = tree.lstat(run_dir / RUN_MARKER).st_mtime
    except (OSError, ValueError):
        manifest, written_s = {}, now_s
    age_s = max(0.0, now_s - (manifest.get("started_unix") or written_s))
    size_bytes = remove_owned(run_dir, dry_run=True).removed_bytes
    return LeftoverRun(
        run_dir, size_bytes, age_s, manifest.get("pid"), manifest.get("host"), bool(manifest.get("kept"))
    )


def leftover_runs(target: Path) -> list[LeftoverRun]:
    """The marked run directories in `target` that no live run holds, oldest name first."""
    target = target.resolve()
    live = (lock.live_holder(target) or {}).get("run_dir")
    now_s = time.time()
    return [
        _leftover(entry, now_s) for entry in sorted(target.iterdir()) if entry.name != live and guard.is_run_dir(entry)
    ]


def describe_leftovers(target: Path) -> str | None:
    """One line naming what earlier runs left on `target` and the command that removes it; None if nothing."""
    runs = leftover_runs(target)
    if not runs:
        return None
    shown = "; ".join(
        f"{run.path.name}, {format_bytes(run.size_bytes)}, {format_age(run.age_s)} old" for run in runs[:3]
    )
    more, plural = "; ..." if len(runs) > 3 else "", len(runs) > 1
    return (
        f"the target holds {format_bytes(sum(run.size_bytes for run in runs))} left by {len(runs)} earlier "
        f"run{'s' if plural else ''} {_how_runs_ended(runs)} ({shown}{more}); remove {'them' if plural else 'it'} "
        f"with: ckptqual clean {target.resolve()}"
    )


def _how_runs_ended(runs: Sequence[LeftoverRun]) -> str:
    kept = sum(run.kept for run in runs)
    if kept == 0:
        return "that did not finish"
    return KEPT if kept == len(runs) else f"({len(runs) - kept} did not finish, {kept} {KEPT})"


@dataclass(frozen=True)
class Cleaning:
    """What `clean_target` did (or would do, in a dry run) to a target."""

    target: Path
    runs: tuple[tuple[LeftoverRun, Removal], ...]
    stale_lock: dict[str, Any] | None  # the record of a lock file no live run held, removed
    marker_removed: bool
    errors: tuple[str, ...]
    dry_run: bool

    @property
    def complete(self) -> bool:
        """Everything of ckptqual's is gone (would be) and nothing was left."""
        return not self.errors and all(removal.complete for _, removal in self.runs)


class NothingToClean(guard.TargetError):
    """The target holds nothing of ckptqual's: nothing to do, not a usage error."""


def _clean_problem(path: Path, dry_run: bool) -> str | None:
    """Why `ckptqual clean` refuses `path`; NothingToClean when it is usable but holds nothing of ckptqual's."""
    if (problem := guard.usable_problem(path, writing=not dry_run)) is not None:
        return problem
    real = path.resolve()
    if (holder := lock.live_holder(real)) is not None:
        return lock.in_use_message(real, holder)
    if not (os.path.lexists(real / TARGET_MARKER) or os.path.lexists(real / LOCK_FILE) or guard.has_run_dir(real)):
        raise NothingToClean(
            f"target {real} holds nothing of ckptqual's (no {TARGET_MARKER}, {LOCK_FILE} or marked {RUN_PREFIX}* "
            "directory)"
        )
    return None


def clean_target(path: Path, dry_run: bool = False) -> Cleaning:
    """Removes (dry_run: only counts) every leftover run's declared files, a stale lock file and, when nothing of
    ckptqual's is left, the target marker, holding the target's lock; never an unmarked directory or a foreign
    file. TargetError when `path` is unusable or a live run holds it, NothingToClean when it holds nothing of ours."""
    if (problem := _clean_problem(path, dry_run)) is not None:
        raise guard.TargetError(problem)
    target = path.resolve()
    stale = lock.state(target)
    had_marker = os.path.lexists(target / TARGET_MARKER)
    held = None if dry_run else lock.acquire(target, lock.holder_record(None, "ckptqual clean"))
    try:
        runs = tuple((run, remove_owned(run.path, dry_run=dry_run)) for run in leftover_runs(target))
        run_errors = tuple(error for _, removal in runs for error in removal.errors)
        marker_error = guard.remove_marker(target) if held is not None and had_marker and not run_errors else None
    finally:
        release_error = held.release() if held is not None else None  # which removes the lock file, stale or not
    errors = (*run_errors, *filter(None, (marker_error, release_error)))
    marker_gone = not os.path.lexists(target / TARGET_MARKER) or (dry_run and not errors)
    stale_lock = stale[1] if stale is not None and not stale[0] else None
    return Cleaning(target, runs, stale_lock, had_marker and marker_gone, errors, dry_run)
