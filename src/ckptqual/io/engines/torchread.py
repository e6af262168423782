"""Reading and checking a torch.save archive without torch.load: zip structure, records, pickle and CRCs.

`check_archive` proves a file is what `torch.load` needs and what the plan says: the end records, every
central directory entry against its local header (and data descriptor), every byte of the file accounted
for, exactly the records the writer writes, the small records' bytes and CRCs, and a `data.pkl` that
unpickles (restricted: no tensors built, only the globals a tensor state dict uses) to exactly the plan's
tensors. It returns the tensor records so that the caller reads their data once, checking payload and CRC
in the same pass. A failure is a FormatError whose one line names the record and what is wrong.
"""

from __future__ import annotations

import io
import os
import pickle
import struct
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ckptqual.io.crc import crc32
from ckptqual.io.engines.base import IntegrityError, ReadBackError
from ckptqual.io.engines.torchformat import ARCHIVE, data_record
from ckptqual.plan.model import DTYPE_BYTES, TensorSpec

_LOCAL = struct.Struct("<4sHHHHHIIIHH")
_CENTRAL = struct.Struct("<4sHHHHHHIIIHHHHHII")
_END = struct.Struct("<4sHHHHIIH")
_ZIP64_END = struct.Struct("<4sQHHIIQQQQ")
_ZIP64_LOCATOR = struct.Struct("<4sIQI")
_DESCRIPTOR = struct.Struct("<4sIII")
_DESCRIPTOR64 = struct.Struct("<4sIQQ")
_LOCAL_SIGNATURE, _CENTRAL_SIGNATURE, _END_SIGNATURE = b"PK\x03\x04", b"PK\x01\x02", b"PK\x05\x06"
_ZIP64_END_SIGNATURE, _ZIP64_LOCATOR_SIGNATURE, _DESCRIPTOR_SIGNATURE = b"PK\x06\x06", b"PK\x06\x07", b"PK\x07\x08"
_ZIP64_EXTRA_ID = 0x0001
_SATURATED = 0xFFFFFFFF  # a 32-bit size or offset whose value is in the zip64 extra field
_MAX_CENTRAL_EXTRA_BYTES = 28  # a zip64 field with both sizes and the header offset
_ZIP64_END_BYTES = _ZIP64_END.size + _ZIP64_LOCATOR.size
_FLAG_ENCRYPTED, _FLAG_DESCRIPTOR = 0x1, 0x8
_STORED = 0
_STORAGE_DTYPES = {
    name: str(dtype).removeprefix("torch.") for dtype, name in torch.storage._dtype_to_storage_type_map().items()
}


class FormatError(ValueError):
    """The bytes are not the torch.save archive expected; the message names the record and the problem."""


class _NoEndRecord(FormatError):
    """No end-of-central-directory record where a writer puts it, the file's last 22 bytes."""


@dataclass(frozen=True)
class ExpectedArchive:
    """What one checkpoint file must hold: the plan's tensors, and the small records its writer puts beside them.

    `small_records` maps a record's name under `archive/` to its exact bytes, or to None where only its CRC can be
    checked (bytes that torch.save makes its own way, e.g. its pickle and serialization id).
    """

    writer: str
    tensors: tuple[TensorSpec, ...]
    small_records: dict[str, bytes | None]
    alignment: int

    def record_names(self) -> list[str]:
        """Every record's full name, small records first."""
        names = list(self.small_records) + [data_record(index) for index in range(len(self.tensors))]
        return [f"{ARCHIVE}/{name}" for name in names]

    def minimum_file_bytes(self) -> int:
        """A lower bound on the file's size: each record's headers, known bytes and central entry, the end record."""
        known = [len(data or b"") for data in self.small_records.values()] + [t.nbytes for t in self.tensors]
        names = [len(name.encode()) for name in self.record_names()]
        return sum(known) + sum(_LOCAL.size + _CENTRAL.size + 2 * n for n in names) + _END.size


@dataclass(frozen=True)
class Record:
    """One record as its central directory entry and local header place it; `end` includes its data descriptor."""

    name: str
    header_offset: int
    data_offset: int
    size: int
    crc: int
    end: int


