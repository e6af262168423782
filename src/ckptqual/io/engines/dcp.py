"""`dcp` engine: the files of torch.distributed.checkpoint's FileSystemWriter (single_file_per_rank, sync_files).

Each rank writes its `__{rank}_{i}.distcp` files, every tensor in them the archive torch.save writes for it
(`torcharchive`), its payload generated chunk by chunk (memory flat in the checkpoint's size); the rank fsyncs
them (runs.save). Then every rank meets the others, and the coordinator (rank 0) writes the pickled `Metadata`
to `.metadata.tmp`, fsyncs it, renames it to `.metadata` and fsyncs the directory: the checkpoint is done once
that rename is durable. The read checks every byte of every file against what was written, and `.metadata`
byte for byte before anything unpickles it; `load_sample` then has torch's own `dcp.load` read sampled chunks.
"""

from __future__ import annotations

import functools
import os
import pickle
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint import load as dcp_load
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadPlan
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

from ckptqual.io.crc import crc32
from ckptqual.io.engines.base import (
    MAX_REPORTED,
    IntegrityError,
    Problem,
    RankIO,
    commit_shared,
    write_all,
    write_payload,
)
from ckptqual.io.engines.rawfile import expect_bytes, first_difference, read_at, read_into
from ckptqual.io.engines.torcharchive import archive_of
from ckptqual.plan.dcp import METADATA, METADATA_TMP, DcpLayout, DcpRankPlan
from ckptqual.plan.model import DTYPE_BYTES, FilePlan, TensorSpec

DCP_VERSION = "1.0.0"  # torch 2.13's CURRENT_DCP_VERSION
SAMPLE_BYTES = 4 << 20  # at most this much of a sampled chunk is loaded by dcp.load (its start)
SAMPLED_CHUNKS = 2  # chunks of its own each rank has dcp.load read after a restore


class DcpEngine:
    """Writes and reads one `.distcp` file per call; `finish` and `check_shared` handle the coordinator's
    `.metadata`."""

    name = "dcp"

    def write(self, path: Path, spec: FilePlan, file_index: int, io: RankIO) -> None:
        fd = io.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        try:
            for index, tensor in enumerate(spec.tensors):
                archive = archive_of(tensor)
                write_all(fd, archive.head)
                crc = offset = 0
                while offset < tensor.nbytes:
                    chunk = io.buffer[: min(io.chunk_bytes, tensor.nbytes - offset)]
                    io.generate(chunk, file_index, index, offset)
                    crc = crc32(chunk, crc)
                    write_payload(io, fd, chunk)
                    offset += chunk.nbytes
                io.remember_crc(file_index, index, tensor.nbytes, crc)
                write_all(fd, archive.tail(crc))
        finally:
            os.close(fd)

    def finish(self, io: RankIO, task: Any) -> None:
        """After the rank's files are durable: meet every rank, then the coordinator commits `.metadata`."""
        io.stage = "metadata"
        seed = save_id(io.generator.seed, io.checkpoint)
        commit_shared(io, task, METADATA, lambda at: metadata_bytes(_layout(task.plan), str(at), seed), METADATA_TMP)

    def check_shared(self, io: RankIO, task: Any) -> None:
        """Coordinator, before any read: `.metadata` must be, byte for byte, what was written."""
        if task.plan.rank == 0:
            checked_metadata(io, task)

    def read(self, path: Path, spec: FilePlan, file_index: int, io: RankIO, label: str) -> list[Problem]:
        fd = io.open(path, os.O_RDONLY)
        try:
            return _read_file(fd, spec, file_index, io, label)
        finally:
            os.close(fd)

    def load_sample(self, io: RankIO, task: Any) -> dict[str, float]:
        """After the verified read: torch's `dcp.load` (one process, no process group) reads SAMPLED_CHUNKS of this
        rank's chunks, rotating with the checkpoint, into tensors of their planned shapes (a chunk over
        SAMPLE_BYTES: its start), `.metadata` checked byte for byte first; they must equal the payload."""
        start = time.monotonic()
        plan = task.plan
        own = _layout(plan).of_rank(plan.rank)
        if not own:
            return {"torch_load_sampled": 0, "torch_load_sampled_s": 0.0}
        first = io.checkpoint * SAMPLED_CHUNKS % len(own)
        sampled = [own[(first + i) % len(own)] for i in range(min(SAMPLED_CHUNKS, len(own)))]
        windows = {c.spec.name: (c.offset, _sampled_elements(c.spec)) for c in sampled}
        state = {c.spec.name: torch.empty(windows[c.spec.name][1], dtype=getattr(torch, c.spec.dtype)) for c in sampled}
        metadata = checked_metadata(io, task)
        directory = Path(task.directory)
        with io.directory(directory) as handle, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns that it assumes one process: it is one here
            reader = _CheckedReader(f"/proc/self/fd/{handle}", metadata)
            try:
                dcp_load(state, storage_reader=reader, planner=_WindowPlanner(windows))
            except Exception as error:
                message = f"{directory.name}: dcp.load failed though the verified read passed: {error}"
                raise IntegrityError(message) from error
        for chunk in sampled:
            data = state[chunk.spec.name].view(torch.uint8).numpy()
            for mismatch in io.verify(data, chunk.file, chunk.tensor, 0):
                raise IntegrityError(
                    f"{directory.name}/__{plan.rank}_{chunk.file}.distcp: dcp.load sees tensor {chunk.spec.name!r} at "
                    f"tensor offset {mismatch.offset} holding {mismatch.found}, though the verified read passed"
                )
        return {"torch_load_sampled": 1, "torch_load_sampled_s": time.monotonic() - start}


