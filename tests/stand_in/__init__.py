"""Tests only: builds the libcuda stand-in (libcuda_stand_in.c) so KvikIO's host path runs on a GPU-less machine.

The product never ships or loads it. Tests load it only in child processes, where it cannot leak into other
tests: `LD_LIBRARY_PATH` for a child pytest run, or `ctypes.CDLL(path, RTLD_GLOBAL)` first thing in a child
Python (PRELOAD below), before KvikIO's first I/O dlopens "libcuda.so.1".
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

SOURCE = Path(__file__).with_name("libcuda_stand_in.c")
SONAME = "libcuda.so.1"
PRELOAD = "import ctypes, os; ctypes.CDLL(os.environ['CKPTQUAL_TEST_LIBCUDA'], mode=ctypes.RTLD_GLOBAL)\n"


class StandInUnavailable(RuntimeError):
    """No C compiler here to build the stand-in."""


def build(directory: Path) -> Path:
    """Compiles the stand-in into `directory`/libcuda.so.1 (its soname, so that dlopen finds it loaded)."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        raise StandInUnavailable("no C compiler (gcc or cc) to build the libcuda stand-in")
    directory.mkdir(parents=True, exist_ok=True)
    library = directory / SONAME
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-O2", "-Wall", "-Werror", f"-Wl,-soname,{SONAME}", "-o", library, SOURCE],
        check=True,
        capture_output=True,
        text=True,
    )
    return library