@dataclass(frozen=True)
class TensorRecord:
    """A tensor of the plan and the record that holds its bytes."""

    index: int
    spec: TensorSpec
    record: Record


@dataclass(frozen=True)
class StoredTensor:
    """One tensor of an archive: its name, dtype, element count and the file bytes that hold it."""

    name: str
    dtype: str
    numel: int
    data_offset: int
    nbytes: int


@dataclass(frozen=True)
class _CentralEntry:
    name: str
    flags: int
    method: int
    crc: int
    compressed: int
    size: int
    header_offset: int


# ---- the file's bytes


class FileSource:
    """A file's bytes by offset: read whole into `buffer` in one request where it fits, else by offset
    (structures into small buffers, tensor chunks into `buffer`)."""

    def __init__(self, fd: int, label: str, buffer: np.ndarray) -> None:
        self._fd, self._label = fd, label
        self.size = os.fstat(fd).st_size
        self._whole = buffer[: self.size] if self.size <= buffer.nbytes else None
        self._buffer = buffer
        if self._whole is not None:
            pread_exactly(fd, self._whole, 0, label)

    def read(self, offset: int, length: int) -> bytes:
        if self._whole is not None:
            return self._whole[offset : offset + length].tobytes()
        data = np.empty(length, dtype=np.uint8)
        pread_exactly(self._fd, data, offset, self._label)
        return data.tobytes()

    def chunk(self, offset: int, length: int) -> np.ndarray:
        """`length` bytes from `offset`, a view of `buffer` (valid until the next chunk)."""
        if self._whole is not None:
            return self._whole[offset : offset + length]
        chunk = self._buffer[:length]
        pread_exactly(self._fd, chunk, offset, self._label)
        return chunk


def pread_exactly(fd: int, chunk: np.ndarray, file_offset: int, path: Path | str) -> None:
    """Fills `chunk` from `file_offset`; a failed read is a ReadBackError, an early end of file an IntegrityError."""
    done = 0
    view = memoryview(chunk)
    while done < chunk.nbytes:
        try:
            count = os.preadv(fd, [view[done:]], file_offset + done)
        except OSError as error:
            raise ReadBackError(
                error.errno, f"{path}: I/O error at file offset {file_offset + done}: {error.strerror}"
            ) from error
        if count == 0:
            raise IntegrityError(
                f"{path}: truncated: the file is {file_offset + done} bytes, "
                f"the plan needs at least {file_offset + chunk.nbytes}"
            )
        done += count


# ---- the archive against what its writer writes


def check_crc(record: Record, computed: int, detail: str = "") -> None:
    """Raises FormatError unless `computed`, the CRC32 of the record's bytes as read, is the stored one."""
    if computed != record.crc:
        raise FormatError(
            f"record {record.name}: CRC32 0x{computed:08x} does not match the stored 0x{record.crc:08x} "
            f"(the record's bytes changed{detail})"
        )


def check_archive(source: FileSource, expected: ExpectedArchive) -> list[TensorRecord]:
    """Checks everything but the tensor data; returns the tensor records in file order for the caller to read."""
    try:
        records = read_records(source)
    except _NoEndRecord as missing:
        raise _explain_missing_end(source, expected) from missing
    by_name = _by_name(records, expected)
    small = {
        name: _small_record(source, by_name[f"{ARCHIVE}/{name}"], wanted, expected.writer)
        for name, wanted in expected.small_records.items()
    }
    _check_table(_unpickle_table(small["data.pkl"]), expected.tensors)
    tensors = [
        TensorRecord(index, spec, by_name[f"{ARCHIVE}/{data_record(index)}"])
        for index, spec in enumerate(expected.tensors)
    ]
    for tensor in tensors:
        _check_tensor_record(tensor, expected.alignment)
    return sorted(tensors, key=lambda t: t.record.header_offset)


