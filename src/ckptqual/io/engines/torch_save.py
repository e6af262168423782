"""`torch-save` engine: each file built in memory and written with `torch.save`, as the review did, and read
back with `torch.load`, as a restarting job would.

Its tensor data is the payload, but torch.save writes the rest itself: its own pickle, a serialization id, and
the padding that aligns each tensor's data to 64 bytes (torch fills it with b"Z"), which this engine cannot make
keystream; the read checks that padding only as part of the file's layout, not byte for byte.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ckptqual.io.engines import readback
from ckptqual.io.engines.base import IntegrityError, Problem, RankIO, opened_path
from ckptqual.io.engines.readback import ArchiveFile, Chunks
from ckptqual.io.engines.torchformat import BYTEORDER, FILE_VERSION, FORMAT_VERSION
from ckptqual.io.engines.torchread.expected import ExpectedArchive, TensorRecord
from ckptqual.plan.model import FilePlan

TORCH_SAVE_ALIGNMENT = 64  # torch.save's default storage alignment (torch.serialization.config.save)


class TorchSaveEngine:
    """Holds a whole file's tensors in memory at once; the run refuses files over the memory budget."""

    name = "torch-save"

    def write(self, path: Path, spec: FilePlan, file_index: int, io: RankIO) -> None:
        state = {}
        for index, tensor in enumerate(spec.tensors):
            data = torch.empty(tensor.numel, dtype=getattr(torch, tensor.dtype))
            io.generate(data.view(torch.uint8).numpy(), file_index, index, 0)
            state[tensor.name] = data
        with os.fdopen(io.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL), "wb") as file:
            torch.save(state, file)

    def read(self, path: Path, spec: FilePlan, file_index: int, io: RankIO, label: str) -> list[Problem]:
        """torch.load, then the archive's structure and each tensor's bytes checked as torch loaded them; where
        torch.load fails, the streaming read names the damage by record or file offset."""
        file = ArchiveFile(path, label, file_index, self.expected_archive(spec, io.checkpoint, io.rank, file_index))
        with opened_path(io, path) as reached:
            try:
                state = torch.load(reached, weights_only=True)
            except Exception as error:
                problems = readback.read_archive(file, io)
                if problems:
                    return problems
                raise IntegrityError(
                    f"{label}: torch.load failed though every record checks out: {readback.first_line(error)}"
                ) from error
        tensors = readback.checked_tensors(file, io)  # headers only: the data is in the loaded tensors
        readback.check_loaded(label, state, spec.tensors, "torch.load")

        def chunks(tensor: TensorRecord) -> Chunks:
            data = readback.tensor_bytes(state[tensor.spec.name])
            return (
                (offset, data[offset : offset + io.chunk_bytes]) for offset in range(0, data.nbytes, io.chunk_bytes)
            )

        return readback.check_tensors(io, file, tensors, chunks)

    def expected_archive(self, spec: FilePlan, checkpoint: int, rank: int, file_index: int) -> ExpectedArchive:
        """What torch.save 2.x writes: its pickle and serialization id are torch's own (CRC-checked, the pickle
        also by content); the other small records are fixed."""
        records: dict[str, bytes | None] = {
            "data.pkl": None,
            ".format_version": FORMAT_VERSION,
            ".storage_alignment": str(TORCH_SAVE_ALIGNMENT).encode(),
            "byteorder": BYTEORDER,
            "version": FILE_VERSION,
            ".data/serialization_id": None,
        }
        return ExpectedArchive("torch.save", spec.tensors, records, TORCH_SAVE_ALIGNMENT)
