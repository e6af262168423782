"""Checkpoint I/O engines, one per file, behind the `Engine` protocol of `base`. An engine's module is imported when
the engine is first made: a rank that writes torch.save files never loads torch.distributed.checkpoint."""

from __future__ import annotations

import importlib

from ckptqual.io.engines.base import Engine

ENGINES: dict[str, str] = {  # name: the module of this package and the class in it
    "stream": "stream:StreamEngine",
    "stream-direct": "stream_direct:StreamDirectEngine",
    "torch-save": "torch_save:TorchSaveEngine",
    "dcp": "dcp:DcpEngine",
    "safetensors": "safetensors:SafetensorsEngine",
}


def make_engine(name: str) -> Engine:
    """The engine called `name`; an unknown name lists the known ones."""
    if name not in ENGINES:
        raise ValueError(f"unknown engine {name!r}; use one of {', '.join(ENGINES)}")
    module, engine = ENGINES[name].split(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), engine)()
