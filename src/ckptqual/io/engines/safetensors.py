"""`safetensors` engine: a Hugging Face safetensors shard, header and alignment as the `safetensors` library writes
them, the data generated a chunk at a time (memory flat in the checkpoint's size).

A shard is an 8-byte little-endian header length, a compact JSON header (`__metadata__` {"format": "pt"}, as
transformers' save_pretrained passes it, then each tensor's dtype, shape and data offsets, in the library's
order) padded with spaces to a multiple of 8 bytes, then the tensors' bytes back to back. A global tensor joins
the pieces the ranks hold; each piece is that rank's payload. Once every rank's shard is durable, the coordinator
writes `model.safetensors.index.json` as transformers writes it. The read checks every byte; `load_sample` then
has the library's `safe_open` read sampled tensors.
"""

from __future__ import annotations

import json
import os
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from ckptqual.io.engines.base import (
    MAX_REPORTED,
    IntegrityError,
    Problem,
    RankIO,
    commit_shared,
    write_all,
    write_payload,
)
from ckptqual.io.engines.rawfile import expect_bytes, read_at, read_into
from ckptqual.plan.model import DTYPE_BYTES, FilePlan, TensorSpec
from ckptqual.plan.safetensors import INDEX, Piece, ShardedRankPlan, ShardFile, file_order

DTYPES = {
    "float64": "F64",
    "float32": "F32",
    "bfloat16": "BF16",
    "float16": "F16",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
    "int8": "I8",
    "uint8": "U8",
}
HEADER_ALIGNMENT = 8
SAMPLE_BYTES = 4 << 20  # at most this much of a sampled tensor is read by safe_open (its start)
SAMPLED_TENSORS = 2


def header(tensors: tuple[TensorSpec, ...]) -> bytes:
    """The length field and the JSON header of a file holding `tensors` in this order."""
    entries: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for spec in tensors:
        where = [offset, offset + spec.nbytes]
        entries[spec.name] = {"dtype": DTYPES[spec.dtype], "shape": [spec.numel], "data_offsets": where}
        offset += spec.nbytes
    text = json.dumps(entries, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % HEADER_ALIGNMENT)
    return struct.pack("<Q", len(text)) + text


def index_bytes(plan: ShardedRankPlan) -> bytes:
    """`model.safetensors.index.json` as transformers writes it (indent 2, keys sorted, a final newline)."""
    index = {"metadata": {"total_size": plan.total_bytes}, "weight_map": dict(plan.weight_map)}
    return (json.dumps(index, indent=2, sort_keys=True) + "\n").encode()


