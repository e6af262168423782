"""What this host can run of the sweep's transfer types: CUDA driver, GPU, KvikIO, cuFile/GDS; and GPU memory.

Reads only. It loads the CUDA driver library that is installed (libcuda.so.1) and never anything in its place;
where it is absent, the reasons say so and the GPU transfer types are skipped. GPU memory comes straight from
the driver (cuMemAlloc) and reaches KvikIO through `__cuda_array_interface__`, so no cupy is needed.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

CUDA_SUCCESS = 0
CUDA_ERROR_NOT_INITIALIZED = 3
CUDA_ERROR_NO_DEVICE = 100
_CUDA_ERRORS = {
    1: "CUDA_ERROR_INVALID_VALUE",
    2: "CUDA_ERROR_OUT_OF_MEMORY",
    3: "CUDA_ERROR_NOT_INITIALIZED",
    35: "CUDA_ERROR_INSUFFICIENT_DRIVER",
    100: "CUDA_ERROR_NO_DEVICE",
    101: "CUDA_ERROR_INVALID_DEVICE",
    999: "CUDA_ERROR_UNKNOWN",
}
DRIVER_LIBRARY = "libcuda.so.1"


class CudaError(RuntimeError):
    """A CUDA driver call failed; the message names the call and the error."""


def cuda_error_name(code: int) -> str:
    return f"{_CUDA_ERRORS.get(code, 'CUDA error')} ({code})"


def _load_driver() -> ctypes.CDLL:
    return ctypes.CDLL(DRIVER_LIBRARY)


def _call(driver: ctypes.CDLL, name: str, *args: Any) -> None:
    code = getattr(driver, name)(*args)
    if code != CUDA_SUCCESS:
        raise CudaError(f"{name} returned {cuda_error_name(code)}")


@dataclass(frozen=True)
class HostGpu:
    """The probe's findings; a `*_problem` is None where that part works, else why it does not."""

    driver_problem: str | None = None
    driver_version: int | None = None
    gpu_problem: str | None = None
    gpu_count: int = 0
    gpu_name: str | None = None
    kvikio_problem: str | None = None
    kvikio_version: str | None = None
    cufile_version: str | None = None
    gds_problem: str | None = None
    cufile_allow_compat_mode: bool | None = None
    kvikio_auto_compat: bool | None = None  # whether KvikIO's AUTO mode would fall back to POSIX

    def problem(self, transfer: str) -> str | None:
        """Why this host cannot run `transfer` at all (None: it can): no GPU, no CUDA driver or no KvikIO. The
        transfer is then skipped, as a host without the hardware says nothing of the drive."""
        if transfer == "cpu-only":
            return None
        for problem in (self.driver_problem, self.gpu_problem, self.kvikio_problem):
            if problem:
                return f"{transfer} needs a GPU and KvikIO: {problem}"
        return None

    def invalid(self, transfer: str) -> str | None:
        """Why `transfer` would not measure what it names on a host that can run it (None: it would): gpu-direct
        on a GPU host without GPUDirect Storage could only read through POSIX bounce buffers, so its cells are
        INVALID, never passed and never merely skipped."""
        if transfer == "gpu-direct" and self.problem(transfer) is None and self.gds_problem:
            return f"gpu-direct needs GPUDirect Storage: {self.gds_problem}"
        return None

    @property
    def cpu_only_engine(self) -> str:
        """KvikIO's host path where the CUDA driver library and KvikIO are there, else ckptqual's POSIX engine."""
        return "kvikio" if self.driver_problem is None and self.kvikio_problem is None else "posix"

    @property
    def cpu_only_reason(self) -> str:
        if self.cpu_only_engine == "kvikio":
            return "KvikIO's host path (the CUDA driver library is present)"
        return f"ckptqual's POSIX engine, as KvikIO cannot run here: {self.driver_problem or self.kvikio_problem}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"cpu_only_engine": self.cpu_only_engine}


def probe() -> HostGpu:
    """Looks for the CUDA driver, a GPU, KvikIO and cuFile, in that order; each step only if the last worked."""
    found: dict[str, Any] = {}
    driver = None
    try:
        driver = _load_driver()
    except OSError as error:
        found["driver_problem"] = f"no CUDA driver library ({error})"
    if driver is not None:
        found.update(_probe_gpu(driver))
    found.update(_probe_kvikio(gpu_present=found.get("gpu_count", 0) > 0))
    return HostGpu(**found)


