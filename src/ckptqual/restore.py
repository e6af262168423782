"""Restore: read a checkpoint back cold, every rank its own files at once, and prove every byte.

`torch-save` files are read with `torch.load`, `stream` files with the streaming reader (chunked reads at
each tensor's file offset). A wrong byte fails the restore whatever its speed, naming file, offset and
what was found instead; an I/O error names file and offset.
"""

from __future__ import annotations

import io as io_module
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

from ckptqual import cache
from ckptqual.engines.base import RankIO
from ckptqual.engines.torchread import FormatError, StoredTensor, read_table
from ckptqual.payload import Mismatch
from ckptqual.plan import CheckpointPlan, FilePlan

MAX_REPORTED = 5
# More of a checkpoint than this in the page cache before a restore makes it a cache read, not a drive read.
MAX_CACHED_FRACTION = 0.05
# Checking runs interleaved with the reads; below this headroom the result is the host's CPU more than the drive.
MIN_VERIFY_HEADROOM = 1.5


class IntegrityError(RuntimeError):
    """Read-back data differs from what was written."""


class ReadBackError(OSError):
    """The drive failed a read; the message names file and offset."""


@dataclass(frozen=True)
class Problem:
    """One wrong block, located in its file."""

    path: Path
    tensor: str
    file_offset: int
    mismatch: Mismatch

    def describe(self) -> str:
        return (
            f"{self.path.parent.name}/{self.path.name}: tensor {self.tensor!r} at file offset {self.file_offset} "
            f"({self.mismatch.describe()}) holds {self.mismatch.found}"
        )


def read_checkpoint_files(io: RankIO, task: Any) -> int:
    """Rank side: reads and verifies the rank's files of one checkpoint; returns the bytes read."""
    directory, plan, engine = Path(task.directory), task.plan, task.options["engine"]
    problems: list[Problem] = []
    for file_index, spec in enumerate(plan.files):
        path = directory / spec.path
        if engine == "torch-save":
            problems += _read_with_torch_load(io, path, spec, file_index)
        else:
            problems += _read_streaming(io, path, spec, file_index)
    if problems:
        shown = "; ".join(p.describe() for p in problems[:MAX_REPORTED])
        more = f" (and more: at least {len(problems)} bad blocks)" if len(problems) > MAX_REPORTED else ""
        raise IntegrityError(f"checkpoint {io.checkpoint}, rank {io.rank}: {shown}{more}")
    return plan.nbytes


def _check_table(path: Path, spec: FilePlan, table: list[StoredTensor]) -> None:
    found = [(t.name, t.dtype, t.numel) for t in table]
    wanted = [(t.name, t.dtype, t.numel) for t in spec.tensors]
    if found != wanted:
        raise IntegrityError(f"{path}: tensors {found[:3]}... do not match the plan {wanted[:3]}...")


def _read_streaming(io: RankIO, path: Path, spec: FilePlan, file_index: int) -> list[Problem]:
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size <= io.chunk_bytes:
            return _read_small(io, fd, size, path, spec, file_index)
        table = _table(path, spec)
        return _read_tensors(io, fd, path, table, file_index)
    finally:
        os.close(fd)


def _table(path: Path, spec: FilePlan, file: BinaryIO | None = None) -> list[StoredTensor]:
    try:
        table = read_table(path, file)
    except FormatError as error:
        raise IntegrityError(str(error)) from error
    _check_table(path, spec, table)
    return table


def _read_small(io: RankIO, fd: int, size: int, path: Path, spec: FilePlan, file_index: int) -> list[Problem]:
    """A file that fits the buffer is read in one request, then parsed and checked from memory."""
    whole = io.buffer[:size]
    _pread_exactly(fd, whole, 0, path)
    table = _table(path, spec, io_module.BytesIO(whole))
    problems: list[Problem] = []
    for tensor_index, stored in enumerate(table):
        data = whole[stored.data_offset : stored.data_offset + stored.nbytes]
        problems += _located(io.verify(data, file_index, tensor_index, 0), path, stored)
    return problems


