"""`torch-save` engine: each file built in memory and written with `torch.save`, as the review did."""

from __future__ import annotations

from pathlib import Path

import torch

from ckptqual.engines.base import RankIO
from ckptqual.plan import FilePlan


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