def _by_name(records: list[Record], expected: ExpectedArchive) -> dict[str, Record]:
    """The records by name, once they are exactly the set the writer writes."""
    by_name: dict[str, Record] = {}
    for record in records:
        if record.name in by_name:
            raise FormatError(f"record {record.name} appears twice")
        by_name[record.name] = record
    wanted = expected.record_names()
    missing = [name for name in wanted if name not in by_name]
    if missing:
        raise FormatError(f"record {missing[0]} is missing ({len(missing)} missing; {expected.writer} writes it)")
    extra = [name for name in by_name if name not in set(wanted)]
    if extra:
        raise FormatError(f"record {extra[0]} is not one {expected.writer} writes ({len(extra)} extra)")
    return by_name


def _small_record(source: FileSource, record: Record, wanted: bytes | None, writer: str) -> bytes:
    """A small record's bytes, once its CRC and, where they are known, the bytes check out (a change says both)."""
    data = source.read(record.data_offset, record.size)
    difference = "" if wanted is None or data == wanted else _difference(data, wanted, writer)
    check_crc(record, crc32(data), f": it {difference}" if difference else "")
    if difference:
        raise FormatError(f"record {record.name} {difference}")
    return data


def _difference(found: bytes, wanted: bytes, writer: str) -> str:
    """E.g. "holds b'lattle', the stream engine writes b'little'"."""
    if len(found) <= 64 and len(wanted) <= 64:
        return f"holds {found!r}, {writer} writes {wanted!r}"
    first = first_difference(found, wanted)
    return f"holds {len(found)} bytes that differ from the {len(wanted)} {writer} writes from byte {first}"


def first_difference(found: Sequence, wanted: Sequence) -> int:
    """The first index where the sequences differ (the shorter one's length where one is the other's start)."""
    return next(
        (i for i, (a, b) in enumerate(zip(found, wanted, strict=False)) if a != b), min(len(found), len(wanted))
    )


def _check_tensor_record(tensor: TensorRecord, alignment: int) -> None:
    record = tensor.record
    if record.size != tensor.spec.nbytes:
        raise FormatError(
            f"record {record.name} holds {record.size} bytes, tensor {tensor.spec.name!r} needs {tensor.spec.nbytes}"
        )
    if record.data_offset % alignment:
        raise FormatError(
            f"record {record.name}: data at file offset {record.data_offset}, not a multiple of {alignment}"
        )


# ---- the zip structure


def read_records(source: FileSource) -> list[Record]:
    """Every record of a stored (uncompressed) zip archive in file order, each central entry checked against its
    local header, and every byte of the file accounted for: records back to back from offset 0, then the
    central directory, then the end records."""
    directory_offset, directory_bytes, count = _central_directory_place(source)
    entries = _central_entries(source.read(directory_offset, directory_bytes), directory_offset, count)
    records = sorted((_record(source, entry, directory_offset) for entry in entries), key=lambda r: r.header_offset)
    position = 0
    for record in records:
        _check_follows(position, record.header_offset, f"record {record.name}")
        position = record.end
    _check_follows(position, directory_offset, "the central directory")
    return records


def _check_follows(position: int, start: int, what: str) -> None:
    if start < position:
        raise FormatError(f"{what} at offset {start} overlaps the bytes before it, which end at {position}")
    if start > position:
        raise FormatError(f"{start - position} unexplained bytes at offset {position}, before {what}")


