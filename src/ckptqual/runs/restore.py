"""Restore: read a checkpoint back cold, every rank its own files at once, and prove each file loadable and exact.

Every file is checked as `torch.load` needs it, without trusting torch: zip structure, every record and its
CRC32, the pickle against the plan, and the small records against what the engine writes (`torchread`).
`stream` files are read in chunks at each tensor's file offset; `torch-save` files with `torch.load`, as a
restarting job would. Each tensor's bytes are read once: the payload check and the CRC run over the same
chunks. A wrong byte fails the restore whatever its speed, naming file, record or offset and what was
found instead; an I/O error names file and offset. After the timed read, each rank loads one of its files
with `torch.load` (mmap) as an independent check (`load_sample`).
"""

from __future__ import annotations

import os
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ckptqual.host import cache
from ckptqual.io.engines import stream, torch_save
from ckptqual.io.engines.base import RankIO
from ckptqual.io.engines.torchread import ExpectedArchive, FormatError, TensorRecord, check_archive, check_crc
from ckptqual.io.payload import Mismatch
from ckptqual.plan.model import CheckpointPlan, FilePlan

MAX_REPORTED = 5
# More of a checkpoint than this in the page cache before a restore makes it a cache read, not a drive read.
MAX_CACHED_FRACTION = 0.05
# Checking runs interleaved with the reads; below this headroom the result is the host's CPU more than the drive.
MIN_VERIFY_HEADROOM = 1.5

_EXPECTED: dict[str, Callable[[FilePlan, int, int, int], ExpectedArchive]] = {
    "stream": stream.expected_archive,
    "torch-save": torch_save.expected_archive,
}


class IntegrityError(RuntimeError):
    """Read-back data differs from what was written."""


class ReadBackError(OSError):
    """The drive failed a read; the message names file and offset."""


@dataclass(frozen=True)
class _File:
    """One checkpoint file of a rank's plan: where it is, how messages name it, what it must hold."""

    path: Path
    label: str
    index: int
    expected: ExpectedArchive


@dataclass(frozen=True)
class Problem:
    """One wrong block, located in its file."""

    file: str
    tensor: str
    file_offset: int
    mismatch: Mismatch

    def describe(self) -> str:
        return (
            f"{self.file}: tensor {self.tensor!r} at file offset {self.file_offset} "
            f"(tensor offset {self.mismatch.offset}) holds {self.mismatch.found}"
        )


def read_checkpoint_files(io: RankIO, task: Any) -> int:
    """Rank side: reads the rank's files of one checkpoint and proves each loadable and exact; returns bytes read."""
    engine = task.options["engine"]
    read = _read_with_torch_load if engine == "torch-save" else _read_streaming
    problems: list[Problem] = []
    for index in range(len(task.plan.files)):
        problems += read(io, _file(io, task, index))
    if problems:
        shown = "; ".join(p.describe() for p in problems[:MAX_REPORTED])
        more = f" (and more: at least {len(problems)} bad blocks)" if len(problems) > MAX_REPORTED else ""
        raise IntegrityError(f"{shown}{more}")  # the rank and what it was reading are said by the caller
    return task.plan.nbytes


def _file(io: RankIO, task: Any, index: int) -> _File:
    """The task's file `index`: its path, its name in messages (checkpoint directory and path), what it must hold."""
    directory, spec = Path(task.directory), task.plan.files[index]
    expected = _EXPECTED[task.options["engine"]](spec, io.checkpoint, io.rank, index)
    return _File(directory / spec.path, f"{directory.name}/{spec.path}", index, expected)


class _WholeFile:
    """A small file read in one request; structures and tensor chunks are views of it."""

    def __init__(self, data: np.ndarray) -> None:
        self._data = data
        self.size = data.nbytes

    def read(self, offset: int, length: int) -> bytes:
        return self._data[offset : offset + length].tobytes()

    def chunk(self, offset: int, length: int) -> np.ndarray:
        return self._data[offset : offset + length]


