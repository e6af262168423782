"""KvikIO read engine for the three transfer types (docs/facts.md).

- `gpu-direct`: into GPU memory with cuFile (GDS). KvikIO's compat mode is OFF, so KvikIO either uses cuFile
  or raises; its `gds_threshold` is lowered to 4 KiB so that no request is sent down the POSIX path for being
  small. The result does not count (INVALID) if KvikIO still preferred compat mode, or if cuFile itself may
  fall back to POSIX (cufile.json `allow_compat_mode`), the silent fallback gds_stats would show as `posix`.
- `cpu-gpu`: into GPU memory in KvikIO's compat mode: POSIX reads into pinned bounce buffers, then copies.
- `cpu-only`: into page-aligned host memory in compat mode, O_DIRECT (`auto_direct_io_read`).

Every cell runs inside `kvikio.defaults.set(...)`: `num_threads` = the cell's threads (its I/O depth) and
`task_size` = its block, so each request is one task of one block. KvikIO needs the CUDA driver library for
any I/O, even into host memory; this module never loads one itself.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ckptqual.host import gpu
from ckptqual.host.beneath import RunTree
from ckptqual.io.readers.base import ALIGN_BYTES, TRANSFERS, HostBuffers, ReadShape


class _Pending:
    def __init__(self, future: Any, issued: int) -> None:
        self._future, self._issued = future, issued

    def wait(self) -> tuple[int, int, int]:
        count = self._future.get()
        return count, self._issued, time.perf_counter_ns()


class KvikioReader:
    """One transfer type through KvikIO; KvikIO's settings apply from open() to close()."""

    engine = "kvikio"

    def __init__(self, transfer: str) -> None:
        if transfer not in TRANSFERS:
            raise ValueError(f"unknown transfer {transfer!r}; use one of {', '.join(TRANSFERS)}")
        self.transfer = transfer
        self._stack = contextlib.ExitStack()  # undoes what open() did, in reverse
        self._files: list[Any] = []
        self._host: HostBuffers | None = None
        self._device: gpu.DeviceMemory | None = None
        self._registered = False
        self._register_problem: str | None = None
        self._settings: dict[str, Any] = {}
        self._slots = self._block = 0

    def open(self, tree: RunTree, paths: Sequence[Path], shape: ReadShape) -> None:
        import kvikio
        import kvikio.defaults

        self._slots, self._block = shape.slots, shape.block_bytes
        config: dict[str, Any] = {
            "num_threads": shape.threads,
            "task_size": shape.block_bytes,
            "auto_direct_io_read": True,
            "compat_mode": kvikio.CompatMode.OFF if self.transfer == "gpu-direct" else kvikio.CompatMode.ON,
        }
        if self.transfer == "gpu-direct":
            config["gds_threshold"] = ALIGN_BYTES
        self._stack.enter_context(kvikio.defaults.set(config))
        count = shape.jobs * shape.slots
        if self.transfer == "cpu-only":
            self._host = self._stack.enter_context(contextlib.closing(HostBuffers(count, shape.block_bytes)))
        else:
            self._device = self._stack.enter_context(contextlib.closing(gpu.DeviceMemory(count * shape.block_bytes)))
            if self.transfer == "gpu-direct":
                self._register(kvikio)
        for path in paths:
            self._files.append(self._stack.enter_context(contextlib.closing(self._open_file(kvikio, tree, path))))
        self._settings = self._effective(kvikio)

    def _open_file(self, kvikio: Any, tree: RunTree, path: Path) -> Any:
        """A CuFile of `path` as `tree` reached it: KvikIO takes a path, so it gets /proc/self/fd/N of a descriptor
        opened without following a symlink (the same inode again, not the name)."""
        fd = tree.open(path, os.O_RDONLY)
        try:
            return kvikio.CuFile(f"/proc/self/fd/{fd}", "r")
        except RuntimeError as error:
            if self.transfer != "gpu-direct":
                raise
            raise RuntimeError(
                f"gpu-direct: KvikIO cannot read {path.name} with cuFile (compat mode is off, so it does not fall "
                f"back to POSIX): {error}"
            ) from error
        finally:
            os.close(fd)

    def _register(self, kvikio: Any) -> None:
        """Registers the device buffers with cuFile, as gdsio does; a refusal is recorded, not fatal."""
        device = self._device_memory()
        whole = device.view(0, device.nbytes)
        try:
            kvikio.memory_register(whole)
        except Exception as error:
            self._register_problem = f"cuFileBufRegister failed ({error}); reading into unregistered buffers"
            return
        self._registered = True
        self._stack.callback(kvikio.memory_deregister, whole)

    def _effective(self, kvikio: Any) -> dict[str, Any]:
        get = kvikio.defaults.get
        settings: dict[str, Any] = {
            "engine": self.engine,
            "kvikio_version": kvikio.__version__,
            "threads": int(get("num_threads")),
            "task_size": int(get("task_size")),
            "compat_mode": kvikio.CompatMode(get("compat_mode")).name,
            "compat_mode_preferred": bool(kvikio.defaults.is_compat_mode_preferred()),
            "gds_threshold": int(get("gds_threshold")),
            "bounce_buffer_size": int(get("bounce_buffer_size")),
            "auto_direct_io_read": bool(get("auto_direct_io_read")),
            "direct_io": all(file.is_direct_io_supported() for file in self._files),
            "memory": "host" if self._host else "device",
        }
        if self.transfer == "gpu-direct":
            from kvikio import cufile_driver

            settings |= {
                "cufile_allow_compat_mode": bool(cufile_driver.get("allow_compat_mode")),
                "gds_available": bool(cufile_driver.get("is_gds_available")),
                "nvidia_fs_loaded": gpu.nvidia_fs_loaded(),
                "buffers_registered": self._registered,
                "register_problem": self._register_problem,
            }
        return settings

    def submit(self, job: int, slot: int, offset: int) -> _Pending:
        index = job * self._slots + slot
        buffer = self._host.view(index) if self._host else self._device_memory().view(index * self._block, self._block)
        issued = time.perf_counter_ns()
        return _Pending(self._files[job].pread(buffer, self._block, offset, self._block), issued)

    def host_copy(self, job: int, slot: int) -> np.ndarray:
        index = job * self._slots + slot
        return self._host.view(index) if self._host else self._device_memory().to_host(index * self._block, self._block)

    def _device_memory(self) -> gpu.DeviceMemory:
        """The device buffers, made by open() where the reads land in GPU memory."""
        if self._device is None:
            raise RuntimeError(
                f"the {self.transfer} reader has no device buffers: read only between open() and close()"
            )
        return self._device

    def settings(self) -> dict[str, Any]:
        return dict(self._settings)

    def invalid_reason(self) -> str | None:
        """Why a gpu-direct result does not count as GPU Direct Storage (None for the other types)."""
        if self.transfer != "gpu-direct":
            return None
        settings = self._settings
        if settings.get("compat_mode_preferred"):
            return "KvikIO ran in compat mode (POSIX reads and bounce buffers), not GDS"
        if not settings.get("gds_available", False):
            return "cuFile reports GDS unavailable: its reads fall back to POSIX"
        if settings.get("cufile_allow_compat_mode"):
            return (
                "cuFile may have fallen back to POSIX silently (allow_compat_mode is on); set "
                '"allow_compat_mode": false in the cufile.json named by CUFILE_ENV_PATH_JSON, so that a fallback '
                "fails instead of counting as GDS"
            )
        return None

    def close(self) -> None:
        self._files, self._host, self._device, self._registered = [], None, None, False
        self._stack.close()