def _sampled_elements(spec: TensorSpec) -> int:
    """Elements of a chunk that dcp.load reads: all of them, or the first SAMPLE_BYTES' worth."""
    return min(spec.numel, max(1, SAMPLE_BYTES // DTYPE_BYTES[spec.dtype]))


def _layout(plan: Any) -> DcpLayout:
    if not isinstance(plan, DcpRankPlan) or plan.layout is None:
        raise ValueError("the dcp engine writes plans laid out by plan.dcp.dcp_plan (--format dcp)")
    return plan.layout


def save_id(seed: int, checkpoint: int) -> str:
    """The `save_id` recorded in `.metadata`: torch draws a UUID; this one names the run's seed and checkpoint."""
    return f"ckptqual-{seed:08x}-{checkpoint:08d}"


@functools.lru_cache(maxsize=16)
def metadata_bytes(layout: DcpLayout, checkpoint_id: str, save: str) -> bytes:
    """The `.metadata` FileSystemWriter.finish pickles for `layout`: global tensors with their chunks, and where each
    chunk's torch.save archive lies (file, offset, length)."""
    sizes = layout.global_numel()
    state: dict[str, TensorStorageMetadata] = {}
    storage: dict[MetadataIndex, _StorageInfo] = {}
    offsets: dict[tuple[int, int], int] = {}
    names: dict[tuple[int, int], str] = {}
    for chunk in layout.chunks:
        spec = chunk.spec
        entry = state.get(spec.name)
        if entry is None:
            properties = TensorProperties(dtype=getattr(torch, spec.dtype))
            entry = state[spec.name] = TensorStorageMetadata(properties, torch.Size([sizes[spec.name]]), [])
        index = MetadataIndex(spec.name, torch.Size([chunk.offset]), len(entry.chunks))
        entry.chunks.append(ChunkStorageMetadata(torch.Size([chunk.offset]), torch.Size([spec.numel])))
        at = offsets.get((chunk.rank, chunk.file), 0)
        length = archive_of(spec).nbytes
        name = names.setdefault((chunk.rank, chunk.file), f"__{chunk.rank}_{chunk.file}.distcp")
        storage[index] = _StorageInfo(name, at, length)  # one str per file, as torch's: the pickle memoizes it
        offsets[(chunk.rank, chunk.file)] = at + length
    metadata = Metadata(
        state_dict_metadata=dict(state),
        planner_data={name: (name,) for name in state},
        storage_data=storage,
        storage_meta=StorageMeta(checkpoint_id=Path(checkpoint_id), save_id=save),
        version=DCP_VERSION,
    )
    return pickle.dumps(metadata)


def checked_metadata(io: RankIO, task: Any, layout: DcpLayout | None = None) -> bytes:
    """`.metadata` as read from the drive, refused unless it is byte for byte what the coordinator wrote for the
    layout (default: the task's plan's); nothing has unpickled it."""
    directory = Path(task.directory)
    layout = layout if layout is not None else _layout(task.plan)
    expected = metadata_bytes(layout, str(directory), save_id(io.generator.seed, io.checkpoint))
    fd = io.open(directory / METADATA, os.O_RDONLY)
    try:
        found = read_at(fd, 0, len(expected) + 1, f"{directory.name}/{METADATA}")
    finally:
        os.close(fd)
    if found != expected:
        at = first_difference(found, expected)
        raise IntegrityError(
            f"{directory.name}/{METADATA}: not the metadata written ({len(found)} bytes, {len(expected)} expected; "
            f"first difference at byte {at}); refused before anything unpickled it"
        )
    return found


class _CheckedReader(FileSystemReader):
    """torch's FileSystemReader, given the `.metadata` bytes already checked instead of reading them itself."""

    def __init__(self, path: str, metadata: bytes) -> None:
        super().__init__(path)
        self._metadata = metadata

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        metadata = pickle.loads(self._metadata)  # the bytes written, proven equal: no pickle from the drive
        metadata.storage_meta.load_id = self.load_id
        return metadata


class _WindowPlanner(DefaultLoadPlanner):
    """Reads, for each tensor of the state dict, the elements [start, start + n) of its global tensor: the chunk
    request a DTensor's resharding load makes (`create_read_items_for_chunk_list`)."""

    def __init__(self, windows: dict[str, tuple[int, int]]) -> None:
        super().__init__()
        self._windows = windows

    def create_local_plan(self) -> LoadPlan:
        if self.metadata is None:
            raise RuntimeError("a load plan is made only after set_up_planner gave the planner the metadata")
        items = []
        for name, (start, count) in self._windows.items():
            chunk = ChunkStorageMetadata(torch.Size([start]), torch.Size([count]))
            stored = self.metadata.state_dict_metadata[name]
            if not isinstance(stored, TensorStorageMetadata):
                raise ValueError(f"{name}: the checkpoint holds bytes there, not a tensor to read a window of")
            items += create_read_items_for_chunk_list(name, stored, [chunk])
        return LoadPlan(items)

    def lookup_tensor(self, index: MetadataIndex) -> torch.Tensor:
        """The window's tensor (a DTensor's local shard would be found by its offset; a plain tensor is the window)."""
        return self.state_dict[index.fqn]


def _read_file(fd: int, spec: FilePlan, file_index: int, io: RankIO, label: str) -> list[Problem]:
    """Every byte of one `.distcp` file: each archive's head and tail exactly torch.save's, each tensor's payload."""
    position = 0
    problems: list[Problem] = []
    for index, tensor in enumerate(spec.tensors):
        archive = archive_of(tensor)
        expect_bytes(fd, position, archive.head, label, f"tensor {tensor.name!r}'s torch.save archive head")
        position += len(archive.head)
        written = io.written_crc(file_index, index, tensor.nbytes)
        crc = offset = 0
        while offset < tensor.nbytes:
            chunk = io.buffer[: min(io.chunk_bytes, tensor.nbytes - offset)]
            read_into(fd, chunk, position + offset, label)
            if written is None:
                with io.payload_time():
                    crc = crc32(chunk, crc)
            found = io.verify(chunk, file_index, index, offset)
            problems += [Problem(label, tensor.name, position + m.offset, m) for m in found]
            if len(problems) > MAX_REPORTED:
                return problems
            offset += chunk.nbytes
        position += tensor.nbytes
        tail = archive.tail(crc if written is None else written)
        if not problems:  # a tensor with bad blocks is told by those; its CRC cannot match
            what = f"tensor {tensor.name!r}'s torch.save archive tail (CRC, directory)"
            expect_bytes(fd, position, tail, label, what)
        position += len(tail)
    if not problems and os.fstat(fd).st_size != position:
        raise IntegrityError(f"{label}: {os.fstat(fd).st_size} bytes, {position} written")
    return problems
