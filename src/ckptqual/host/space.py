"""The run's room on the target: it declares what it writes, removes only that (within a deadline), and keeps a
true account of what it had to leave and why.

Every change the main process makes to the target goes through `TargetOps`, so that a drive that stops
answering fails the operation on time; after that, the run touches the target no more and says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ckptqual.faults import RunError
from ckptqual.host.fsops import TargetOps, make_listed_directory
from ckptqual.host.target import Removal, Target, remove_owned


class RunSpace:
    """A locked target, its run directory, and the helper that changes it."""

    def __init__(self, target: Target, timeout_s: float) -> None:
        self.target = target
        self.ops = TargetOps(timeout_s)
        self.unresponsive: str | None = None
        self.left: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.cleanup: dict[str, Any] | None = None

    @property
    def run_dir(self) -> Path:
        return self.target.run_dir

    def declare(self, pattern: str, files: list[str]) -> None:
        """Records files the run is about to write, relative to each directory matching `pattern`."""
        self.target.declare(pattern, files)

    def own(self, directory: Path, files: list[str]) -> None:
        """Makes `directory` and lists in it the files the run is about to write there (for layouts drawn live)."""
        target = self.target
        self._call(f"preparing {directory}", make_listed_directory, target.run_dir, target.identity, directory, files)

    def remove(self, directory: Path, what: str) -> None:
        """Removes the files the run wrote in `directory` (and the directory, once empty); anything else found
        there is left and recorded. Raises RunError when the removal fails or the drive does not answer."""
        removal: Removal = self._call(what, remove_owned, self.run_dir, directory, False, self.target.identity)
        self.left.extend(left for left in removal.to_dict()["left"] if left not in self.left)
        if removal.errors:
            error = RunError(f"{what}: {removal.errors[0]}", "io-error")
            self.errors.append(str(error))
            raise error

    def _call(self, what: str, function: Any, *args: Any) -> Any:
        if self.cleanup is not None:
            raise RunError(f"{what}: not done, the run directory was already removed or left", "stopped")
        if self.unresponsive:
            raise RunError(f"{what}: not done, the drive stopped responding earlier ({self.unresponsive})", "stopped")
        try:
            return self.ops.call(what, function, *args)
        except RunError as error:
            if error.fault == "unresponsive":
                self.unresponsive = str(error)
            self.errors.append(str(error))
            raise

    def close(self) -> dict[str, Any]:
        """Removes everything the run wrote (unless kept), releases the target, and returns a true account:
        `removed` only when nothing of the run is left."""
        if self.cleanup is not None:
            return self.cleanup
        if self.unresponsive:
            self.target.abandon()
            cleanup = self._not_removed(f"not attempted: {self.unresponsive}", [])
        else:
            try:
                removal = self.target.cleanup(self)
                cleanup = {**removal.to_dict(), "removed": removal.complete} if removal else {"removed": False}
            except RunError as error:
                cleanup = self._not_removed(str(error), [str(error)])
        self.left.extend(left for left in cleanup.pop("left", []) if left not in self.left)
        if self.target.keep:
            cleanup["why"] = "kept with --keep"
        elif not cleanup["removed"]:
            cleanup["fix"] = f"ckptqual clean {self.target.path}"
        self.ops.close()
        self.cleanup = cleanup
        return cleanup

    def _not_removed(self, why: str, errors: list[str]) -> dict[str, Any]:
        """The account of a cleanup that did not happen: the whole run directory is left, and why."""
        return {"removed": False, "why": why, "errors": errors, "left": [{"path": self.run_dir.name, "why": why}]}

    def call(self, what: str, function: Any, *args: Any) -> Any:
        """The runner `Target.cleanup` changes the drive through: the helper, with its deadline."""
        return self._call(what, function, *args)
