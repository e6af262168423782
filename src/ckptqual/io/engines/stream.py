"""`stream` engine: the torch.save format written chunk by chunk from one reusable buffer (bounded memory), and
read back the same way, in chunks at each tensor's file offset."""

from __future__ import annotations

from pathlib import Path

from ckptqual.io.engines.base import Problem, RankIO
from ckptqual.io.engines.readback import ArchiveFile, read_archive
from ckptqual.io.engines.torchformat import ALIGNMENT, TorchZipWriter, head_records, tail_records
from ckptqual.io.engines.torchread import ExpectedArchive
from ckptqual.plan.model import FilePlan


class StreamEngine:
    """Peak memory is one chunk buffer per rank, whatever the checkpoint size."""

    name = "stream"

    def write(self, path: Path, spec: FilePlan, file_index: int, io: RankIO) -> None:
        with open(path, "wb", buffering=0) as file:
            writer = TorchZipWriter(file, spec.tensors, serialization_id(io.checkpoint, io.rank, file_index))
            try:
                for index, tensor in enumerate(spec.tensors):
                    with writer.record(index) as record:
                        for offset in range(0, tensor.nbytes, io.chunk_bytes):
                            chunk = io.buffer[: min(io.chunk_bytes, tensor.nbytes - offset)]
                            io.generate(chunk, file_index, index, offset)
                            record.write(chunk)
                writer.close()
            except BaseException:
                writer.abandon()
                raise

    def read(self, path: Path, spec: FilePlan, file_index: int, io: RankIO, label: str) -> list[Problem]:
        expected = self.expected_archive(spec, io.checkpoint, io.rank, file_index)
        return read_archive(ArchiveFile(path, label, file_index, expected), io)

    def expected_archive(self, spec: FilePlan, checkpoint: int, rank: int, file_index: int) -> ExpectedArchive:
        """Every small record is known to the byte."""
        records: dict[str, bytes | None] = {
            **head_records(spec.tensors),
            **tail_records(serialization_id(checkpoint, rank, file_index)),
        }
        return ExpectedArchive("the stream engine", spec.tensors, records, ALIGNMENT)


def serialization_id(checkpoint: int, rank: int, file_index: int) -> str:
    """The file's `.data/serialization_id`: 40 digits like torch's, naming checkpoint, rank and file."""
    return f"{checkpoint:020d}{rank:010d}{file_index:010d}"
