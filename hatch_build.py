"""Hatch build hook: compiles ckptqual's native kernels (the C files of src/ckptqual/io/native: the payload's
keystream and checks, the POSIX engine's psync loop) into one library.

- editable install (`pip install -e .`): into the source tree, beside the C files (git-ignores it);
- wheel: into a scratch directory, force-included as ckptqual/io/native/libckptqual_native.so (with the record of
  its SHA-256 beside it, .so.sha256), the wheel then tagged for this platform (py3-none-<platform>: the library
  does not use Python's C API).

Optional: where there is no C compiler ($CC, cc or gcc) or the compile fails, the build warns and goes on without
it (a pure-Python wheel), and ckptqual runs its Python code instead, saying why in the settings it records. The
compiling itself is io/native/library.py's `build`, loaded here by path: the package is not importable while it
is being built.
"""

from __future__ import annotations

import importlib.util
import shutil
import sysconfig
import tempfile
from pathlib import Path
from types import ModuleType

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

NATIVE = Path("src/ckptqual/io/native/library.py")
IN_WHEEL = "ckptqual/io/native/libckptqual_native.so"


def native_library(root: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("_ckptqual_native_library", Path(root) / NATIVE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class NativeKernelsHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict) -> None:
        if self.target_name != "wheel":
            return
        native = native_library(self.root)
        if version == "editable":
            output = native.LIBRARY
        else:
            self._scratch = tempfile.mkdtemp(prefix="ckptqual-native-")
            output = Path(self._scratch) / native.LIBRARY.name
        problem = native.build(output)
        if problem:
            message = f"ckptqual: {problem}; installing without its native kernels (their Python code runs instead)"
            self.app.display_warning(f"WARNING: {message}")
            return
        self.app.display_info(f"ckptqual: built its native kernels, {output}")
        if version != "editable":
            build_data["force_include"][str(output)] = IN_WHEEL
            build_data["force_include"][str(native.build_record(output))] = IN_WHEEL + native.RECORD_SUFFIX
            build_data["pure_python"] = False
            build_data["tag"] = f"py3-none-{sysconfig.get_platform().replace('-', '_').replace('.', '_')}"

    def finalize(self, version: str, build_data: dict, artifact_path: str) -> None:
        scratch = getattr(self, "_scratch", None)
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