class _OpenFile:
    """A large file read by offset: structures into small buffers, tensor chunks into the rank's buffer."""

    def __init__(self, fd: int, size: int, file: _File, buffer: np.ndarray) -> None:
        self._fd, self._file, self._buffer = fd, file, buffer
        self.size = size

    def read(self, offset: int, length: int) -> bytes:
        data = np.empty(length, dtype=np.uint8)
        _pread_exactly(self._fd, data, offset, self._file.label)
        return data.tobytes()

    def chunk(self, offset: int, length: int) -> np.ndarray:
        chunk = self._buffer[:length]
        _pread_exactly(self._fd, chunk, offset, self._file.label)
        return chunk


def _open_source(io: RankIO, fd: int, file: _File) -> _WholeFile | _OpenFile:
    size = os.fstat(fd).st_size
    if size > io.chunk_bytes:
        return _OpenFile(fd, size, file, io.buffer)
    whole = io.buffer[:size]
    _pread_exactly(fd, whole, 0, file.label)
    return _WholeFile(whole)


def _checked(file: _File, source: _WholeFile | _OpenFile) -> list[TensorRecord]:
    """The file's tensor records once everything but their data checks out; IntegrityError names what does not."""
    try:
        return check_archive(source, file.expected)
    except FormatError as error:
        raise IntegrityError(f"{file.label}: {error}") from error


def _read_streaming(io: RankIO, file: _File) -> list[Problem]:
    """Checks the archive, then reads each tensor in buffer-sized chunks from its file offset."""
    fd = os.open(file.path, os.O_RDONLY)
    try:
        source = _open_source(io, fd, file)
        problems: list[Problem] = []
        for tensor in _checked(file, source):
            record = tensor.record
            chunks = (
                (offset, source.chunk(record.data_offset + offset, min(io.chunk_bytes, record.size - offset)))
                for offset in range(0, record.size, io.chunk_bytes)
            )
            problems += _check_tensor(io, file, tensor, chunks, MAX_REPORTED + 1 - len(problems))
            if len(problems) > MAX_REPORTED:
                break
        return problems
    finally:
        os.close(fd)


def _check_tensor(
    io: RankIO, file: _File, tensor: TensorRecord, chunks: Iterator[tuple[int, np.ndarray]], room: int
) -> list[Problem]:
    """Checks a tensor's payload and its record's CRC32 over the same chunks; stops after `room` bad blocks.

    The CRC's CPU time counts as checking time (`payload_cpu_s`). A tensor with bad blocks is reported by
    those, which say more than its CRC.
    """
    crc = 0
    problems: list[Problem] = []
    for offset, chunk in chunks:
        start = time.thread_time()
        crc = zlib.crc32(chunk, crc)
        io.payload_cpu_s += time.thread_time() - start
        found = io.verify(chunk, file.index, tensor.index, offset)
        problems += [Problem(file.label, tensor.spec.name, tensor.record.data_offset + m.offset, m) for m in found]
        if len(problems) >= room:
            return problems
    if not problems:
        try:
            check_crc(tensor.record, crc)
        except FormatError as error:
            raise IntegrityError(f"{file.label}: {error}") from error
    return problems


def _pread_exactly(fd: int, chunk: np.ndarray, file_offset: int, path: Path | str) -> None:
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
                f"{path}: truncated: the file is {file_offset + done} bytes, "
                f"the plan needs at least {file_offset + chunk.nbytes}"
            )
        done += count


