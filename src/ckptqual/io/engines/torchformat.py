"""The `torch.save` zip format, written record by record so a tensor never has to sit in memory whole.

The archive holds what torch 2.x writes: `data.pkl` (a protocol-2 pickle of a dict of tensors whose
storages are persistent ids), `.format_version`, `.storage_alignment`, `byteorder`, one `data/<key>` record
per tensor, `version` and `.data/serialization_id`; `torch.load` reads it as its own. Tensor data starts at
a multiple of 4 KiB in the file (torch.save aligns to 64 bytes; the format allows any alignment and names it
in `.storage_alignment`), so a 4 KiB drive sector holds bytes of one payload block only. The padding that aligns
it (the "FB" extra field of the tensor's local header) is keystream the writer gives, not zeros: every byte the
format leaves to the writer is payload that no data-reducing storage can shrink.
"""

from __future__ import annotations

import functools
import io
import pickle
import struct
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, SupportsIndex

import torch

from ckptqual.io.engines.zipheaders import (
    CENTRAL,
    CENTRAL_SIGNATURE,
    END,
    END_SIGNATURE,
    EXTRA_HEADER,
    LOCAL,
    LOCAL_SIGNATURE,
    PAD_EXTRA_ID,
    SATURATED,
    ZIP64_END,
    ZIP64_END_SIGNATURE,
    ZIP64_EXTRA_ID,
    ZIP64_LOCATOR,
    ZIP64_LOCATOR_SIGNATURE,
)
from ckptqual.plan.model import TensorSpec

ARCHIVE = "archive"
ALIGNMENT = 4096
FORMAT_VERSION = b"1"
FILE_VERSION = b"3\n"
BYTEORDER = b"little"
_ZIP64_EXTRA_BYTES = 20  # the zip64 field of a tensor's local header


class _StorageRef:
    """Stands for a tensor's storage in the pickle; becomes a persistent id."""

    def __init__(self, key: str, spec: TensorSpec) -> None:
        self.key = key
        self.spec = spec


class _TensorRef:
    """Pickles exactly as torch pickles a contiguous 1-D CPU tensor."""

    def __init__(self, storage: _StorageRef) -> None:
        self.storage = storage

    def __reduce_ex__(self, protocol: SupportsIndex) -> tuple:
        spec = self.storage.spec
        args: tuple[Any, ...] = (self.storage, 0, (spec.numel,), (1,), False, OrderedDict())
        if _typed_storage_name(spec.dtype) is None:
            return torch._utils._rebuild_tensor_v3, (*args, getattr(torch, spec.dtype))
        return torch._utils._rebuild_tensor_v2, args


def _typed_storage_name(dtype: str) -> str | None:
    return torch.storage._dtype_to_storage_type_map().get(getattr(torch, dtype))


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj: object) -> tuple | None:
        if not isinstance(obj, _StorageRef):
            return None
        name = _typed_storage_name(obj.spec.dtype)
        if name is None:
            return ("storage", torch.UntypedStorage, obj.key, "cpu", obj.spec.nbytes)
        return ("storage", getattr(torch, name), obj.key, "cpu", obj.spec.numel)


@functools.lru_cache(maxsize=1024)  # a rank writes the same files, with the same tensors, checkpoint after checkpoint
def state_pickle(tensors: tuple[TensorSpec, ...]) -> bytes:
    """The `data.pkl` record for a dict of tensors named as in `tensors`, storage keys "0", "1", ..."""
    state = {spec.name: _TensorRef(_StorageRef(str(i), spec)) for i, spec in enumerate(tensors)}
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=2).dump(state)
    return buffer.getvalue()


def head_records(tensors: tuple[TensorSpec, ...]) -> dict[str, bytes]:
    """The small records written before the tensor data, in file order, by name under `archive/`."""
    return {
        "data.pkl": state_pickle(tensors),
        ".format_version": FORMAT_VERSION,
        ".storage_alignment": str(ALIGNMENT).encode(),
        "byteorder": BYTEORDER,
    }


def tail_records(serialization_id: str) -> dict[str, bytes]:
    """The small records written after the tensor data, in file order, by name under `archive/`."""
    return {"version": FILE_VERSION, ".data/serialization_id": serialization_id.encode()}