def _central_directory_place(source: FileSource) -> tuple[int, int, int]:
    """Offset, size and entry count of the central directory, from the end record (and its zip64 twin)."""
    end_offset = source.size - _END.size
    if end_offset < 0 or source.read(end_offset, 4) != _END_SIGNATURE:
        raise _NoEndRecord(f"no end-of-central-directory record at offset {max(end_offset, 0)}")
    _, disk, directory_disk, disk_entries, entries, directory_bytes, directory_offset, comment = _END.unpack(
        source.read(end_offset, _END.size)
    )
    if disk or directory_disk or disk_entries != entries or comment:
        raise FormatError(
            f"end-of-central-directory record: disk {disk}, directory disk {directory_disk}, entries "
            f"{disk_entries}/{entries}, comment of {comment} bytes; torch writes one disk and no comment"
        )
    locator_offset = end_offset - _ZIP64_LOCATOR.size
    if locator_offset >= 0 and source.read(locator_offset, 4) == _ZIP64_LOCATOR_SIGNATURE:
        zip64 = _zip64_end(source, locator_offset)
        for what, short, full, limit in (
            ("entries", entries, zip64[2], 0xFFFF),
            ("directory size", directory_bytes, zip64[1], _SATURATED),
            ("directory offset", directory_offset, zip64[0], _SATURATED),
        ):
            if short not in (full, limit):
                raise FormatError(f"end-of-central-directory record: {what} {short}, the zip64 end record says {full}")
        directory_offset, directory_bytes, entries = zip64
        end_offset = locator_offset - _ZIP64_END.size
    _check_follows(directory_offset + directory_bytes, end_offset, "the end records")
    return directory_offset, directory_bytes, entries


def _zip64_end(source: FileSource, locator_offset: int) -> tuple[int, int, int]:
    """Offset, size and entry count of the central directory from the zip64 end record before the locator."""
    _, disk, offset, disks = _ZIP64_LOCATOR.unpack(source.read(locator_offset, _ZIP64_LOCATOR.size))
    if disk or disks != 1 or offset + _ZIP64_END.size != locator_offset:
        raise FormatError(
            f"zip64 end locator: record at offset {offset} on disk {disk} of {disks}; "
            f"it must end where the locator begins, at {locator_offset}, on disk 0 of 1"
        )
    fields = _ZIP64_END.unpack(source.read(offset, _ZIP64_END.size))
    signature, size, _, _, disk, directory_disk, disk_entries, entries, directory_bytes, directory_offset = fields
    if signature != _ZIP64_END_SIGNATURE or size != _ZIP64_END.size - 12 or disk or directory_disk:
        raise FormatError(f"zip64 end record at offset {offset} is damaged (signature {signature!r}, size {size})")
    if disk_entries != entries:
        raise FormatError(f"zip64 end record: {disk_entries} entries on this disk, {entries} in all")
    return directory_offset, directory_bytes, entries


def _central_entries(table: bytes, directory_offset: int, count: int) -> list[_CentralEntry]:
    entries = []
    position = 0
    for index in range(count):
        if position + _CENTRAL.size > len(table):
            raise FormatError(f"central directory ends after {index} of its {count} entries")
        fields = _CENTRAL.unpack_from(table, position)
        if fields[0] != _CENTRAL_SIGNATURE:
            raise FormatError(f"central directory entry {index} at offset {directory_offset + position} is damaged")
        flags, method, _, _, crc, compressed, size, name_bytes, extra_bytes, comment_bytes, disk = fields[3:14]
        start = position + _CENTRAL.size
        name = table[start : start + name_bytes].decode("utf-8", "replace")
        extra = table[start + name_bytes : start + name_bytes + extra_bytes]
        size, compressed, header_offset = _zip64_values(extra, size, compressed, fields[16], what=f"record {name}")
        if disk:
            raise FormatError(f"record {name}: central directory entry places it on disk {disk}; torch writes one disk")
        entries.append(_CentralEntry(name, flags, method, crc, compressed, size, header_offset))
        position = start + name_bytes + extra_bytes + comment_bytes
    if position != len(table):
        raise FormatError(f"central directory holds {len(table) - position} bytes after its {count} entries")
    return entries


def _zip64_values(extra: bytes, *values: int, what: str) -> tuple[int, ...]:
    """`values` (size, compressed size[, header offset]) with each one saturated at 0xFFFFFFFF taken from the
    zip64 extra field, in that order."""
    wanted = [value == _SATURATED for value in values]
    if not any(wanted):
        return values
    field = _extra_field(extra, _ZIP64_EXTRA_ID)
    if field is None or len(field) < 8 * sum(wanted):
        raise FormatError(f"{what}: a size or offset is 0xFFFFFFFF but no zip64 field holds the value")
    full = iter(struct.unpack_from(f"<{sum(wanted)}Q", field))
    return tuple(next(full) if saturated else value for value, saturated in zip(values, wanted, strict=True))


