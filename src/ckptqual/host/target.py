"""The drive under test as one run holds it: `open_target` checks and locks the target and makes the run's own
directory in it; `Target` declares what the run writes there and, at cleanup, removes exactly that.

Its parts: guard (what may be a target), lock, manifest, removal, leftovers (`ckptqual clean`), identity. Names
other rooms import from here are re-exported (`X as X`).
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack, suppress
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ckptqual.faults import RunError, fault_of_errno
from ckptqual.host import guard
from ckptqual.host.beneath import PlantedEntry, RunTree
from ckptqual.host.guard import LOCK_FILE as LOCK_FILE
from ckptqual.host.guard import RUN_MARKER, RUN_PREFIX, TARGET_MARKER, TargetError
from ckptqual.host.identity import DriveIdentity as DriveIdentity
from ckptqual.host.identity import identify as identify
from ckptqual.host.leftovers import KEPT
from ckptqual.host.leftovers import Cleaning as Cleaning
from ckptqual.host.leftovers import LeftoverRun as LeftoverRun
from ckptqual.host.leftovers import clean_target as clean_target
from ckptqual.host.leftovers import describe_leftovers as describe_leftovers
from ckptqual.host.leftovers import format_age as format_age
from ckptqual.host.leftovers import format_bytes as format_bytes
from ckptqual.host.lock import (
    Lock,
    acquire,
    holder_record,
    in_use_message,
    live_holder,
    nested_problem,
    unlink_lock_file,
)
from ckptqual.host.lock import describe_holder as describe_holder
from ckptqual.host.manifest import add_group, new_manifest, write_json_atomically
from ckptqual.host.manifest import write_file_list as write_file_list
from ckptqual.host.removal import Left, Removal, remove_owned


def _call_here(what: str, function: Callable[..., Any], *args: Any) -> Any:
    return function(*args)


@dataclass
class Target:
    """A checked, locked target and the run directory the suite owns inside it."""

    path: Path
    run_dir: Path
    lock: Lock = field(repr=False)
    manifest: dict[str, Any] = field(repr=False)
    identity: tuple[int, int] = field(repr=False)  # the run directory's (st_dev, st_ino), proving it is the one made
    created_target: bool = False
    created_marker: bool = False
    keep: bool = False
    removal: Removal | None = field(default=None, init=False)
    closed: bool = field(default=False, init=False)

    @property
    def removed(self) -> bool:
        """Whether cleanup removed everything the run wrote (never true while anything is left)."""
        return self.removal is not None and self.removal.complete

    def declare(self, pattern: str, files: Iterable[str], listed: bool = False) -> None:
        """Records, before they are written, the files the run writes in each directory matching the glob `pattern`
        (both relative to the run directory); listed: such directories name more files (see write_file_list)."""
        if self.closed:
            raise TargetError(f"declare {pattern!r}: the run in {self.run_dir} was already cleaned up")
        add_group(self.manifest, pattern, files, listed)
        try:
            write_manifest(self.run_dir, self.identity, self.manifest)
        except OSError as error:
            failure = guard.failure("write", self.run_dir / RUN_MARKER, error)
            fault = fault_of_errno(error.errno)
            if isinstance(error, PlantedEntry) or fault == "crash":
                raise failure from error
            raise RunError(str(failure), fault, error.errno) from error  # the drive failed it (ENOSPC, EIO): one line

    def cleanup(self, ops: Any = None) -> Removal | None:
        """Removes what the run declared (unless kept) and a target marker it made, releases the target, removes a
        temporary target it made; keeps and returns the Removal. With `ops`, each change runs through `ops.call(what,
        function, *args)` (a helper process with a deadline); what that raises propagates once the lock is dropped."""
        if self.closed:
            return self.removal
        self.closed = True
        call = ops.call if ops is not None else _call_here
        errors: list[str | None] = []
        try:
            if self.keep:
                kept = call(f"marking {self.run_dir} kept", _mark_kept, self.run_dir, self.identity, self.manifest)
                self.removal = kept
            else:
                what = f"removing what the run wrote in {self.run_dir}"
                self.removal = call(what, remove_owned, self.run_dir, None, False, self.identity)
            if self.created_marker and not self.keep:  # under the lock: the next run may need the marker
                errors.append(call("removing the target marker", guard.remove_marker, self.path))
            errors.append(call("releasing the target", unlink_lock_file, self.lock.path))
        finally:
            self.lock.close()
        if self.created_target and not self.keep:
            errors.append(call("removing the temporary target", _remove_temporary_target, self.path))
        if any(errors) and self.removal is not None:
            self.removal = replace(self.removal, errors=(*self.removal.errors, *filter(None, errors)))
        return self.removal

    def abandon(self) -> None:
        """Gives the target up without touching the drive (it stopped responding): drops the lock and leaves every
        file, the lock file included, for `ckptqual clean`."""
        self.closed = True
        self.lock.close()


def write_manifest(run_dir: Path, identity: tuple[int, int], manifest: dict[str, Any]) -> None:
    """Writes the manifest of the run directory `run_dir` (refused if it is not the one with `identity`)."""
    with RunTree(run_dir, identity) as tree:
        write_json_atomically(tree.fd, run_dir / RUN_MARKER, manifest)


def _mark_kept(run_dir: Path, identity: tuple[int, int], manifest: dict[str, Any]) -> Removal:
    """Marks a run directory as kept (so leftovers name it so) and reports it as left."""
    kept = Removal(str(run_dir), left=(Left(run_dir.name, KEPT),))
    try:
        write_manifest(run_dir, identity, {**manifest, "kept": True})
    except OSError as error:
        return replace(kept, errors=(guard.error_line("write", run_dir / RUN_MARKER, error),))
    return kept


def _remove_temporary_target(path: Path) -> str | None:
    """Removes the temporary target this process made, if empty; an error as one line, else None."""
    try:
        path.rmdir()
    except OSError as error:
        if error.errno != errno.ENOTEMPTY:  # what is left in it is reported already
            return guard.error_line("rmdir", path, error)
    return None


def check_target(path: Path) -> list[str]:
    """Why `path` cannot be a target (empty list: it can). Reads only; a run's leftovers are accepted."""
    if (problem := _unlocked_problem(path)) is not None:
        return [problem]
    real = path.resolve()
    foreign = guard.foreign_entries(real)
    if foreign and (holder := live_holder(real)) is not None:
        return [in_use_message(real, holder)]  # a run started meanwhile: its directory is not marked yet
    return [guard.foreign_message(real, foreign)] if foreign else []


