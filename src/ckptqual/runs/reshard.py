"""Restore onto another parallel layout (`--restore-layout TPxPP`): each new rank reads, from the files the old
layout wrote, what it needs for its shards, and every byte it reads is verified.

What a new rank needs is plan.reshard's; what it reads for that depends on the format:

- `dcp`: the whole item (the torch.save archive) of every chunk that overlaps a needed range, located by the
  metadata's chunk offsets: DCP's own resharding load reads each overlapping item whole, then narrows it.
- `safetensors`: exactly the overlapping byte ranges, located by the header's data offsets, plus the header of
  each shard it opens.
- `torch-save`: the whole of every file that holds an overlapping piece: a torch.save archive cannot be read by
  ranges.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ckptqual.io.crc import crc32
from ckptqual.io.engines import make_engine
from ckptqual.io.engines.base import MAX_REPORTED, IntegrityError, Problem, RankIO
from ckptqual.io.engines.dcp import checked_metadata
from ckptqual.io.engines.rawfile import expect_bytes, read_into
from ckptqual.io.engines.safetensors import header
from ckptqual.io.engines.torcharchive import archive_of
from ckptqual.io.payload import BLOCK_BYTES, Mismatch
from ckptqual.plan.dcp import METADATA, DcpRankPlan
from ckptqual.plan.model import DTYPE_BYTES, CheckpointPlan, FilePlan, RankPlan, TensorSpec
from ckptqual.plan.reshard import Need, new_layout_needs, parse_layout
from ckptqual.plan.safetensors import Piece, ShardFile
from ckptqual.plan.workloads import Workload


@dataclass(frozen=True)
class Read:
    """One read of a new rank: `length` bytes at `offset` of the old file `path`, and how to check them.

    kind "payload": the bytes are payload of (owner, file, tensor) from byte `tensor_offset`; "archive": a whole
    DCP item, the torch.save archive of `spec` holding that payload; "bytes": exactly `expected`; "metadata": DCP's
    `.metadata` of the layout `spec`, byte for byte; "file": the whole torch.save file `spec`, file `file` of rank
    `owner`, read by `engine`.
    """

    path: str
    offset: int
    length: int
    kind: str
    owner: int = 0
    file: int = 0
    tensor: int = 0
    tensor_offset: int = 0
    spec: Any = None
    expected: bytes = b""


@dataclass(frozen=True)
class ReshardRankPlan(RankPlan):
    """A new rank's reads of the old checkpoint; `files` stays the old rank's (their pages are evicted first)."""

    reads: tuple[Read, ...] = ()
    engine: str = "stream"


def layout_plans(workload: Workload, scale: float, formatted: CheckpointPlan, layout: str, engine: str) -> tuple:
    """Every new rank's reads for a restore onto `layout` (TPxPP) of the checkpoint `formatted`, `workload`'s plan
    at `scale` laid out in its format and read (torch-save files) by `engine`."""
    source = workload.plan().scaled(scale)
    return reshard_plans(formatted, source, new_layout_needs(workload, source, *parse_layout(layout)), engine)


def reshard_plans(formatted: CheckpointPlan, source: CheckpointPlan, needs: list[list[Need]], engine: str) -> tuple:
    """Each new rank's plan of reads of the checkpoint `formatted` (laid out from `source`), given its needs."""
    first = formatted.ranks[0]
    plans = []
    for rank, own in zip(formatted.ranks, needs, strict=True):
        if isinstance(first, DcpRankPlan):  # the coordinator reads `.metadata` first, as DCP's load does
            metadata = [Read(METADATA, 0, 0, "metadata", spec=first.layout)] if rank.rank == 0 else []
            reads = metadata + _dcp_reads(first, own)
        elif formatted.ranks and any(isinstance(f, ShardFile) for r in formatted.ranks for f in r.files):
            reads = _safetensors_reads(formatted, own)
        else:
            reads = _whole_file_reads(source, own)
        plans.append(ReshardRankPlan(rank.rank, rank.files, tuple(reads), engine))
    return tuple(plans)


def _overlap(start: int, numel: int, need: Need) -> tuple[int, int] | None:
    low, high = max(start, need.start), min(start + numel, need.start + need.numel)
    return (low, high) if low < high else None