def _extra_field(extra: bytes, field_id: int) -> bytes | None:
    position = 0
    while position + 4 <= len(extra):
        kind, length = struct.unpack_from("<HH", extra, position)
        if kind == field_id:
            return extra[position + 4 : position + 4 + length]
        position += 4 + length
    return None


def _record(source: FileSource, entry: _CentralEntry, limit: int) -> Record:
    """The record a central entry describes, its local header (and data descriptor) checked against the entry."""
    what = f"record {entry.name}"
    _check_stored(entry, what)
    header = _within(source, entry.header_offset, _LOCAL.size, limit, f"{what}: local header")
    signature, _, flags, method, _, _, crc, compressed, size, name_bytes, extra_bytes = _LOCAL.unpack(header)
    if signature != _LOCAL_SIGNATURE:
        raise FormatError(f"{what}: no local header at offset {entry.header_offset}, where the central directory says")
    names = _within(source, entry.header_offset + _LOCAL.size, name_bytes + extra_bytes, limit, f"{what}: local header")
    if names[:name_bytes].decode("utf-8", "replace") != entry.name or (flags, method) != (entry.flags, entry.method):
        raise FormatError(
            f"{what}: local header (name {names[:name_bytes]!r}, flags 0x{flags:x}, method {method}) differs from "
            f"its central directory entry (flags 0x{entry.flags:x}, method {entry.method})"
        )
    data_offset = entry.header_offset + _LOCAL.size + name_bytes + extra_bytes
    end = data_offset + entry.size
    if end > limit:
        raise FormatError(
            f"{what}: its {entry.size} bytes from offset {data_offset} run past offset {limit}, "
            f"where the central directory begins"
        )
    extra = names[name_bytes:]
    if flags & _FLAG_DESCRIPTOR:
        if (crc, compressed, size) != (0, 0, 0):
            raise FormatError(
                f"{what}: local header holds CRC32 0x{crc:08x} and sizes {compressed}/{size} where 0 belongs "
                f"(its data descriptor carries them)"
            )
        end += _check_descriptor(source, entry, end, limit, _extra_field(extra, _ZIP64_EXTRA_ID) is not None)
    else:
        if crc != entry.crc:
            raise FormatError(
                f"{what}: local header CRC32 0x{crc:08x} differs from the central directory's 0x{entry.crc:08x}"
            )
        local_sizes = _zip64_values(extra, size, compressed, what=f"{what}: local header")
        if local_sizes != (entry.size, entry.size):
            raise FormatError(f"{what}: local header says {local_sizes[0]} bytes, the central directory {entry.size}")
    return Record(entry.name, entry.header_offset, data_offset, entry.size, entry.crc, end)


def _check_stored(entry: _CentralEntry, what: str) -> None:
    """torch.load reads only records stored as they are: not compressed, not encrypted."""
    if entry.method != _STORED:
        raise FormatError(f"{what} is compressed (method {entry.method}); torch.load reads only stored records")
    if entry.flags & _FLAG_ENCRYPTED:
        raise FormatError(f"{what} is encrypted; torch.load cannot read it")
    if entry.compressed != entry.size:
        raise FormatError(f"{what}: stored size {entry.compressed} differs from its size {entry.size}")


def _check_descriptor(source: FileSource, entry: _CentralEntry, offset: int, limit: int, zip64: bool) -> int:
    """Checks the data descriptor after a record's data against its central entry; returns its size."""
    layout = _DESCRIPTOR64 if zip64 else _DESCRIPTOR
    what = f"record {entry.name}: data descriptor"
    signature, crc, compressed, size = layout.unpack(_within(source, offset, layout.size, limit, what))
    if signature != _DESCRIPTOR_SIGNATURE:
        raise FormatError(f"{what} at offset {offset} is damaged (signature {signature!r})")
    if crc != entry.crc:
        raise FormatError(f"{what}: CRC32 0x{crc:08x} differs from the central directory's 0x{entry.crc:08x}")
    if (compressed, size) != (entry.size, entry.size):
        raise FormatError(f"{what}: says {size} bytes, the central directory {entry.size}")
    return layout.size