def data_record(index: int) -> str:
    """The name under `archive/` of tensor `index`'s record (its storage key is its index)."""
    return f"data/{index}"


# The zip records, byte for byte as Python's zipfile writes them for the calls torch's format needs (writestr of a
# ZipInfo for small records; open(info, "w", force_zip64=True) with the size known for tensors); tests compare.
_ZIP64_LIMIT = (1 << 31) - 1  # zipfile's: past it, sizes and offsets move into zip64 fields
_COUNT_LIMIT = (1 << 16) - 1
_DOS_DATE = 1 << 5 | 1  # 1980-01-01, zipfile's default date; time 00:00:00
_MADE_ON_UNIX = 3 << 8  # the high byte of "version made by"
_EXTERNAL_ATTR = 0o600 << 16


@dataclass
class Entry:
    """One record of the archive: name under `archive/`, where its local header starts, its size and CRC."""

    name: str
    offset: int
    size: int
    crc: int = 0
    tensor: bool = False  # tensor records: zip64 local header, padded so that the data starts at ALIGNMENT
    padding: bytes = b""  # a tensor record's `pad` bytes of padding (keystream, from the writer)

    @property
    def encoded(self) -> bytes:
        return f"{ARCHIVE}/{self.name}".encode()

    @property
    def pad(self) -> int:
        if not self.tensor:
            return 0
        return -(self.offset + LOCAL.size + len(self.encoded) + EXTRA_HEADER.size + _ZIP64_EXTRA_BYTES) % ALIGNMENT

    def local_header(self) -> bytes:
        name = self.encoded
        if not self.tensor:
            fields = (20, 0, 0, 0, _DOS_DATE, self.crc, self.size, self.size, len(name), 0)
            return LOCAL.pack(LOCAL_SIGNATURE, *fields) + name
        if len(self.padding) != self.pad:
            raise ValueError(
                f"record {ARCHIVE}/{self.name}: {len(self.padding)} bytes of padding given, its data needs {self.pad} "
                f"to start at a multiple of {ALIGNMENT}; set Entry.padding to that many"
            )
        extra = EXTRA_HEADER.pack(PAD_EXTRA_ID, self.pad) + self.padding
        extra += struct.pack("<HHQQ", ZIP64_EXTRA_ID, 16, self.size, self.size)
        fields = (45, 0, 0, 0, _DOS_DATE, self.crc, SATURATED, SATURATED, len(name), len(extra))
        return LOCAL.pack(LOCAL_SIGNATURE, *fields) + name + extra

    @property
    def data_offset(self) -> int:
        return self.offset + len(self.local_header())

    def central_header(self) -> bytes:
        name, values = self.encoded, []
        size = self.size
        if size > _ZIP64_LIMIT:
            values += [size, size]
            size = SATURATED
        offset = self.offset
        if offset > _ZIP64_LIMIT:
            values.append(offset)
            offset = SATURATED
        extra = struct.pack(f"<HH{len(values)}Q", ZIP64_EXTRA_ID, 8 * len(values), *values) if values else b""
        version = 45 if values or self.tensor else 20
        fields = (version | _MADE_ON_UNIX, version, 0, 0, 0, _DOS_DATE, self.crc, size, size, len(name), len(extra))
        return CENTRAL.pack(CENTRAL_SIGNATURE, *fields, 0, 0, 0, _EXTERNAL_ATTR, offset) + name + extra


def central_directory(entries: list[Entry], start: int) -> bytes:
    """The central directory that starts at file offset `start`, and the end records after it."""
    directory = b"".join(entry.central_header() for entry in entries)
    count, size, end = len(entries), len(directory), start + len(directory)
    if count > _COUNT_LIMIT or start > _ZIP64_LIMIT or size > _ZIP64_LIMIT:
        directory += ZIP64_END.pack(ZIP64_END_SIGNATURE, 44, 45, 45, 0, 0, count, count, size, start)
        directory += ZIP64_LOCATOR.pack(ZIP64_LOCATOR_SIGNATURE, 0, end, 1)
        count, size, start = min(count, 0xFFFF), min(size, SATURATED), min(start, SATURATED)
    return directory + END.pack(END_SIGNATURE, 0, 0, count, count, size, start, 0)
