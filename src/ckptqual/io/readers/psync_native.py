"""The native psync loop of the POSIX engine (psync_cell.c): building it, and loading it only where it fits its source.

The library is optional. The build hook (hatch_build.py, at install) compiles psync_cell.c beside itself with the
system C compiler, embedding the SHA-256 of the source it compiled; where there is no compiler or the compile
fails, the install goes on without it and the engine reads with its Python loop. `load` refuses a library that is
missing, does not load, or was built from another version of psync_cell.c than the one beside it (a stale build),
and says why, for the engine's settings.

Standard library only, and nothing from ckptqual: the build hook loads this file by its path, before ckptqual or
its dependencies are installed. `python -m ckptqual.io.readers.psync_native` builds the library in place.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("psync_cell.c")
LIBRARY = Path(__file__).with_name("libpsync_cell.so")
CFLAGS = ("-O2", "-shared", "-fPIC", "-pthread", "-Wall")
REBUILD = "pip install -e . in the ckptqual checkout, or python -m ckptqual.io.readers.psync_native, rebuilds it"

# What stopped a cell (psync_result.stopped_by in psync_cell.c).
READ_FAILED, SHORT_READ, CHECK_FAILED, STOP_ASKED = 1, 2, 3, 4
BATCH_DONE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int32, ctypes.c_int64, ctypes.c_int64)  # (job, first, end)
INT32_P, INT64_P = ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_int64)


class PsyncResult(ctypes.Structure):
    """struct psync_result of psync_cell.c (all int64, so no padding)."""

    _fields_ = [
        (name, ctypes.c_int64)
        for name in ("started_ns", "finished_ns", "verified", "stopped_by", "job", "offset", "error", "got")
    ]


def source_digest(source: Path = SOURCE) -> str:
    """The SHA-256 of the C source, as the build embeds it in the library."""
    return hashlib.sha256(source.read_bytes()).hexdigest()


def compiler() -> list[str] | None:
    """The C compiler: $CC (with its arguments), else cc, else gcc; None where there is none."""
    if os.environ.get("CC"):
        return shlex.split(os.environ["CC"])
    found = shutil.which("cc") or shutil.which("gcc")
    return [found] if found else None


def build(output: Path = LIBRARY, source: Path = SOURCE, digest: str | None = None) -> str | None:
    """Compiles `source` into `output` (replaced only by a complete build); returns why it could not, or None.

    `digest` is the source hash to embed (default: `source`'s own; tests embed another to make a stale build)."""
    command = compiler()
    if command is None:
        return "no C compiler (cc or gcc, or $CC) to build the native psync loop"
    digest = digest or source_digest(source)
    output.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(prefix=f".{output.name}.", dir=output.parent)
    os.close(fd)
    try:
        done = subprocess.run(
            [*command, *CFLAGS, f'-DCKPTQUAL_PSYNC_SOURCE="{digest}"', "-o", partial, str(source)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode != 0:
            said = " / ".join((done.stderr + done.stdout).strip().splitlines()[-3:])
            failed = f"{shlex.join(command)} failed to compile {source.name} (exit {done.returncode})"
            return f"{failed}: {said}" if said else failed
        os.chmod(partial, 0o755)
        os.replace(partial, output)  # a process that loaded the old library keeps its copy
        return None
    except OSError as error:
        return f"{shlex.join(command)} could not compile {source.name}: {error}"
    finally:
        Path(partial).unlink(missing_ok=True)


class Loaded:
    """The library, checked against its source, with ckptqual_psync_cell's argument types set."""

    def __init__(self, library: ctypes.CDLL, path: Path) -> None:
        self.path = path
        self.cell = library.ckptqual_psync_cell
        self.cell.restype = ctypes.c_int
        self.cell.argtypes = [
            *(INT32_P, INT64_P, INT64_P, ctypes.c_int32, ctypes.c_int64, ctypes.c_int32, ctypes.c_int64),
            *(ctypes.c_void_p, ctypes.c_int32, INT64_P, INT64_P, INT64_P, BATCH_DONE, ctypes.POINTER(ctypes.c_int32)),
            ctypes.POINTER(PsyncResult),
        ]


def load_from(library: Path, source: Path) -> tuple[Loaded | None, str | None]:
    """The library at `library` if it was built from `source` as it is now; else None and why not."""
    if not library.is_file():
        return None, f"the native psync loop is not built ({library} is missing: no C compiler at install?); {REBUILD}"
    if not source.is_file():
        return None, f"{source} is missing, so {library.name} cannot be checked against its source"
    try:
        loaded = ctypes.CDLL(str(library))
        function = loaded.ckptqual_psync_source
        function.restype = ctypes.c_char_p
        embedded = function().decode()
    except (OSError, AttributeError) as error:
        return None, f"{library} does not load as the native psync loop: {error}"
    digest = source_digest(source)
    if embedded != digest:
        return None, (
            f"{library} was built from another version of {source.name} (sha256 {embedded[:12]}, the file is "
            f"{digest[:12]} now): a stale build is not used; {REBUILD}"
        )
    return Loaded(loaded, library), None


@functools.cache
def load() -> tuple[Loaded | None, str | None]:
    """The installed library beside this file, once per process: (library, None) or (None, why not)."""
    return load_from(LIBRARY, SOURCE)


if __name__ == "__main__":
    problem = build()
    print(problem or f"built {LIBRARY}", file=sys.stderr if problem else sys.stdout)
    sys.exit(1 if problem else 0)
