"""`torch-save` engine: each file built in memory and written with `torch.save`, as the review did."""

from __future__ import annotations

from pathlib import Path

import torch

from ckptqual.io.engines.base import RankIO
from ckptqual.io.engines.torchformat import BYTEORDER, FILE_VERSION, FORMAT_VERSION
from ckptqual.io.engines.torchread import ExpectedArchive
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
        with open(path, "wb") as file:
            torch.save(state, file)


def expected_archive(spec: FilePlan, checkpoint: int, rank: int, file_index: int) -> ExpectedArchive:
    """What torch.save 2.x writes for one file: its pickle and serialization id are torch's own (CRC-checked, the
    pickle also by content); the other small records are fixed."""
    records: dict[str, bytes | None] = {
        "data.pkl": None,
        ".format_version": FORMAT_VERSION,
        ".storage_alignment": str(TORCH_SAVE_ALIGNMENT).encode(),
        "byteorder": BYTEORDER,
        "version": FILE_VERSION,
        ".data/serialization_id": None,
    }
    return ExpectedArchive("torch.save", spec.tensors, records, TORCH_SAVE_ALIGNMENT)