def _within(source: FileSource, offset: int, length: int, limit: int, what: str) -> bytes:
    """`length` bytes at `offset`, which must end by `limit` (where the central directory begins)."""
    if offset < 0 or offset + length > limit:
        raise FormatError(f"{what} at offset {offset} runs past offset {limit}, where the central directory begins")
    return source.read(offset, length)


# ---- a file without its end record


def _explain_missing_end(source: FileSource, expected: ExpectedArchive) -> FormatError:
    """Why a file has no end record where it belongs: truncated (and how much it needs at least), bytes appended,
    or its end overwritten."""
    names = expected.record_names()
    start = _first_central_entry(source, names)
    end, needed = _walk_central_directory(source, start, names) if start is not None else (None, 0)
    needed = max(needed, expected.minimum_file_bytes())
    if source.size < needed:
        return FormatError(f"truncated: the file is {source.size} bytes, the plan needs at least {needed}")
    if end is None:
        return FormatError(
            f"no end-of-central-directory record at offset {source.size - _END.size} and no central directory "
            f"before it: the file's end was overwritten, or it is cut inside its last record"
        )
    if source.read(end, 4) == _END_SIGNATURE:
        return FormatError(
            f"{source.size - end - _END.size} bytes follow the end-of-central-directory record at offset {end}"
        )
    return FormatError(f"no end-of-central-directory record at offset {end}, after the central directory")


def _walk_central_directory(source: FileSource, position: int, names: list[str]) -> tuple[int, int]:
    """Where the end record belongs after the central directory that starts at `position`, and the file size that
    needs at least: a cut entry and every later one need their fixed part and name, the end record its 22 bytes."""
    unseen = {name.encode(): _CENTRAL.size + len(name.encode()) for name in names}
    for _ in names:
        if position + _CENTRAL.size > source.size:
            return position, position + sum(unseen.values()) + _END.size
        name_bytes, extra_bytes, comment_bytes = struct.unpack_from("<HHH", source.read(position + 28, 6))
        length = _CENTRAL.size + name_bytes + extra_bytes + comment_bytes
        if position + length > source.size:  # this entry is one of the unseen: count it at its full length
            return position, position + length + sum(unseen.values()) - max(unseen.values(), default=0) + _END.size
        unseen.pop(source.read(position + _CENTRAL.size, name_bytes), None)
        position += length
    if source.size - position >= 4 and source.read(position, 4) == _ZIP64_END_SIGNATURE:
        position += _ZIP64_END_BYTES
    return position, position + _END.size


def _first_central_entry(source: FileSource, names: list[str]) -> int | None:
    """Where the central directory starts, if the file's last bytes (as many as a whole directory and the end records
    could take) hold its first entry: a central signature followed by a record's name."""
    window = min(
        source.size,
        sum(_CENTRAL.size + len(n) + _MAX_CENTRAL_EXTRA_BYTES for n in names) + _ZIP64_END_BYTES + _END.size,
    )
    tail = source.read(source.size - window, window)
    wanted = tuple(name.encode() for name in names)
    start = tail.find(_CENTRAL_SIGNATURE)
    while start >= 0 and not tail[start + _CENTRAL.size :].startswith(wanted):
        start = tail.find(_CENTRAL_SIGNATURE, start + 1)
    return None if start < 0 else source.size - window + start


# ---- data.pkl


@dataclass(frozen=True)
class _Global:
    name: str


@dataclass(frozen=True)
class _PickledTensor:
    """A tensor as data.pkl describes it: its storage's persistent id, then how the tensor views the storage."""

    storage: tuple
    offset: int
    size: tuple
    stride: tuple
    dtype: str | None
    name: str = ""

    @property
    def key(self) -> str:
        return self.storage[2]

    @property
    def untyped(self) -> bool:
        return self.storage[1].name == "UntypedStorage"

    @property
    def storage_dtype(self) -> str | None:
        """The dtype named by `_rebuild_tensor_v3`, else by the typed storage."""
        return self.dtype or _STORAGE_DTYPES.get(self.storage[1].name)