def _dcp_reads(plan: DcpRankPlan, needs: list[Need]) -> list[Read]:
    """The whole item of every chunk overlapping a need (as DCP's resharding load reads it)."""
    layout = plan.layout
    if layout is None:
        raise ValueError(f"rank {plan.rank}'s DCP plan came without the checkpoint's layout")
    places: dict[tuple[int, int, int], int] = {}
    ends: dict[tuple[int, int], int] = {}
    for chunk in layout.chunks:
        at = ends.get((chunk.rank, chunk.file), 0)
        places[(chunk.rank, chunk.file, chunk.tensor)] = at
        ends[(chunk.rank, chunk.file)] = at + archive_of(chunk.spec).nbytes
    reads = []
    for need in needs:
        for chunk in layout.chunks:
            if chunk.spec.name == need.name and _overlap(chunk.offset, chunk.spec.numel, need):
                path = f"__{chunk.rank}_{chunk.file}.distcp"
                at = places[(chunk.rank, chunk.file, chunk.tensor)]
                length = archive_of(chunk.spec).nbytes
                reads.append(Read(path, at, length, "archive", chunk.rank, chunk.file, chunk.tensor, 0, chunk.spec))
    return reads


def _safetensors_reads(plan: CheckpointPlan, needs: list[Need]) -> list[Read]:
    """Each shard's header once, then exactly the bytes of each piece that overlap a need."""
    located: dict[str, list[tuple[ShardFile, int, int, Piece]]] = {}  # name -> (shard, file offset, element, piece)
    for shard_file in (f for r in plan.ranks for f in r.files if isinstance(f, ShardFile)):
        at = len(header(shard_file.tensors))
        for spec, pieces in zip(shard_file.tensors, shard_file.pieces, strict=True):
            base = 0
            for piece in pieces:
                located.setdefault(spec.name, []).append((shard_file, at + base * DTYPE_BYTES[spec.dtype], base, piece))
                base += piece.numel
            at += spec.nbytes
    reads: list[Read] = []
    opened: set[str] = set()
    for need in needs:
        for shard_file, at, base, piece in located[need.name]:
            span = _overlap(base, piece.numel, need)
            if span is None:
                continue
            if shard_file.path not in opened:
                opened.add(shard_file.path)
                head = header(shard_file.tensors)
                reads.append(Read(shard_file.path, 0, len(head), "bytes", expected=head))
            width = DTYPE_BYTES[_dtype(shard_file, need.name)]
            offset, length = (span[0] - base) * width, (span[1] - span[0]) * width
            identity = (piece.rank, piece.file, piece.tensor, offset)
            reads.append(Read(shard_file.path, at + offset, length, "payload", *identity))
    return reads


def _dtype(shard_file: ShardFile, name: str) -> str:
    return next(spec.dtype for spec in shard_file.tensors if spec.name == name)


def _whole_file_reads(source: CheckpointPlan, needs: list[Need]) -> list[Read]:
    """The whole of every torch.save file holding a piece that overlaps a need, each once."""
    offsets: dict[str, int] = {}
    wanted: dict[tuple[int, int], FilePlan] = {}
    for rank in source.ranks:
        for index, file in enumerate(rank.files):
            for spec in file.tensors:
                start = offsets.get(spec.name, 0)
                offsets[spec.name] = start + spec.numel
                if any(n.name == spec.name and _overlap(start, spec.numel, n) for n in needs):
                    wanted[(rank.rank, index)] = file
    return [Read(file.path, 0, 0, "file", rank, index, 0, 0, file) for (rank, index), file in sorted(wanted.items())]


def read_for_layout(io: RankIO, task: Any) -> int:
    """Rank side: does the rank's reads of the old checkpoint, checking every byte; returns the bytes read."""
    plan: ReshardRankPlan = task.plan
    directory = Path(task.directory)
    moved = 0
    problems: list[Problem] = []
    for read in plan.reads:
        label = f"{directory.name}/{read.path}"
        if read.kind == "file":
            with io.acting_as(read.owner):
                problems += make_engine(plan.engine).read(directory / read.path, read.spec, read.file, io, label)
            moved += os.stat(directory / read.path, follow_symlinks=False).st_size
            continue
        if read.kind == "metadata":
            moved += len(checked_metadata(io, task, read.spec))
            continue
        fd = io.open(directory / read.path, os.O_RDONLY)
        try:
            if read.kind == "bytes":
                expect_bytes(fd, read.offset, read.expected, label, "the header")
            elif read.kind == "archive":
                problems += _check_archive(fd, io, read, label)
            else:
                problems += _check_payload(fd, io, read, read.offset, read.tensor_offset, read.length, label)[0]
        finally:
            os.close(fd)
        moved += read.length
        if len(problems) > MAX_REPORTED:
            break
    if problems:
        raise IntegrityError("; ".join(p.describe() for p in problems[:MAX_REPORTED]))
    return moved


