"""Hatch build hook: compiles the POSIX engine's native psync loop (src/ckptqual/io/readers/psync_cell.c).

- editable install (`pip install -e .`): into the source tree, beside psync_cell.c (git-ignores it);
- wheel: into a scratch directory, force-included as ckptqual/io/readers/libpsync_cell.so, the wheel then tagged
  for this platform (py3-none-<platform>: the library does not use Python's C API).

Optional: where there is no C compiler ($CC, cc or gcc) or the compile fails, the build warns and goes on without
it (a pure-Python wheel), and the engine reads with its Python loop, saying why in its settings. The compiling
itself is psync_native.build, loaded here by path: the package is not importable while it is being built.
"""

from __future__ import annotations

import importlib.util
import shutil
import sysconfig
import tempfile
from pathlib import Path
from types import ModuleType

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

NATIVE = Path("src/ckptqual/io/readers/psync_native.py")
IN_WHEEL = "ckptqual/io/readers/libpsync_cell.so"


def psync_native(root: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("_ckptqual_psync_native", Path(root) / NATIVE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class NativePsyncHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict) -> None:
        if self.target_name != "wheel":
            return
        native = psync_native(self.root)
        source = Path(self.root) / NATIVE.with_name("psync_cell.c")
        if version == "editable":
            output = source.with_name(native.LIBRARY.name)
        else:
            self._scratch = tempfile.mkdtemp(prefix="ckptqual-psync-")
            output = Path(self._scratch) / native.LIBRARY.name
        problem = native.build(output, source)
        if problem:
            message = f"ckptqual: {problem}; installing without the native psync loop (cpu-only reads: Python loop)"
            self.app.display_warning(f"WARNING: {message}")
            return
        self.app.display_info(f"ckptqual: built the native psync loop {output}")
        if version != "editable":
            build_data["force_include"][str(output)] = IN_WHEEL
            build_data["pure_python"] = False
            build_data["tag"] = f"py3-none-{sysconfig.get_platform().replace('-', '_').replace('.', '_')}"

    def finalize(self, version: str, build_data: dict, artifact_path: str) -> None:
        scratch = getattr(self, "_scratch", None)
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