def _probe_gpu(driver: ctypes.CDLL) -> dict[str, Any]:
    found: dict[str, Any] = {}
    version = ctypes.c_int(0)
    try:
        _call(driver, "cuDriverGetVersion", ctypes.byref(version))
        found["driver_version"] = version.value
    except (CudaError, AttributeError) as error:
        return {"driver_problem": f"the CUDA driver library does not answer: {error}"}
    code = driver.cuInit(0)
    if code != CUDA_SUCCESS:
        return found | {"gpu_problem": f"no usable GPU: cuInit returned {cuda_error_name(code)}"}
    count = ctypes.c_int(0)
    try:
        _call(driver, "cuDeviceGetCount", ctypes.byref(count))
    except CudaError as error:
        return found | {"gpu_problem": f"no usable GPU: {error}"}
    if count.value < 1:
        return found | {"gpu_problem": "no GPU: the CUDA driver counts 0 devices"}
    name = ctypes.create_string_buffer(256)
    device = ctypes.c_int(0)
    if driver.cuDeviceGet(ctypes.byref(device), 0) == CUDA_SUCCESS:
        driver.cuDeviceGetName(name, len(name), device)
    return found | {"gpu_count": count.value, "gpu_name": name.value.decode(errors="replace") or None}


def _probe_kvikio(gpu_present: bool) -> dict[str, Any]:
    try:
        import kvikio
        import kvikio.cufile_driver
        import kvikio.defaults
    except Exception as error:  # an ImportError, or a broken install that fails on import
        return {"kvikio_problem": f"KvikIO cannot be imported ({type(error).__name__}: {error})"}
    found: dict[str, Any] = {"kvikio_version": kvikio.__version__}
    try:
        major, minor = kvikio.cufile_driver.libcufile_version()
        found["cufile_version"] = f"{major}.{minor}"
    except Exception as error:
        found["gds_problem"] = f"libcufile cannot be loaded ({error})"
    if not gpu_present:
        # cuFile's driver is not opened without a GPU: with no device it has nothing to report.
        return found | {"gds_problem": found.get("gds_problem") or "no GPU"}
    with kvikio.defaults.set("compat_mode", kvikio.CompatMode.AUTO):
        found["kvikio_auto_compat"] = bool(kvikio.defaults.is_compat_mode_preferred())
    if found["kvikio_auto_compat"] and "gds_problem" not in found:
        found["gds_problem"] = (
            "KvikIO would run in compat mode (POSIX): libcufile missing, /run/udev unreadable (a container "
            "without --volume /run/udev:/run/udev:ro) or WSL"
        )
    try:
        found["cufile_allow_compat_mode"] = bool(kvikio.cufile_driver.get("allow_compat_mode"))
        if not kvikio.cufile_driver.get("is_gds_available") and "gds_problem" not in found:
            found["gds_problem"] = "cuFile reports GDS unavailable (nvidia-fs not loaded, or the file system lacks GDS)"
    except Exception as error:
        found.setdefault("gds_problem", f"the cuFile driver does not open ({error})")
    return found


class _DeviceView:
    """A slice of device memory in the form KvikIO and other CUDA libraries read (CUDA array interface v3)."""

    def __init__(self, pointer: int, nbytes: int) -> None:
        self.nbytes = nbytes
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (pointer, False),
            "strides": None,
            "version": 3,
        }


class DeviceMemory:
    """GPU memory of device 0's primary context, allocated with cuMemAlloc; freed by close()."""

    def __init__(self, nbytes: int, device: int = 0) -> None:
        self._driver = _load_driver()
        d = self._driver
        d.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
        d.cuMemFree_v2.argtypes = [ctypes.c_uint64]
        d.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
        d.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]
        _call(d, "cuInit", 0)
        self._device = ctypes.c_int(0)
        _call(d, "cuDeviceGet", ctypes.byref(self._device), device)
        self._context = ctypes.c_void_p(0)
        _call(d, "cuDevicePrimaryCtxRetain", ctypes.byref(self._context), self._device)
        self._current()
        self.nbytes = nbytes
        self.pointer = ctypes.c_uint64(0)
        try:
            _call(d, "cuMemAlloc_v2", ctypes.byref(self.pointer), nbytes)
        except CudaError:
            d.cuDevicePrimaryCtxRelease_v2(self._device)
            raise

    def _current(self) -> None:
        _call(self._driver, "cuCtxSetCurrent", self._context)

    def view(self, offset: int, nbytes: int) -> _DeviceView:
        if offset < 0 or offset + nbytes > self.nbytes:
            raise ValueError(f"view [{offset}, {offset + nbytes}) outside {self.nbytes} bytes of device memory")
        return _DeviceView(self.pointer.value + offset, nbytes)

    def to_host(self, offset: int, nbytes: int) -> np.ndarray:
        """A host copy of device bytes [offset, offset + nbytes)."""
        host = np.empty(nbytes, dtype=np.uint8)
        self._current()
        _call(self._driver, "cuMemcpyDtoH_v2", host.ctypes.data, self.pointer.value + offset, nbytes)
        return host

    def close(self) -> None:
        if self.pointer.value:
            self._current()
            self._driver.cuMemFree_v2(self.pointer.value)
            self.pointer = ctypes.c_uint64(0)
            self._driver.cuDevicePrimaryCtxRelease_v2(self._device)


def nvidia_fs_loaded() -> bool:
    """Whether the nvidia-fs kernel module (GDS's classic data path) is loaded; recorded beside GPU results."""
    return os.path.exists("/proc/driver/nvidia-fs/stats")