class SafetensorsEngine:
    """Writes and reads one shard per call; `finish` and `check_shared` handle the coordinator's index."""

    name = "safetensors"

    def write(self, path: Path, spec: FilePlan, file_index: int, io: RankIO) -> None:
        shard = _shard(spec, file_index, io.rank)
        fd = io.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        try:
            write_all(fd, header(shard.tensors))
            for tensor, pieces in zip(shard.tensors, shard.pieces, strict=True):
                for piece, offset, count in _spans(pieces, tensor, 0, tensor.nbytes, io.chunk_bytes):
                    chunk = io.buffer[:count]
                    with io.acting_as(piece.rank):
                        io.generate(chunk, piece.file, piece.tensor, offset)
                    write_payload(io, fd, chunk)
        finally:
            os.close(fd)

    def finish(self, io: RankIO, task: Any) -> None:
        """After the rank's shard is durable: meet every rank, then the coordinator writes the index."""
        io.stage = "index"
        commit_shared(io, task, INDEX, lambda _: index_bytes(_plan(task.plan)))

    def check_shared(self, io: RankIO, task: Any) -> None:
        """Coordinator, before any read: the index must be, byte for byte, what was written."""
        if task.plan.rank != 0:
            return
        expected = index_bytes(_plan(task.plan))
        label = f"{Path(task.directory).name}/{INDEX}"
        fd = io.open(Path(task.directory) / INDEX, os.O_RDONLY)
        try:
            if read_at(fd, 0, len(expected) + 1, label) != expected:
                raise IntegrityError(f"{label}: not the index written")
        finally:
            os.close(fd)

    def read(self, path: Path, spec: FilePlan, file_index: int, io: RankIO, label: str) -> list[Problem]:
        shard = _shard(spec, file_index, io.rank)
        fd = io.open(path, os.O_RDONLY)
        try:
            head = header(shard.tensors)
            expect_bytes(fd, 0, head, label, "the safetensors header")
            problems: list[Problem] = []
            start = len(head)
            for tensor, pieces in zip(shard.tensors, shard.pieces, strict=True):
                problems += check_range(fd, io, tensor, pieces, 0, tensor.nbytes, start, label)
                if len(problems) > MAX_REPORTED:
                    return problems
                start += tensor.nbytes
            if not problems and os.fstat(fd).st_size != start:
                raise IntegrityError(f"{label}: {os.fstat(fd).st_size} bytes, {start} written")
            return problems
        finally:
            os.close(fd)

    def load_sample(self, io: RankIO, task: Any) -> dict[str, float]:
        """After the verified read: the library's `safe_open` reads SAMPLED_TENSORS of the rank's shard (rotating with
        the checkpoint; a tensor over SAMPLE_BYTES: its start), the header checked byte for byte first; they must
        equal the payload."""
        if not task.plan.files:
            return {"torch_load_sampled": 0, "torch_load_sampled_s": 0.0}
        start = time.monotonic()
        shard = _shard(task.plan.files[0], 0, io.rank)
        path = Path(task.directory) / shard.path
        label = f"{Path(task.directory).name}/{shard.path}"
        count = len(shard.tensors)
        chosen = [(io.checkpoint * SAMPLED_TENSORS + i) % count for i in range(min(SAMPLED_TENSORS, count))]
        fd = io.open(path, os.O_RDONLY)
        try:
            expect_bytes(fd, 0, header(shard.tensors), label, "the safetensors header")
            with safe_open(f"/proc/self/fd/{fd}", framework="pt") as opened:
                for index in chosen:
                    tensor, pieces = shard.tensors[index], shard.pieces[index]
                    elements = min(tensor.numel, max(1, SAMPLE_BYTES // DTYPE_BYTES[tensor.dtype]))
                    data = opened.get_slice(tensor.name)[:elements].contiguous().view(-1).view(torch.uint8).numpy()
                    for piece, offset, size in _spans(pieces, tensor, 0, data.nbytes, io.chunk_bytes):
                        at = _piece_start(pieces, piece, tensor) + offset
                        with io.acting_as(piece.rank):
                            found = io.verify(data[at : at + size], piece.file, piece.tensor, offset)
                        if found:
                            byte = at + found[0].offset - offset
                            raise IntegrityError(
                                f"{label}: safe_open sees tensor {tensor.name!r} at byte {byte} holding "
                                f"{found[0].found}, though the verified read passed"
                            )
        finally:
            os.close(fd)
        return {"torch_load_sampled": 1, "torch_load_sampled_s": time.monotonic() - start}


def check_range(
    fd: int, io: RankIO, tensor: TensorSpec, pieces: tuple[Piece, ...], first: int, end: int, start: int, label: str
) -> list[Problem]:
    """Reads bytes [first, end) of global tensor `tensor` (its data at file offset `start`) and checks each against
    the payload of the piece it belongs to."""
    problems: list[Problem] = []
    for piece, offset, count in _spans(pieces, tensor, first, end, io.chunk_bytes):
        at = start + _piece_start(pieces, piece, tensor) + offset
        chunk = io.buffer[:count]
        read_into(fd, chunk, at, label)
        with io.acting_as(piece.rank):
            found = io.verify(chunk, piece.file, piece.tensor, offset)
        problems += [Problem(label, tensor.name, at + m.offset - offset, m) for m in found]
        if len(problems) > MAX_REPORTED:
            break
    return problems


def _piece_start(pieces: tuple[Piece, ...], piece: Piece, tensor: TensorSpec) -> int:
    """Byte offset of `piece` in its global tensor."""
    width = DTYPE_BYTES[tensor.dtype]
    return sum(p.numel for p in pieces[: pieces.index(piece)]) * width


def _spans(
    pieces: tuple[Piece, ...], tensor: TensorSpec, first: int, end: int, step: int
) -> Iterator[tuple[Piece, int, int]]:
    """(piece, byte offset in the piece, byte count) covering bytes [first, end) of the global tensor, at most
    `step` bytes each, never across a piece."""
    width = DTYPE_BYTES[tensor.dtype]
    base = 0
    for piece in pieces:
        size = piece.numel * width
        low, high = max(first, base), min(end, base + size)
        for at in range(low, high, step):
            yield piece, at - base, min(step, high - at)
        base += size


def _shard(spec: FilePlan, file_index: int, rank: int) -> ShardFile:
    """`spec` as a shard: a plain file of the rank's own tensors becomes one, each tensor a piece of its own, in the
    library's order."""
    if isinstance(spec, ShardFile):
        return spec
    order = sorted(range(len(spec.tensors)), key=lambda i: file_order(spec.tensors[i]))
    pieces = tuple((Piece(rank, file_index, i, spec.tensors[i].numel),) for i in order)
    return ShardFile(spec.path, tuple(spec.tensors[i] for i in order), pieces)


def _plan(plan: Any) -> ShardedRankPlan:
    if not isinstance(plan, ShardedRankPlan):
        raise ValueError("the safetensors engine writes plans laid out by plan.safetensors (--format safetensors)")
    return plan