def _read_with_torch_load(io: RankIO, file: _File) -> list[Problem]:
    """Reads the file with torch.load, then checks the archive and each tensor's bytes as torch loaded them."""
    try:
        state = torch.load(file.path, weights_only=True)
    except Exception as error:
        problems = _read_streaming(io, file)  # names the damage by record or file offset
        if problems:
            return problems
        raise IntegrityError(
            f"{file.label}: torch.load failed though every record checks out: {_first_line(error)}"
        ) from error
    fd = os.open(file.path, os.O_RDONLY)
    try:
        tensors = _checked(file, _open_source(io, fd, file))  # headers only: the data is in the loaded tensors
    finally:
        os.close(fd)
    _check_loaded(file, state, "torch.load")
    problems: list[Problem] = []
    for tensor in tensors:
        data = _tensor_bytes(state[tensor.spec.name])
        chunks = ((offset, data[offset : offset + io.chunk_bytes]) for offset in range(0, data.nbytes, io.chunk_bytes))
        problems += _check_tensor(io, file, tensor, chunks, MAX_REPORTED + 1 - len(problems))
        if len(problems) > MAX_REPORTED:
            break
    return problems


def _first_line(error: Exception) -> str:
    """An exception's message on one line (torch's weights_only errors run to paragraphs)."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


def _tensor_bytes(tensor: torch.Tensor) -> np.ndarray:
    return tensor.view(torch.uint8).numpy() if tensor.numel() else np.empty(0, np.uint8)


def _check_loaded(file: _File, state: Any, how: str) -> None:
    """What torch loaded must be the plan's tensors: names in order, dtypes, element counts."""
    wanted = [(t.name, t.dtype, t.numel) for t in file.expected.tensors]
    if not isinstance(state, dict):
        raise IntegrityError(f"{file.label}: {how} returned a {type(state).__name__}, not a dict of tensors")
    found = [
        (name, str(t.dtype).removeprefix("torch."), t.numel()) if isinstance(t, torch.Tensor) else (name, "?", -1)
        for name, t in state.items()
    ]
    if found != wanted:
        first = next((i for i, (a, b) in enumerate(zip(found, wanted, strict=False)) if a != b), len(wanted))
        shown = found[first] if first < len(found) else "nothing"
        planned = wanted[first] if first < len(wanted) else "nothing"
        raise IntegrityError(
            f"{file.label}: {how} gives tensor {first} as {shown} (name, dtype, elements); the plan has {planned}"
        )


def sampled_file(checkpoint: int, files: int) -> int:
    """The file a rank loads after restoring `checkpoint`: the rotation loads every file once in `files` checkpoints."""
    return checkpoint % files


def load_sample(io: RankIO, task: Any) -> dict[str, float]:
    """Rank side, after a verified read: torch.load(weights_only=True, mmap=True) of one of the rank's files.

    An independent check of the verifier, not part of the restore's I/O, so it runs after the rank's timed read
    ends and is reported apart (`torch_load_sampled` files in `torch_load_sampled_s` seconds): a restarting job
    loads each file once, which the timed read already did. The loaded tensors must be the plan's, and the first
    payload block of each must be right as torch maps it (from the page cache: the read just brought it there).
    """
    if not task.plan.files:
        return {"torch_load_sampled": 0, "torch_load_sampled_s": 0.0}
    start = time.monotonic()
    file = _file(io, task, sampled_file(io.checkpoint, len(task.plan.files)))
    try:
        state = torch.load(file.path, weights_only=True, mmap=True)
    except Exception as error:
        raise IntegrityError(
            f"{file.label}: torch.load(weights_only=True, mmap=True) failed though the verified read passed: "
            f"{_first_line(error)}"
        ) from error
    _check_loaded(file, state, "torch.load(mmap=True)")
    for index, spec in enumerate(file.expected.tensors):
        first_block = _tensor_bytes(state[spec.name])[:4096]
        for mismatch in io.verify(first_block, file.index, index, 0):
            raise IntegrityError(
                f"{file.label}: torch.load(mmap=True) sees tensor {spec.name!r} at tensor offset {mismatch.offset} "
                f"holding {mismatch.found}, though the verified read passed"
            )
    return {"torch_load_sampled": 1, "torch_load_sampled_s": time.monotonic() - start}


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
