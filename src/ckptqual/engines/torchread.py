"""Reading a torch.save archive without torch.load: the tensor table from `data.pkl` and where each record lies.

`data.pkl` is read by a restricted unpickler that builds no tensors and accepts only the globals a
tensor state dict uses, so the streaming reader can check names, dtypes and sizes and then read each
tensor's bytes in chunks straight from its file offset.
"""

from __future__ import annotations

import pickle
import struct
import zipfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch

_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")
_STORAGE_DTYPES = {
    name: str(dtype).removeprefix("torch.") for dtype, name in torch.storage._dtype_to_storage_type_map().items()
}


class FormatError(ValueError):
    """The file is not a readable torch.save archive of the expected tensors."""


@dataclass(frozen=True)
class StoredTensor:
    """One tensor of an archive: its name, dtype, element count and the file bytes that hold it."""

    name: str
    dtype: str
    numel: int
    data_offset: int
    nbytes: int


@dataclass(frozen=True)
class _Global:
    name: str


@dataclass(frozen=True)
class _Rebuilt:
    storage: tuple
    offset: int
    size: tuple
    dtype: str | None


def _rebuild(storage: tuple, offset: int, size: tuple, stride: tuple, *rest: Any) -> _Rebuilt:
    dtype = rest[-1].name if rest and isinstance(rest[-1], _Global) else None
    return _Rebuilt(storage, offset, tuple(size), dtype)


class _TableUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("collections", "OrderedDict"):
            return OrderedDict
        if module == "torch._utils" and name in ("_rebuild_tensor_v2", "_rebuild_tensor_v3"):
            return _rebuild
        if module in ("torch", "torch.storage"):
            return _Global(name)
        raise pickle.UnpicklingError(f"unexpected global {module}.{name} in data.pkl")

    def persistent_load(self, pid: Any) -> tuple:
        return tuple(pid)


def _data_offset(file: BinaryIO, path: Path, info: zipfile.ZipInfo) -> int:
    file.seek(info.header_offset)
    header = _LOCAL_HEADER.unpack(file.read(_LOCAL_HEADER.size))
    if header[0] != b"PK\x03\x04":
        raise FormatError(f"{path}: no zip local header at offset {info.header_offset} for {info.filename}")
    return info.header_offset + _LOCAL_HEADER.size + header[9] + header[10]


def read_table(path: Path, file: BinaryIO | None = None) -> list[StoredTensor]:
    """The tensors of a torch.save archive in pickle order, with their file offsets; raises FormatError.

    `file` may hold the archive's bytes already (e.g. a small file read whole), else `path` is opened.
    """
    if file is None:
        with open(path, "rb") as opened:
            return read_table(path, opened)
    try:
        with zipfile.ZipFile(file) as archive:
            names = archive.namelist()
            pickles = [n for n in names if n.endswith("/data.pkl")]
            if len(pickles) != 1:
                raise FormatError(f"{path}: expected one data.pkl record, found {len(pickles)}")
            prefix = pickles[0].removesuffix("data.pkl")
            state = _TableUnpickler(archive.open(pickles[0])).load()
            infos = {info.filename: info for info in archive.infolist()}
    except (zipfile.BadZipFile, pickle.UnpicklingError, EOFError) as error:
        raise FormatError(f"{path}: not a torch.save archive: {error}") from error
    if not isinstance(state, dict):
        raise FormatError(f"{path}: data.pkl holds a {type(state).__name__}, not a dict of tensors")
    table = []
    for name, tensor in state.items():
        if not isinstance(tensor, _Rebuilt):
            raise FormatError(f"{path}: entry {name!r} is not a tensor")
        _, storage_type, key, _, _ = tensor.storage
        dtype = tensor.dtype or _STORAGE_DTYPES.get(storage_type.name)
        info = infos.get(f"{prefix}data/{key}")
        if dtype is None or info is None:
            raise FormatError(f"{path}: tensor {name!r} has no readable storage record (key {key})")
        numel = 1
        for dim in tensor.size:
            numel *= dim
        element = torch.empty(0, dtype=getattr(torch, dtype)).element_size()
        table.append(
            StoredTensor(name, dtype, numel, _data_offset(file, path, info) + tensor.offset * element, numel * element)
        )
    return table
