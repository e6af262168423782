"""The bytes `torch.save(tensor)` writes for one contiguous 1-D CPU tensor, laid out without the tensor in memory.

torch's zip writer (miniz, as torch drives it) writes each record as a local header with sizes and CRC left zero
(general-purpose flag bit 3), the name, a "FB" extra field of b"Z" padding that starts the data at a multiple of
64 bytes, the data, then a data descriptor; then the central directory, and always the zip64 end records. Only the
data descriptor of the tensor, its central entry and the `.data/serialization_id` depend on the tensor's bytes
(through their CRC-32), so the archive is `head` + data + `tail(crc)`. DCP stores each tensor of a `.distcp` file
this way (FileSystemWriter calls torch.save per tensor). tests/test_dcp.py holds these bytes to torch.save's.
"""

from __future__ import annotations

import functools
import io
import struct
from dataclasses import dataclass

import torch

from ckptqual.io.crc import crc32
from ckptqual.io.engines.torchformat import _Pickler, _StorageRef, _TensorRef
from ckptqual.plan.model import TensorSpec

ALIGNMENT = 64  # torch.save's storage alignment
_LIMIT = 0xFFFFFFFF  # at or past it, a size or offset moves into a zip64 extra field
_FLAGS = 0x0808  # data descriptor follows; names are UTF-8
_EMPTY_FLAGS = 0x0800  # an empty record: no data descriptor
_NAMES = ("data.pkl", ".format_version", ".storage_alignment", "byteorder", "data/0", "version")
_SERIAL = ".data/serialization_id"
_MASK = (1 << 64) - 1


def _hash_combine(seed: int, value: int) -> int:
    """c10::hash_combine on 64-bit size_t, with which torch folds the records' CRCs into the serialization id."""
    return (seed ^ ((value + 0x9E3779B9 + ((seed << 6) & _MASK) + (seed >> 2)) & _MASK)) & _MASK


@functools.cache
def _names_hash() -> str:
    """The serialization id's first 20 digits: a hash of the record names only (the same for every 1-D tensor),
    taken once from torch.save itself."""
    buffer = io.BytesIO()
    torch.save(torch.zeros(1, dtype=torch.uint8), buffer)
    data = buffer.getvalue()
    name = b"archive/" + _SERIAL.encode()
    start = data.index(name) + len(name)
    (extra,) = struct.unpack_from("<H", data, start - len(name) - 2)
    return data[start + extra : start + extra + 20].decode()


def tensor_pickle(spec: TensorSpec) -> bytes:
    """`data.pkl` of torch.save(tensor): the tensor itself, its storage the persistent id "0"."""
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=2).dump(_TensorRef(_StorageRef("0", spec)))
    return buffer.getvalue()


def _zip64_extra(size: int | None, offset: int | None, compressed: int | None = None) -> bytes:
    """A zip64 extra field: sizes (the compressed one: `compressed`, else `size`) and offset, those given."""
    sizes = [size, size if compressed is None else compressed] if size is not None else []
    values = sizes + ([offset] if offset is not None else [])
    return struct.pack(f"<HH{len(values)}Q", 1, 8 * len(values), *values) if values else b""


@dataclass(frozen=True)
class _Record:
    name: str
    offset: int  # of the local header, from the archive's start
    size: int
    zip64: bytes  # the local header's zip64 extra field, if any

    @property
    def large(self) -> bool:
        return bool(self.zip64)


