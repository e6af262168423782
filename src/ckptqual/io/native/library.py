"""The native kernels (the C files beside this one) as one shared library: building it, and loading it only where it
fits its sources.

The library is optional. The build hook (hatch_build.py, at install) compiles the C files with the system C
compiler into one library beside them, embedding the SHA-256 of the sources it compiled, and records beside it
(RECORD_SUFFIX) the SHA-256 of the library file it wrote and of those sources; where there is no compiler or the
compile fails, the install goes on without it and ckptqual runs its Python code instead. `load` refuses a library
that is missing, is not the file its build recorded, was built from other versions of the sources than those beside
it (a stale build) or does not load, and says why (with the file's SHA-256), for the settings of whatever runs
without it. Both checks come before the library is loaded, so none of its code runs in a refused build; they detect
a stale or damaged build, not a tampered install: whoever can write the library can write this file too.

Standard library only, and nothing from ckptqual: the build hook loads this file by its path, before ckptqual or
its dependencies are installed. `python -m ckptqual.io.native.library` builds the library in place.
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
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).parent
LIBRARY = HERE / "libckptqual_native.so"
CFLAGS = ("-O2", "-shared", "-fPIC", "-pthread", "-Wall")
REBUILD = "pip install -e . in the ckptqual checkout, or python -m ckptqual.io.native.library, rebuilds it"
RECORD_SUFFIX = ".sha256"  # beside the library: "<SHA-256 of the library file> <SHA-256 of its sources>"


def build_record(library: Path) -> Path:
    """Where the build records the library's SHA-256 and its sources'."""
    return library.with_name(library.name + RECORD_SUFFIX)


def file_digest(fd: int) -> str:
    """The SHA-256 of the open file `fd`, read from its start."""
    digest, offset = hashlib.sha256(), 0
    while chunk := os.pread(fd, 1 << 20, offset):
        digest.update(chunk)
        offset += len(chunk)
    return digest.hexdigest()


def sources(folder: Path = HERE) -> list[Path]:
    """The C files the library is built from, in a fixed order."""
    return sorted(folder.glob("*.c"))


def source_digest(files: Sequence[Path]) -> str:
    """The SHA-256 of the C sources (names and contents), as the build embeds it in the library."""
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def compiler() -> list[str] | None:
    """The C compiler: $CC (with its arguments), else cc, else gcc; None where there is none."""
    if os.environ.get("CC"):
        return shlex.split(os.environ["CC"])
    found = shutil.which("cc") or shutil.which("gcc")
    return [found] if found else None


def build(output: Path = LIBRARY, files: Sequence[Path] | None = None, digest: str | None = None) -> str | None:
    """Compiles `files` (default: the sources here) into `output`, replaced only by a complete build; returns why it
    could not, or None. `digest` is the source hash to embed (default: the files' own; tests embed another to make
    a stale build)."""
    files = sources() if files is None else list(files)
    command = compiler()
    if command is None:
        return "no C compiler (cc or gcc, or $CC) to build ckptqual's native kernels"
    digest = digest or source_digest(files)
    output.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(prefix=f".{output.name}.", dir=output.parent)
    os.close(fd)
    names = ", ".join(path.name for path in files)
    try:
        done = subprocess.run(
            [*command, *CFLAGS, f'-DCKPTQUAL_NATIVE_SOURCE="{digest}"', "-o", partial, *map(str, files)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode != 0:
            said = " / ".join((done.stderr + done.stdout).strip().splitlines()[-3:])
            failed = f"{shlex.join(command)} failed to compile {names} (exit {done.returncode})"
            return f"{failed}: {said}" if said else failed
        os.chmod(partial, 0o755)
        with open(partial, "rb") as compiled:
            recorded = f"{file_digest(compiled.fileno())} {digest}\n"
        os.replace(partial, output)  # a process that loaded the old library keeps its copy
        fd, record = tempfile.mkstemp(prefix=f".{output.name}.", dir=output.parent)
        with os.fdopen(fd, "w") as file:
            file.write(recorded)
        os.chmod(record, 0o644)
        os.replace(record, build_record(output))
        return None
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"{shlex.join(command)} could not compile {names}: {error}"
    finally:
        Path(partial).unlink(missing_ok=True)


def load_from(library: Path, files: Sequence[Path]) -> tuple[ctypes.CDLL | None, str | None]:
    """The library at `library` if it was built from `files` as they are now; else None and why not."""
    if not library.is_file():
        missing_library = f"{library} is missing: no C compiler at install?"
        return None, f"ckptqual's native kernels are not built ({missing_library}); {REBUILD}"
    missing = [path for path in files if not path.is_file()]
    if missing or not files:
        return None, f"the sources of {library.name} are missing, so it cannot be checked against them"
    try:
        recorded_file, recorded_sources = build_record(library).read_text().split()
    except (OSError, UnicodeDecodeError, ValueError):
        return None, f"{library} has no record of its build ({build_record(library).name}): not used; {REBUILD}"
    fd = os.open(library, os.O_RDONLY | os.O_CLOEXEC)
    try:
        actual = file_digest(fd)
        if actual != recorded_file:
            return None, (
                f"{library} (sha256 {actual}) is not the file its build recorded (sha256 {recorded_file[:12]}): "
                f"not used; {REBUILD}"
            )
        digest = source_digest(files)
        if recorded_sources != digest:
            return None, (
                f"{library} (sha256 {actual}) was built from other versions of its sources (sha256 "
                f"{recorded_sources[:12]}, the files are {digest[:12]} now): a stale build is not used; {REBUILD}"
            )
        return _opened(f"/proc/self/fd/{fd}", library, digest)  # the very file hashed, not one swapped in since
    finally:
        os.close(fd)


def _opened(path: str, library: Path, digest: str) -> tuple[ctypes.CDLL | None, str | None]:
    """The library loaded from `path` (an open descriptor of `library`), if the source digest it embeds is `digest`."""
    try:
        loaded = ctypes.CDLL(path)
        function = loaded.ckptqual_native_source
        function.restype = ctypes.c_char_p
        embedded = function().decode()
    except (OSError, AttributeError) as error:
        return None, f"{library} does not load as ckptqual's native kernels: {error}"
    if embedded != digest:
        return None, (
            f"{library} embeds the digest of other versions of its sources (sha256 {embedded[:12]}, the files are "
            f"{digest[:12]} now): a stale build is not used; {REBUILD}"
        )
    return loaded, None


@functools.cache
def load() -> tuple[ctypes.CDLL | None, str | None]:
    """The installed library beside this file, once per process: (library, None) or (None, why not)."""
    return load_from(LIBRARY, sources())


if __name__ == "__main__":
    problem = build()
    print(problem or f"built {LIBRARY}", file=sys.stderr if problem else sys.stdout)
    sys.exit(1 if problem else 0)