def _read_tensors(io: RankIO, fd: int, path: Path, table: list[StoredTensor], file_index: int) -> list[Problem]:
    """Each tensor read in buffer-sized chunks from its file offset and checked chunk by chunk."""
    problems: list[Problem] = []
    for tensor_index, stored in enumerate(table):
        for offset in range(0, stored.nbytes, io.chunk_bytes):
            chunk = io.buffer[: min(io.chunk_bytes, stored.nbytes - offset)]
            _pread_exactly(fd, chunk, stored.data_offset + offset, path)
            problems += _located(io.verify(chunk, file_index, tensor_index, offset), path, stored)
            if len(problems) > MAX_REPORTED:
                return problems
    return problems


def _pread_exactly(fd: int, chunk: np.ndarray, file_offset: int, path: Path) -> None:
    done = 0
    view = memoryview(chunk)
    while done < chunk.nbytes:
        try:
            count = os.preadv(fd, [view[done:]], file_offset + done)
        except OSError as error:
            raise ReadBackError(
                error.errno, f"{path}: I/O error at file offset {file_offset + done}: {error.strerror}"
            ) from error
        if count == 0:
            raise IntegrityError(
                f"{path}: file ends at offset {file_offset + done}, "
                f"expected {chunk.nbytes - done} more bytes (truncated)"
            )
        done += count


def _located(mismatches: list[Mismatch], path: Path, stored: StoredTensor) -> list[Problem]:
    return [Problem(path, stored.name, stored.data_offset + m.offset, m) for m in mismatches]


def _read_with_torch_load(io: RankIO, path: Path, spec: FilePlan, file_index: int) -> list[Problem]:
    try:
        state = torch.load(path, weights_only=True)
    except Exception as error:
        _read_streaming(io, path, spec, file_index)  # locates an I/O error or damage by file offset
        raise IntegrityError(f"{path}: torch.load failed: {error}") from error
    table = _table(path, spec)
    problems: list[Problem] = []
    for tensor_index, stored in enumerate(table):
        tensor = state[stored.name]
        data = tensor.view(torch.uint8).numpy() if tensor.numel() else np.empty(0, np.uint8)
        for offset in range(0, max(data.nbytes, 1), io.chunk_bytes):  # chunked: the check needs no second copy
            chunk = data[offset : offset + io.chunk_bytes]
            problems += _located(io.verify(chunk, file_index, tensor_index, offset), path, stored)
    return problems


@dataclass(frozen=True)
class RestoreResult:
    """One cold restore: bytes, time to the slowest rank, and how much was cached beforehand."""

    checkpoint: int
    bytes: int
    seconds: float
    first_done_s: float
    cached_fraction_before: float
    payload_GBps: float
    ranks: list[dict]

    @property
    def GBps(self) -> float:
        return self.bytes / self.seconds / 1e9

    def invalid_reason(self) -> str | None:
        """Why this restore measured something other than the drive, if it did."""
        if self.cached_fraction_before > MAX_CACHED_FRACTION:
            return (
                f"{self.cached_fraction_before:.0%} of the checkpoint was still in the page cache after "
                f"eviction; the read would not come from the drive"
            )
        if self.payload_GBps < MIN_VERIFY_HEADROOM * self.GBps:
            return (
                f"verification was the bottleneck: checking ran at {self.payload_GBps:.2f} GB/s on this host's "
                f"cores, under {MIN_VERIFY_HEADROOM:g}x the restore rate {self.GBps:.2f} GB/s; use a host with "
                f"more or faster cores"
            )
        return None

    def to_dict(self) -> dict:
        return {**self.__dict__, "GBps": self.GBps}


def evict_checkpoint(directory: Path, plan: CheckpointPlan) -> float:
    """Drops the checkpoint's files from the page cache; returns the fraction still cached."""
    return cache.evict_all(directory / f.path for rank in plan.ranks for f in rank.files)
