"""Reading a checkpoint file back and proving it exact: the steps both engines' `read` share.

The archive is checked as `torch.load` needs it, without trusting torch (`torchread.expected.check_archive`), and
padding the writer made keystream is checked against it; then each tensor's bytes are read once, the payload check
and the record's CRC32 running over the same chunks. A wrong block is a Problem naming file, tensor and offset;
other damage an IntegrityError; a failed read a ReadBackError.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ckptqual.io import lanes
from ckptqual.io.crc import crc32
from ckptqual.io.engines.base import MAX_REPORTED, IntegrityError, Problem, RankIO
from ckptqual.io.engines.torchread.expected import ExpectedArchive, TensorRecord, check_archive
from ckptqual.io.engines.torchread.findings import FormatError, first_difference
from ckptqual.io.engines.torchread.records import check_crc
from ckptqual.io.engines.torchread.source import FileSource
from ckptqual.plan.model import TensorSpec

Chunks = Iterable[tuple[int, np.ndarray]]  # (tensor offset, bytes from there)


@dataclass(frozen=True)
class ArchiveFile:
    """One checkpoint file read back: where it is, how messages name it, its index in the rank's plan, what it holds."""

    path: Path
    label: str
    index: int
    expected: ExpectedArchive


@contextmanager
def _opened(file: ArchiveFile, io: RankIO) -> Iterator[FileSource]:
    fd = io.open(file.path, os.O_RDONLY)
    try:
        yield FileSource(fd, file.label, io.buffer)
    finally:
        os.close(fd)


def _checked(file: ArchiveFile, source: FileSource) -> list[TensorRecord]:
    """The file's tensor records, once everything but their data checks out; IntegrityError names what does not."""
    try:
        return check_archive(source, file.expected)
    except FormatError as error:
        raise IntegrityError(f"{file.label}: {error}") from error


def checked_tensors(file: ArchiveFile, io: RankIO) -> list[TensorRecord]:
    """Checks the archive's structure, records and pickle, not its tensor data; returns the tensor records."""
    with _opened(file, io) as source:
        return _checked(file, source)


def read_archive(file: ArchiveFile, io: RankIO) -> list[Problem]:
    """Checks the archive and its padding, then reads each tensor in buffer-sized chunks from its file offset."""
    with _opened(file, io) as source:
        tensors = _checked(file, source)
        if file.expected.padding_is_payload:
            check_padding(io, file, source, tensors)

        spans = [
            (tensor.record.data_offset + offset, min(io.chunk_bytes, tensor.record.size - offset))
            for tensor in tensors
            for offset in range(0, tensor.record.size, io.chunk_bytes)
        ]
        helpers = lanes.shared()
        ahead = (io.spare_buffer(), helpers) if helpers.count > 1 and source.size > io.chunk_bytes else None
        with closing(source.chunks(spans, ahead)) as pieces:

            def chunks(tensor: TensorRecord) -> Chunks:
                for offset in range(0, tensor.record.size, io.chunk_bytes):
                    yield offset, next(pieces)

            return check_tensors(io, file, tensors, chunks)


def check_padding(io: RankIO, file: ArchiveFile, source: FileSource, tensors: list[TensorRecord]) -> None:
    """Each tensor's alignment padding must be the keystream written there; an IntegrityError names the first wrong
    byte by record and file offset."""
    for tensor in tensors:
        record = tensor.record
        found = source.read(record.padding_offset, record.padding_bytes)
        wanted = io.padding(record.padding_bytes, file.index, tensor.index)
        if found != wanted:
            at = first_difference(found, wanted)
            raise IntegrityError(
                f"{file.label}: record {record.name}: padding byte at file offset {record.padding_offset + at} holds "
                f"0x{found[at]:02x}, the keystream written there is 0x{wanted[at]:02x} (the padding before tensor "
                f"{tensor.spec.name!r}'s data changed)"
            )


def check_tensors(
    io: RankIO, file: ArchiveFile, tensors: list[TensorRecord], chunks: Callable[[TensorRecord], Chunks]
) -> list[Problem]:
    """Checks each tensor's payload and CRC32 over its `chunks`; stops after MAX_REPORTED + 1 wrong blocks."""
    problems: list[Problem] = []
    for tensor in tensors:
        problems += _check_tensor(io, file, tensor, chunks(tensor), MAX_REPORTED + 1 - len(problems))
        if len(problems) > MAX_REPORTED:
            break
    return problems


def _check_tensor(io: RankIO, file: ArchiveFile, tensor: TensorRecord, chunks: Chunks, room: int) -> list[Problem]:
    """Checks a tensor's payload and its record's CRC32 over the same chunks; stops after `room` bad blocks.

    Where this rank wrote the tensor, the record must hold the CRC32 it took then: once every byte is proven to be
    the payload, the CRC of the bytes read is that value, so it is not taken again. Otherwise it is taken over the
    chunks, its CPU time counted as checking time (`payload_cpu_s`). A tensor with bad blocks is reported by those,
    which say more than its CRC.
    """
    written = io.written_crc(file.index, tensor.index, tensor.spec.nbytes)
    crc = 0
    problems: list[Problem] = []
    for offset, chunk in chunks:
        if written is None:
            with io.payload_time():
                crc = crc32(chunk, crc)
        found = io.verify(chunk, file.index, tensor.index, offset)
        problems += [Problem(file.label, tensor.spec.name, tensor.record.data_offset + m.offset, m) for m in found]
        if len(problems) >= room:
            return problems
    if problems:
        return problems
    if written is None:
        try:
            check_crc(tensor.record, crc)
        except FormatError as error:
            raise IntegrityError(f"{file.label}: {error}") from error
    elif written != tensor.record.crc:
        raise IntegrityError(
            f"{file.label}: record {tensor.record.name}: stored CRC32 0x{tensor.record.crc:08x} is not "
            f"0x{written:08x}, the CRC32 this rank took of the bytes it wrote there, which read back intact "
            "(the stored CRC changed)"
        )
    return problems


def check_loaded(label: str, state: Any, tensors: tuple[TensorSpec, ...], how: str) -> None:
    """What torch loaded must be the plan's tensors: names in order, dtypes, element counts."""
    wanted = [(t.name, t.dtype, t.numel) for t in tensors]
    if not isinstance(state, dict):
        raise IntegrityError(f"{label}: {how} returned a {type(state).__name__}, not a dict of tensors")
    found = [
        (name, str(t.dtype).removeprefix("torch."), t.numel()) if isinstance(t, torch.Tensor) else (name, "?", -1)
        for name, t in state.items()
    ]
    if found != wanted:
        first = first_difference(found, wanted)
        shown = found[first] if first < len(found) else "nothing"
        planned = wanted[first] if first < len(wanted) else "nothing"
        raise IntegrityError(
            f"{label}: {how} gives tensor {first} as {shown} (name, dtype, elements); the plan has {planned}"
        )


def first_line(error: Exception) -> str:
    """An exception's message on one line (torch's weights_only errors run to paragraphs)."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


def tensor_bytes(tensor: torch.Tensor) -> np.ndarray:
    """A loaded tensor's bytes, as uint8."""
    return tensor.view(torch.uint8).numpy() if tensor.numel() else np.empty(0, np.uint8)
