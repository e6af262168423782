"""The tensor table of any torch.save archive: each tensor's name, dtype, size and the file offset of its bytes."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ckptqual.io.engines.torchformat import ARCHIVE
from ckptqual.io.engines.torchread.findings import FormatError
from ckptqual.io.engines.torchread.records import read_records
from ckptqual.io.engines.torchread.source import FileSource
from ckptqual.io.engines.torchread.table import unpickle_table
from ckptqual.plan.model import DTYPE_BYTES


@dataclass(frozen=True)
class StoredTensor:
    """One tensor of an archive: its name, dtype, element count and the file bytes that hold it."""

    name: str
    dtype: str
    numel: int
    data_offset: int
    nbytes: int


def read_table(path: Path) -> list[StoredTensor]:
    """The tensors of a torch.save archive in pickle order, with the file offset of each one's bytes."""
    fd = os.open(path, os.O_RDONLY)
    try:
        source = FileSource(fd, str(path), np.empty(0, dtype=np.uint8))
        records = {record.name: record for record in read_records(source)}
        pickled = records.get(f"{ARCHIVE}/data.pkl")
        if pickled is None:
            raise FormatError(f"record {ARCHIVE}/data.pkl is missing")
        table = unpickle_table(source.read(pickled.data_offset, pickled.size))
    finally:
        os.close(fd)
    stored = []
    for tensor in table:
        record = records.get(f"{ARCHIVE}/data/{tensor.key}")
        dtype = tensor.storage_dtype
        if record is None or dtype not in DTYPE_BYTES:
            raise FormatError(f"tensor {tensor.name!r}: no readable storage record (key {tensor.key})")
        numel = int(np.prod(tensor.size, dtype=np.int64))
        element_bytes = DTYPE_BYTES[dtype]
        offset = record.data_offset + tensor.offset * element_bytes
        stored.append(StoredTensor(tensor.name, dtype, numel, offset, numel * element_bytes))
    return stored
