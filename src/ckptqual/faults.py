"""What can stop a part of a run, and whose fault it was: the target's (the drive failed it) or the run's own.

Lower rooms raise `RunError` with a `fault`; only the verdict layer turns a fault into an outcome word.
"""

from __future__ import annotations

import errno as errno_codes
import os

# The target failed the work: an I/O error, no space, data that came back wrong, no answer in time.
TARGET_FAULTS = ("io-error", "out-of-space", "integrity", "unresponsive")
# The run could not do the work for a reason of its own: a crash, a stopped worker, an earlier failure, or an entry
# planted in the run directory (a symlink, a FIFO) that the suite refused to follow.
RUN_FAULTS = ("crash", "stopped", "not-run", "planted")


class RunError(RuntimeError):
    """A part of the run could not be done; the message is one line naming what, where and why."""

    def __init__(self, message: str, fault: str = "crash", errno: int | None = None) -> None:
        if fault not in TARGET_FAULTS + RUN_FAULTS:
            raise ValueError(f"unknown fault {fault!r}; use one of {', '.join(TARGET_FAULTS + RUN_FAULTS)}")
        super().__init__(message)
        self.fault, self.errno = fault, errno

    @property
    def target_at_fault(self) -> bool:
        return self.fault in TARGET_FAULTS

    def __reduce__(self) -> tuple:
        return type(self), (str(self), self.fault, self.errno)


def os_error_line(error: OSError, operation: str) -> str:
    """`operation path: [Errno N] text`, the one line every I/O error on the target is reported as."""
    named = error.filename is not None and str(error.filename) not in operation
    where = f" {error.filename}" if named else ""
    code = errno_codes.errorcode.get(error.errno, str(error.errno)) if error.errno is not None else "?"
    text = error.strerror or os.strerror(error.errno or 0)
    return f"{operation}{where}: [Errno {error.errno} {code}] {text}"


# Errors that say the target failed the work (the device, its filesystem or its server), as opposed to errors of the
# run's own making (a plan naming a file as a directory, a permission changed under it): those are crashes.
_TARGET_ERRNOS = frozenset(
    getattr(errno_codes, name)
    for name in ("EIO", "EROFS", "ENXIO", "ENODEV", "ETIMEDOUT", "EREMOTEIO", "EUCLEAN", "ESTALE", "ENOLINK", "ENOENT")
    if hasattr(errno_codes, name)
)


def fault_of_errno(number: int | None) -> str:
    """The fault an errno stands for: no space (or inodes, or quota), another failure of the target, or the run's
    own error."""
    if number in (errno_codes.ENOSPC, errno_codes.EDQUOT):
        return "out-of-space"
    return "io-error" if number in _TARGET_ERRNOS else "crash"


def on_path(error: OSError, path: object) -> OSError:
    """`error` naming the file it happened on, where the call that raised it (a write on an open file) did not."""
    return error if error.filename is not None else OSError(error.errno, error.strerror, str(path))
