"""Checkpoint I/O engines, one per file, behind the `Engine` protocol of `base`."""

from __future__ import annotations

from ckptqual.io.engines.base import Engine
from ckptqual.io.engines.dcp import DcpEngine
from ckptqual.io.engines.safetensors import SafetensorsEngine
from ckptqual.io.engines.stream import StreamEngine
from ckptqual.io.engines.stream_direct import StreamDirectEngine
from ckptqual.io.engines.torch_save import TorchSaveEngine

ENGINES: dict[str, type] = {
    "stream": StreamEngine,
    "stream-direct": StreamDirectEngine,
    "torch-save": TorchSaveEngine,
    "dcp": DcpEngine,
    "safetensors": SafetensorsEngine,
}


def make_engine(name: str) -> Engine:
    """The engine called `name`; an unknown name lists the known ones."""
    if name not in ENGINES:
        raise ValueError(f"unknown engine {name!r}; use one of {', '.join(ENGINES)}")
    return ENGINES[name]()
