"""`stream` engine: the torch.save format written chunk by chunk from one reusable buffer (bounded memory)."""

from __future__ import annotations

from pathlib import Path

from ckptqual.engines.base import RankIO
from ckptqual.engines.torchformat import TorchZipWriter
from ckptqual.plan import FilePlan


class StreamEngine:
    """Peak memory is one chunk buffer per rank, whatever the checkpoint size."""

    name = "stream"

    def write(self, path: Path, spec: FilePlan, file_index: int, io: RankIO) -> None:
        with open(path, "wb", buffering=0) as file:
            writer = TorchZipWriter(file, spec.tensors, f"{io.checkpoint:020d}{io.rank:010d}{file_index:010d}")
            for index, tensor in enumerate(spec.tensors):
                with writer.record(index) as record:
                    for offset in range(0, tensor.nbytes, io.chunk_bytes):
                        chunk = io.buffer[: min(io.chunk_bytes, tensor.nbytes - offset)]
                        io.generate(chunk, file_index, index, offset)
                        record.write(chunk)
            writer.close()