def _rebuild(storage: tuple, offset: int, size: tuple, stride: tuple, *rest: Any) -> _PickledTensor:
    dtype = rest[-1].name if rest and isinstance(rest[-1], _Global) else None
    return _PickledTensor(storage, offset, tuple(size), tuple(stride), dtype)


class _TableUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("collections", "OrderedDict"):
            return OrderedDict
        if module == "torch._utils" and name in ("_rebuild_tensor_v2", "_rebuild_tensor_v3"):
            return _rebuild
        if module in ("torch", "torch.storage"):
            return _Global(name)
        raise pickle.UnpicklingError(f"unexpected global {module}.{name}")

    def persistent_load(self, pid: Any) -> tuple:
        return tuple(pid)


def _unpickle_table(data: bytes) -> list[_PickledTensor]:
    """The tensors data.pkl describes, in its order, each named."""
    what = f"record {ARCHIVE}/data.pkl"
    try:
        state = _TableUnpickler(io.BytesIO(data)).load()
    except Exception as error:  # a damaged pickle fails in many ways; each is this one finding
        raise FormatError(f"{what} does not unpickle: {type(error).__name__}: {error}") from error
    if not isinstance(state, dict):
        raise FormatError(f"{what} holds a {type(state).__name__}, not a dict of tensors")
    table = []
    for name, tensor in state.items():
        if (
            not isinstance(tensor, _PickledTensor)
            or len(tensor.storage) != 5
            or not isinstance(tensor.storage[1], _Global)
        ):
            raise FormatError(f"{what}: entry {name!r} is not a tensor with a stored storage")
        if tensor.storage[0] != "storage":
            raise FormatError(
                f"{what}: entry {name!r} has a persistent id of kind {tensor.storage[0]!r}, not 'storage'"
            )
        table.append(replace(tensor, name=str(name)))
    return table


def _check_table(table: list[_PickledTensor], tensors: tuple[TensorSpec, ...]) -> None:
    """data.pkl must describe exactly the plan's tensors, each alone in its storage, contiguous, from offset 0."""
    what = f"record {ARCHIVE}/data.pkl"
    found, wanted = [t.name for t in table], [t.name for t in tensors]
    if found != wanted:
        first = first_difference(found, wanted)
        shown = repr(found[first]) if first < len(found) else "nothing"
        planned = repr(wanted[first]) if first < len(wanted) else "nothing"
        raise FormatError(f"{what} names {len(found)} tensors, tensor {first} is {shown}; the plan has {planned} there")
    for index, (pickled, spec) in enumerate(zip(table, tensors, strict=True)):
        _, _, key, location, storage_count = pickled.storage
        for field, value, needed in (
            ("dtype", pickled.storage_dtype, spec.dtype),
            ("storage key", key, str(index)),
            ("location", location, "cpu"),
            ("storage size", storage_count, spec.nbytes if pickled.untyped else spec.numel),
            ("storage offset", pickled.offset, 0),
            ("size", pickled.size, (spec.numel,)),
            ("stride", pickled.stride, (1,)),
        ):
            if value != needed:
                raise FormatError(f"{what}: tensor {spec.name!r} has {field} {value!r}, the plan needs {needed!r}")


# ---- the tensor table of any archive


def read_table(path: Path) -> list[StoredTensor]:
    """The tensors of a torch.save archive in pickle order, with the file offset of each one's bytes."""
    fd = os.open(path, os.O_RDONLY)
    try:
        source = FileSource(fd, str(path), np.empty(0, dtype=np.uint8))
        records = {record.name: record for record in read_records(source)}
        pickled = records.get(f"{ARCHIVE}/data.pkl")
        if pickled is None:
            raise FormatError(f"record {ARCHIVE}/data.pkl is missing")
        table = _unpickle_table(source.read(pickled.data_offset, pickled.size))
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