def _unlocked_problem(path: Path) -> str | None:
    """Why `path` can be no target at all, or the run that holds it now."""
    if (problem := guard.usable_problem(path)) is not None:
        return problem
    holder = live_holder(path.resolve())
    return nested_problem(path) if holder is None else in_use_message(path.resolve(), holder)


def _quietly(function: Callable[[Path], Any], path: Path) -> None:
    """Undoes a step of a failed start, on a path that is failing anyway."""
    with suppress(OSError):
        function(path)


def open_target(path: Path | None, keep: bool = False) -> Target:
    """Checks and locks the target (or makes a temporary one) and creates this run's own directory in it. A write the
    target's filesystem fails (no space, an I/O error) raises a one-line RunError of that fault, everything undone."""
    try:
        return _open_target(path, keep)
    except TargetError as refused:
        raise _drive_fault(refused) from refused.__cause__


def _drive_fault(refused: TargetError) -> Exception:
    """`refused` as a RunError of the target's fault where the filesystem failed one of setup's writes (ENOSPC,
    EIO: the drive under test did); any other refusal as it is."""
    cause = refused.__cause__
    if not isinstance(cause, OSError) or isinstance(cause, PlantedEntry):
        return refused
    fault = fault_of_errno(cause.errno)
    return refused if fault == "crash" else RunError(str(refused), fault, cause.errno)


def _open_target(path: Path | None, keep: bool) -> Target:
    """open_target's steps, each undone if a later one fails."""
    with ExitStack() as undo:
        created_target = path is None
        if path is None:
            path = Path(tempfile.mkdtemp(prefix="ckptqual-target-"))
            undo.callback(_quietly, os.rmdir, path)
        if (problem := _unlocked_problem(path)) is not None:
            raise TargetError(problem)
        path = path.resolve()
        foreign = guard.foreign_entries(path)
        if any(not name.startswith(RUN_PREFIX) for name in foreign):  # refused before anything is written
            raise TargetError(guard.foreign_message(path, foreign))
        run_dir = path / f"{RUN_PREFIX}{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{secrets.token_hex(3)}"
        held = acquire(path, holder_record(run_dir.name, "ckptqual run"))
        undo.callback(held.release)
        # An unmarked run directory may be another run's, being made or removed; under the lock it is not.
        if foreign := guard.foreign_entries(path):
            raise TargetError(guard.foreign_message(path, foreign))
        created_marker = guard.ensure_marker(path)
        if created_marker:
            undo.callback(_quietly, os.unlink, path / TARGET_MARKER)
        manifest, identity = _make_run_dir(run_dir, held, undo)
        undo.pop_all()
    return Target(path, run_dir, held, manifest, identity, created_target, created_marker, keep)


def _make_run_dir(run_dir: Path, held: Lock, undo: ExitStack) -> tuple[dict[str, Any], tuple[int, int]]:
    """Creates the run directory and its manifest (both undone by `undo` on a later failure); returns the manifest
    and the directory's identity."""
    try:
        os.mkdir(run_dir, 0o700)
    except OSError as error:
        raise guard.failure("create", run_dir, error) from error
    undo.callback(_quietly, os.rmdir, run_dir)
    manifest = new_manifest(held.holder)
    try:
        with RunTree(run_dir) as tree:
            write_json_atomically(tree.fd, run_dir / RUN_MARKER, manifest)
            return manifest, tree.identity
    except OSError as error:
        raise guard.failure("create", run_dir / RUN_MARKER, error) from error


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m ckptqual.host.target remove RUN_DIR [--only DIR]`: prints the Removal as JSON; 0 when complete."""
    parser = argparse.ArgumentParser(prog="python -m ckptqual.host.target", description=main.__doc__)
    remove = parser.add_subparsers(dest="command", required=True).add_parser("remove", help="remove what is declared")
    remove.add_argument("run_dir", type=Path, help="a ckptqual-run-* directory")
    remove.add_argument("--only", type=Path, help="only this directory of the run (e.g. one checkpoint's)")
    args = parser.parse_args(argv)
    removal = remove_owned(args.run_dir, args.only)
    print(json.dumps(removal.to_dict()))
    return 0 if removal.complete else 1


if __name__ == "__main__":
    sys.exit(main())
