"""The secret of one run over several nodes: the controller makes it and writes it to a file only its owner can read
(`--secret-file`), which every node's workers read (`ckptqual node --secret-file`); it is never on a command line or
in the store, and every message of the run is signed with it (runs.wire)."""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path

from ckptqual.faults import RunError
from ckptqual.output_file import write_file

_SECRET_BYTES = 32
_MOST_BYTES = 256
_FIX = "give `ckptqual node` the --secret-file the controller was given (docs/many-nodes.md)"


class SecretError(RunError):
    """The secret file cannot be written or is not one the controller wrote for this user."""


def write_secret(path: Path) -> tuple[str, bytes]:
    """A fresh (run id, secret), written to `path` with mode 0600 (output_file: made beside it, renamed over nothing
    or a regular file of this user only), so that no reader ever sees a partial or an earlier file's content under a
    new run."""
    run_id, secret = secrets.token_hex(8), secrets.token_bytes(_SECRET_BYTES)
    try:
        write_file(path, f"{run_id} {secret.hex()}\n".encode(), mode=0o600)
    except OSError as error:
        raise SecretError(
            f"--secret-file {path}: cannot write it: {error.strerror}; give a path in a directory of yours that every "
            f"node sees, outside the target"
        ) from None
    return run_id, secret


def read_secret(path: Path) -> tuple[str, bytes]:
    """(run id, secret) of the file `path`, which must be a regular file, not a symlink, owned by this process's user
    and neither readable nor writable by anyone else; raises SecretError naming what is wrong."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as error:
        what = "is a symlink" if error.errno == errno.ELOOP else f"cannot be read: {error.strerror}"
        raise SecretError(f"--secret-file {path} {what}; {_FIX}") from None
    try:
        found = os.fstat(fd)
        problem = _problem(found)
        data = b"" if problem else os.read(fd, _MOST_BYTES)
    finally:
        os.close(fd)
    if problem:
        raise SecretError(f"--secret-file {path} {problem}; {_FIX}")
    fields = data.decode("ascii", errors="replace").split()
    if len(fields) != 2 or not fields[0].isalnum() or not _is_hex(fields[1], _SECRET_BYTES):
        raise SecretError(
            f"--secret-file {path} does not hold a run id and a secret as the controller writes them; {_FIX}"
        )
    return fields[0], bytes.fromhex(fields[1])


def _problem(found: os.stat_result) -> str | None:
    if not stat.S_ISREG(found.st_mode):
        return "is not a regular file"
    if found.st_uid != os.geteuid():
        return f"is owned by uid {found.st_uid}, not by this worker's uid {os.geteuid()}"
    if found.st_mode & 0o077:
        return f"has mode {stat.S_IMODE(found.st_mode):04o}: others may read or change it (the controller writes 0600)"
    return None


def _is_hex(text: str, nbytes: int) -> bool:
    return len(text) == 2 * nbytes and all(c in "0123456789abcdef" for c in text)
