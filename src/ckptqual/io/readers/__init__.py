"""Read engines of the sweep, one file each behind one Protocol (`base.Reader`), and the choice between them."""

from __future__ import annotations

from ckptqual.host.gpu import HostGpu
from ckptqual.io.readers.base import TRANSFERS, HostBuffers, Reader, ReadShape

__all__ = ["TRANSFERS", "HostBuffers", "ReadShape", "Reader", "make_reader"]


def make_reader(transfer: str, host: HostGpu) -> Reader:
    """The engine for `transfer` on this host: KvikIO for the GPU types; for cpu-only KvikIO's host path where
    the CUDA driver library is present, else ckptqual's POSIX engine."""
    problem = host.problem(transfer)
    if problem:
        raise RuntimeError(problem)
    if transfer == "cpu-only" and host.cpu_only_engine == "posix":
        from ckptqual.io.readers.posix import PosixReader

        return PosixReader(transfer)
    from ckptqual.io.readers.kvikio_reader import KvikioReader

    return KvikioReader(transfer)