class TensorArchive:
    """torch.save's archive of one 1-D tensor of `spec`: `head` (before the data), `data_offset`, and `tail(crc)`."""

    def __init__(self, spec: TensorSpec) -> None:
        self.spec = spec
        small = {
            "data.pkl": tensor_pickle(spec),
            ".format_version": b"1",
            ".storage_alignment": str(ALIGNMENT).encode(),
            "byteorder": b"little",
            "version": b"3\n",
        }
        self._small = small
        head = bytearray()
        self._records: list[_Record] = []
        for name in _NAMES[:4]:
            head += self._local(name, len(head), len(small[name]))
            head += small[name] + self._descriptor(self._records[-1], _crc(small[name]))
        head += self._local("data/0", len(head), spec.nbytes)
        self.head = bytes(head)
        self.data_offset = len(head)

    @property
    def nbytes(self) -> int:
        """The whole archive's length."""
        return self.data_offset + self.spec.nbytes + len(self.tail(0))

    def _local(self, name: str, offset: int, size: int) -> bytes:
        encoded = f"archive/{name}".encode()
        # the local header's compressed size is 0: the data descriptor after the data gives it (as miniz writes it)
        zip64 = _zip64_extra(size if size >= _LIMIT else None, offset if offset >= _LIMIT else None, compressed=0)
        start = offset + 30 + len(encoded) + 4 + len(zip64)
        pad = -start % ALIGNMENT
        extra = zip64 + struct.pack("<2sH", b"FB", pad) + b"Z" * pad
        self._records.append(_Record(name, offset, size, zip64))
        flags = _FLAGS if size else _EMPTY_FLAGS
        header = struct.pack("<IHHHHHIIIHH", 0x04034B50, 0, flags, 0, 0, 0, 0, 0, 0, len(encoded), len(extra))
        return header + encoded + extra

    @staticmethod
    def _descriptor(record: _Record, crc: int) -> bytes:
        if record.size == 0:
            return b""
        if record.large:
            return struct.pack("<IIQQ", 0x08074B50, crc, record.size, record.size)
        return struct.pack("<IIII", 0x08074B50, crc, record.size, record.size)

    def tail(self, crc: int) -> bytes:
        """Everything after the tensor's data, given the CRC-32 of its bytes."""
        records = self._records[:5]
        crcs = {name: _crc(data) for name, data in self._small.items()} | {"data/0": crc}
        tail = bytearray(self._descriptor(records[4], crc))
        position = self.data_offset + self.spec.nbytes + len(tail)
        for name in _NAMES[5:]:
            tail += self._local(name, position, len(self._small[name]))
            tail += self._small[name] + self._descriptor(self._records[-1], crcs[name])
            position = self.data_offset + self.spec.nbytes + len(tail)
        combined = 0
        for name in _NAMES:
            if name != "data/0" or self.spec.nbytes:  # torch leaves an empty tensor's record out of the id
                combined = _hash_combine(combined, crcs[name])
        serial = f"{_names_hash()}{combined:020d}".encode()
        tail += self._local(_SERIAL, position, len(serial))
        tail += serial + self._descriptor(self._records[-1], _crc(serial))
        crcs[_SERIAL] = _crc(serial)
        records = self._records[:5] + self._records[-2:]
        del self._records[5:]  # tail() may be called again: its records are rebuilt each time
        directory_offset = self.data_offset + self.spec.nbytes + len(tail)
        directory = b"".join(self._central(record, crcs[record.name]) for record in records)
        tail += directory
        end = directory_offset + len(directory)
        count = len(records)
        zip64_end = (0x06064B50, 44, 0x031E, 45, 0, 0, count, count, len(directory), directory_offset)
        tail += struct.pack("<IQHHIIQQQQ", *zip64_end)
        tail += struct.pack("<IIQI", 0x07064B50, 0, end, 1)
        tail += struct.pack(
            "<IHHHHIIH", 0x06054B50, 0, 0, count, count, min(len(directory), _LIMIT), min(directory_offset, _LIMIT), 0
        )
        return bytes(tail)

    @staticmethod
    def _central(record: _Record, crc: int) -> bytes:
        encoded = f"archive/{record.name}".encode()
        big, far = record.size >= _LIMIT, record.offset >= _LIMIT
        extra = _zip64_extra(record.size if big else None, record.offset if far else None) if record.large else b""
        size, offset = min(record.size, _LIMIT), min(record.offset, _LIMIT)
        flags = _FLAGS if record.size else _EMPTY_FLAGS
        fields = (0x02014B50, 0, 0, flags, 0, 0, 0, crc, size, size, len(encoded), len(extra), 0, 0, 0, 0, offset)
        return struct.pack("<IHHHHHHIIIHHHHHII", *fields) + encoded + extra


def _crc(data: bytes) -> int:
    return crc32(data)


@functools.lru_cache(maxsize=4096)
def archive_of(spec: TensorSpec) -> TensorArchive:
    """The archive layout of `spec` (a rank writes the same tensors checkpoint after checkpoint)."""
    return TensorArchive(spec)