def _check_archive(fd: int, io: RankIO, read: Read, label: str) -> list[Problem]:
    """A whole DCP item: torch.save's head and tail exact, the payload between them."""
    spec: TensorSpec = read.spec
    archive = archive_of(spec)
    expect_bytes(fd, read.offset, archive.head, label, f"tensor {spec.name!r}'s torch.save archive head")
    start = read.offset + archive.data_offset
    problems, crc = _check_payload(fd, io, read, start, 0, spec.nbytes, label)
    if not problems:  # the tail's records carry the CRC of the bytes just proven to be the payload
        expect_bytes(fd, start + spec.nbytes, archive.tail(crc), label, f"tensor {spec.name!r}'s archive tail")
    return problems


def _check_payload(
    fd: int, io: RankIO, read: Read, at: int, offset: int, length: int, label: str
) -> tuple[list[Problem], int]:
    """`length` bytes at file offset `at`, the payload of the read's owner from byte `offset`; with their CRC-32."""
    problems: list[Problem] = []
    done = crc = 0
    name = read.spec.name if isinstance(read.spec, TensorSpec) else f"tensor {read.tensor}"
    while done < length:
        chunk = io.buffer[: min(io.chunk_bytes, length - done)]
        read_into(fd, chunk, at + done, label)
        with io.acting_as(read.owner):
            found = _verify(io, chunk, read.file, read.tensor, offset + done)
        with io.payload_time():
            crc = crc32(chunk, crc)
        problems += [Problem(label, name, at + m.offset - offset, m) for m in found]
        done += chunk.nbytes
    return problems, crc


def _verify(io: RankIO, data: np.ndarray, file: int, tensor: int, offset: int) -> list[Mismatch]:
    """The payload check of bytes from any tensor offset: a range read by its exact bytes (a safetensors piece's
    overlap) may start inside a payload block, which is then made whole and compared in part."""
    lead = offset % BLOCK_BYTES
    if lead == 0:
        return io.verify(data, file, tensor, offset)
    with io.payload_time():
        expected = np.empty(lead + data.nbytes, dtype=np.uint8)
        io.generator.fill(expected, io.checkpoint, io.rank, file, tensor, offset - lead)
        differ = np.flatnonzero(expected[lead:] != data)
    if differ.size == 0:
        return []
    return [Mismatch(offset + int(differ[0]), f"{differ.size} bytes other than the payload from here")]


def distinct_bytes(plans: tuple[ReshardRankPlan, ...], file_bytes: Callable[[str], int]) -> int:
    """Bytes of the checkpoint's files that some rank reads, each counted once (what the drive must deliver: a piece
    two ranks read is served once, then from the page cache); `file_bytes(path)`: a file's size."""
    spans: dict[str, list[tuple[int, int]]] = {}
    whole: set[str] = set()
    for plan in plans:
        for read in plan.reads:
            if read.kind in ("file", "metadata"):
                whole.add(read.path)
            else:
                spans.setdefault(read.path, []).append((read.offset, read.offset + read.length))
    total = sum(file_bytes(path) for path in whole)
    for path, ranges in spans.items():
        if path in whole:
            continue
        end = 0
        for low, high in sorted(ranges):
            total += max(0, high - max(low, end))
            end = max(end, high)
    return total


def figures(
    plans: tuple[ReshardRankPlan, ...], moved: list[int], checkpoint_bytes: int, layouts: str
) -> dict[str, Any]:
    """Per new rank the bytes read and from how many files, and the read amplification (bytes read / checkpoint
    payload bytes); `layouts`: "TPxPP -> TPxPP"."""
    ranks = [
        {"rank": plan.rank, "bytes_read": count, "files": len({read.path for read in plan.reads})}
        for plan, count in zip(plans, moved, strict=True)
    ]
    total = sum(moved)
    whole = any(read.kind == "file" for plan in plans for read in plan.reads)
    return {
        "layouts": layouts,
        "reads": "whole files (torch.save archives cannot be read by ranges)" if whole else "byte ranges",
        "ranks": ranks,
        "bytes_read": total,
        "checkpoint_bytes": checkpoint_bytes,
        "read_amplification": total / checkpoint_bytes,
    }
